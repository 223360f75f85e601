"""JEV-VL's prompt layout: every question is its own raw prompt (contract.py), tokenised whole in one pass
without special tokens. The question's kind comes before the state, so the questions of a request are
prepared in groups of one kind (`prefix_groups`): in a group every row shares `[kind] K\\n[state] STATE`
(images included), which is the prefix L3 keeps; the rows are what follows the state."""

from __future__ import annotations

import os.path
from dataclasses import dataclass

from jev_common.control_tokens import ControlTokens
from jev_common.errors import TooManyOptions, UnreadableInput

from ...prompt.builder import PreparedRequest, ids_key, split_prefix
from ...protocols import PromptBuilder
from .contract import head_text, options_message, single_token_labels, too_long_message


@dataclass(frozen=True)
class JevRow:
    """One question's prompt after the state (contract.tail_text), its kind, and the token ids read."""

    kind: str
    content: str
    labels: tuple[int, ...]


class JevVlBuilder(PromptBuilder):
    """Upstream's raw prompt (no chat template). `labels` are serve_decide's single-token option labels;
    a prompt over `max_length` tokens (image tokens included) is refused as the native worker refuses it."""

    def __init__(self, tokenizer, recipe, identity: str, *, max_length: int):
        super().__init__(
            tokenizer,
            recipe,
            identity,
            controls=ControlTokens.of(
                tokenizer,
                hint="JEV-VL's prompt is plain text: the tokenizer would read it as that control token, "
                "which no text means; remove it from the request",
            ),
        )
        labels = single_token_labels(tokenizer)
        self.labels = [label for label, _ in labels]
        self.label_ids = [token for _, token in labels]
        self.max_length = max_length

    def coded(self, n: int) -> tuple[list[str], tuple[int, ...]]:
        """The labels of `n` choice options and their token ids (upstream's count refusal beyond them)."""
        if not 2 <= n <= len(self.labels):
            raise TooManyOptions(options_message(n, len(self.labels)))
        return self.labels[:n], tuple(self.label_ids[:n])

    def prefix_groups(self, questions: dict) -> list[dict]:
        groups: dict[str, dict] = {}
        for qid, question in questions.items():
            groups.setdefault(question.type, {})[qid] = question
        return list(groups.values()) or [questions]

    def prepare(
        self, state_text: str, rows: list[JevRow], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        heads = [head_text(row.kind, state_text) for row in rows]
        if image_keys and len(set(heads)) > 1:
            raise ValueError("JEV-VL rows of different kinds share no image prefix (prepare each kind alone)")
        texts = [head + row.content for head, row in zip(heads, rows)]
        prefix, row_ids, mismatch = split_prefix(
            self.tokenizer, texts, len(os.path.commonprefix(heads)), add_special_tokens=False
        )
        longest = len(prefix) + max(len(ids) for ids in row_ids)
        if longest > self.max_length:
            raise UnreadableInput(too_long_message(self.max_length, longest))
        return PreparedRequest(
            prefix_ids=prefix,
            rows=row_ids,
            row_labels=tuple(row.labels for row in rows),
            image_keys=tuple(image_keys),
            plan=plan,
            boundary_mismatch=mismatch,
            prefix_key=ids_key(f"{self.identity}|jev-vl|{','.join(image_keys)}|", prefix),
        )
