"""Vela 2.0 decoder prompt layout (0.8B, and the 4B / 9B of the same release): the state prefix, then
one isolated block per question, as the packages render it.

Sources (reference only): the Vela 2.0 blog and architecture notes (vllm-project/semantic-router,
`website/blog`, `architecture/README.md`, revisions 0.8B f21e7359e267f7e34af02502d3bc79eb7c8244c4) and
vLLM-SR's runtime reimplementation of the packages' engine (`vela2_inference.py`: its decoder layout,
request reader and word units). Every piece is tokenised on its own (no special tokens) and the ids are
concatenated, as the packages do:

    prefix = "Context:\\n" + ('<segment role="R">\\n' + PART + "\\n</segment>\\n") per part
    block  = "\\n\\nTask type: T\\nTarget: R[, R...]\\nQuestion:\\nQ\\nOptions:"
             + ("\\n<option>\\n" + {"description":D,"key":K} + "\\n</option>") per option (+ the abstain option)
             + SUFFIX[T]
    span   = "...Question:\\nQ\\nLabels:" + one "<label>" block per label
             + "\\n\\nText:\\n" + '<segment role="user">\\n' + STATE + "\\n</segment>\\n" + SUFFIX["span"]

A block sees the prefix and itself only (its positions continue after the prefix); its target is every
part (the packages' default without `over`), their roles joined by ", ". The candidate head reads each
option's last token against the block's last token; the span head reads each label block's mean and each
word's first token in the repeated target.

The state as the packages read it (state_parts, both members): a string is the `user` part (a string holding
a JSON object is that object); an object maps request / user / prompt to `user`, answer / response to
`answer`, every other key to `context` (a part fed by several keys, or by a key of no known role, is
`key:\\n<value>` blocks joined by a blank line); an array is canonical JSON in the `user` part. Parts come in
user / context / answer order.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass

from jev_common.errors import UnreadableInput

SUFFIX = {
    "choice": "\n\nSelect the single option best supported by the context and instructions.\nDecision:",
    "score": "\n\nSelect the single option best supported by the context and instructions.\nDecision:",
    "set": "\n\nSelect every option supported by the context and instructions.\nDecision:",
    "span": "\n\nMark every span of the target text that carries one of the labels.\nSpans:",
}
ABSTAIN = ("[ABS]", "None of the shown options applies.")
PARTS_HEAD = "Context:\n"
SEGMENT_CLOSE = "\n</segment>\n"
TEXT_HEAD = "\n\nText:\n"
ROLES = ("user", "context", "answer")
STATE_KEY_ROLES = {
    "request": "user",
    "user": "user",
    "prompt": "user",
    "source": "context",
    "context": "context",
    "document": "context",
    "tools": "context",
    "previous_answer": "context",
    "answer": "answer",
    "response": "answer",
}
SPAN_ROLE = "user"  # span questions read a plain text state: its one part
REPEAT_LIMIT = 2048  # targets longer than this are read in windows upstream (not served here)

# The packages' word units: URLs, e-mail addresses and @handles whole, CJK characters one by one,
# word characters joined by - or _, any other non-space character alone.
_CJK = (
    "\u2e80-\u2fff\u3000-\u303f\u3040-\u30ff\u3100-\u31ff\u3400-\u4dbf\u4e00-\u9fff"
    "\ua000-\ua4cf\uac00-\ud7af\u8c48-\ufaff\ufe30-\ufe4f\uff00-\uffef"
)
_TRAIL = ".,;:!?)\\]}>\"'\u201d\u2019\u00bb"
WORD = re.compile(
    rf"(?:https?://|www\.)[^\s{_CJK}]+?(?=[{_TRAIL}]*(?![^\s{_CJK}]))"
    rf"|[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{{2,}}"
    rf"|@[a-z0-9_]+"
    rf"|[{_CJK}]"
    rf"|[^\W{_CJK}]+(?:[-_][^\W{_CJK}]+)*"
    rf"|\S",
    re.IGNORECASE,
)


def canonical(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def content_text(value) -> str:
    return value if isinstance(value, str) else canonical(value)


def option_block(key: str, description: str, tag: str = "option") -> str:
    return f"\n<{tag}>\n" + canonical({"key": key, "description": description}) + f"\n</{tag}>"


def question_head(kind: str, roles: tuple[str, ...], text: str, span: bool = False) -> str:
    return f"\n\nTask type: {kind}\nTarget: {', '.join(roles)}\nQuestion:\n{text}\n" + (
        "Labels:" if span else "Options:"
    )


def segment_open(role: str) -> str:
    return f'<segment role="{role}">\n'


def state_parts(state) -> list[tuple[str, str]]:
    """(role, text) of every part of the state, in user / context / answer order."""
    if isinstance(state, str) and state.strip().startswith("{"):
        try:
            decoded = json.loads(state.strip())
        except ValueError:
            decoded = None
        if isinstance(decoded, dict):
            state = decoded
    if isinstance(state, str):
        if not state.strip():
            raise UnreadableInput("state: Vela 2.0 reads no empty or blank state")
        return [("user", state)]
    if isinstance(state, list):
        return [("user", canonical(state))]
    if not state:
        raise UnreadableInput("state: Vela 2.0 reads no empty object")
    by_role: dict[str, list[tuple[str, str, bool]]] = defaultdict(list)
    for key, value in state.items():
        role = STATE_KEY_ROLES.get(str(key).lower())
        by_role[role or "context"].append((str(key), content_text(value), role is not None))
    parts = []
    for role in ROLES:
        items = by_role.get(role)
        if not items:
            continue
        if len(items) == 1 and items[0][2]:
            text = items[0][1]
        else:
            text = "\n\n".join(f"{key}:\n{value}" for key, value, _ in items)
        if not text.strip():
            raise UnreadableInput(f"state: the {role} part (keys {', '.join(k for k, _, _ in items)}) is blank")
        parts.append((role, text))
    return parts


def span_text(state, where: str) -> str:
    """The text a span question reads: a plain text state (its character offsets are the answer)."""
    if state_parts(state) != [(SPAN_ROLE, state)]:
        raise UnreadableInput(
            f"{where}: span questions are served over a plain text state; Vela 2.0 reads this state as named parts"
        )
    return state


@dataclass(frozen=True)
class Words:
    """Word units of a text: [start, end) character offsets and each word's first overlapping token."""

    offsets: tuple[tuple[int, int], ...]
    first: tuple[int, ...]


