"""A model's control tokens, which user text may not carry: every prompt builder refuses them the same way.

A tokenizer matches its special and added special tokens inside plain text, so a state or question that
holds one would put the model's own control token into the prompt (a turn boundary, an image pad, a
marker). Each prompt builder keeps one ControlTokens and checks every piece of user text against it
(422 `unreadable_input`, naming the token and where it was found).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from jev_common.errors import UnreadableInput


def special_tokens(tokenizer: Any) -> set[str]:
    """The tokenizer's special tokens and its added tokens marked special (the texts it never splits)."""
    tokens = {t for t in getattr(tokenizer, "all_special_tokens", []) if t}
    tokens |= {
        t.content
        for t in getattr(tokenizer, "added_tokens_decoder", {}).values()
        if getattr(t, "special", False) and t.content
    }
    return tokens


class ControlTokens:
    """`check(text, where)` refuses text holding any of `tokens` (the leftmost, longest one is named)."""

    def __init__(self, tokens: Iterable[str], *, what: str = "model", hint: str = "remove it from the request") -> None:
        self.tokens = tuple(sorted({t for t in tokens if t}, key=len, reverse=True))
        self._pattern = re.compile("|".join(map(re.escape, self.tokens))) if self.tokens else None
        self.what = what
        self.hint = hint

    @classmethod
    def of(cls, tokenizer: Any, *, extra: Iterable[str] = (), **kwargs: str) -> ControlTokens:
        """The tokenizer's special tokens (special_tokens) and `extra` ones."""
        return cls(special_tokens(tokenizer) | set(extra), **kwargs)

    def check(self, text: str, where: str) -> None:
        match = self._pattern.search(text) if self._pattern is not None else None
        if match:
            raise UnreadableInput(
                f"{where} contains {match.group(0)!r}, a control token of this {self.what}; {self.hint}"
            )