def words_of(text: str, token_offsets: list[tuple[int, int]]) -> Words:
    """Every word unit of `text` with the first non-empty token whose running end passes the word's start
    (words no token starts inside are dropped), as the packages map words to sub-word tokens."""
    offsets, first = [], []
    reach, token = -1, 0
    ends = []
    for start, end in token_offsets:
        reach = max(reach, end if end > start else -1)
        ends.append(reach)
    for match in WORD.finditer(text):
        start, end = match.span()
        while token < len(token_offsets) and ends[token] <= start:
            token += 1
        index = token
        while index < len(token_offsets) and token_offsets[index][1] <= token_offsets[index][0]:
            index += 1
        if index < len(token_offsets) and token_offsets[index][0] < end:
            offsets.append((start, end))
            first.append(index)
    return Words(tuple(offsets), tuple(first))


@dataclass(frozen=True)
class Block:
    """One question block: its ids, the option endpoints (ends) or label blocks (starts..ends) and, for a
    span block, the positions of the target's word starts (all relative to the block's first token)."""

    ids: tuple[int, ...]
    ends: tuple[int, ...]
    starts: tuple[int, ...] = ()
    words: tuple[int, ...] = ()


class VelaLayout:
    def __init__(self, encode):
        self.encode = encode  # text -> token ids, no special tokens

    def prefix(self, parts: list[tuple[str, list[int]]]) -> list[int]:
        """The parts' prefix from each part's own ids (role, ids), as `encode`d once by the caller."""
        ids = self.encode(PARTS_HEAD)
        for role, part in parts:
            ids += self.encode(segment_open(role)) + list(part) + self.encode(SEGMENT_CLOSE)
        return ids

    def options_block(
        self, kind: str, roles: tuple[str, ...], text: str, options: list[tuple[str, str]], abstain: bool
    ) -> Block:
        ids = list(self.encode(question_head(kind, roles, text)))
        ends = []
        for key, description in options + ([ABSTAIN] if abstain else []):
            ids += self.encode(option_block(key, description))
            ends.append(len(ids) - 1)
        ids += self.encode(SUFFIX[kind])
        return Block(tuple(ids), tuple(ends))

    def span_block(
        self, role: str, text: str, labels: list[tuple[str, str]], state_ids: list[int], words: Words
    ) -> Block:
        ids = list(self.encode(question_head("span", (role,), text, span=True)))
        starts, ends = [], []
        for key, description in labels:
            starts.append(len(ids))
            ids += self.encode(option_block(key, description, "label"))
            ends.append(len(ids) - 1)
        ids += self.encode(TEXT_HEAD) + self.encode(segment_open(role))
        positions = tuple(len(ids) + first for first in words.first)
        ids += list(state_ids) + self.encode(SEGMENT_CLOSE) + self.encode(SUFFIX["span"])
        return Block(tuple(ids), tuple(ends), tuple(starts), positions)
