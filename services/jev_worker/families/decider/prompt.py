"""Decider-2B v11's prompt: plain text, no chat template, no system prompt, no BOS, two segments tokenised apart.

After Mapika/decider 50d0be0 (`systemone.py`, `prompt.py`, `prompt_fast.py`) as its native port serves it
(ThinkFlowLab/system1-omni `src/models/decider/native/src/processing.rs`, `contract.rs`). Every row is

    encode("Context:\\n" + STATE)[:32768]
      +  encode("\\n\\nQuestion: " + TEXT + "\\nOptions:" + "\\n(A) opt" ... + "\\nAnswer: (")

each `encode` the tokenizer without special tokens. The first segment is the state prefix every question shares
(what L3 caches); the question piece is its row, read at its last token (`" ("`) over the bare labels `A`, `B`, ...
A question of more than 10 options is built from ids: `encode("\\n\\nQuestion: ...\\nOptions:")`, then per option
`encode("\\n(")`, the option's label id, `encode(") " + opt)`, then `encode("\\nAnswer: (")`. Labels: A..Z, then
the two-letter names AA..ZZ that are one token, the first 255 (the tokenizer must have 255 distinct ones).
STATE is a text state as sent, else Python's `json.dumps` with `_index` on arrays of 8+ items (indexed_json).
Upstream encodes control tokens in user text as the tokens they name (its fixture has `<|im_start|>` in a state),
so nothing is refused for them here either.
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass

from jev_common.checkpoint_files import ServingError
from jev_common.control_tokens import ControlTokens
from jev_common.errors import UnreadableInput
from jev_common.state_text import indexed_json

from ...prompt.builder import PreparedRequest, RowSpec, ids_key
from ...protocols import PromptBuilder

NARROW = "ABCDEFGHIJ"  # up to 10 options the piece is one encoded text with "(A" ... "(J"
MAX_OPTIONS = 255  # labels A..Z, then single-token two-letter names
MAX_STATE_TOKENS = 32768  # the context segment is cut to its first 32,768 tokens (never refused)
MAX_ROWS, MAX_ROW_TOKENS, MAX_REQUEST_TOKENS = 1024, 36864, 1048576  # processing.rs Limits::default


def text(value) -> str:
    """`_txt`: a string as is, anything else as Python's json.dumps (no `_index`)."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def state_text(state) -> str:
    """`render_state`: a text state as sent, anything else indexed JSON."""
    return state if isinstance(state, str) else indexed_json(state)


def label_table(tokenizer) -> tuple[list[str], list[int]]:
    """(names, ids) of the 255 labels: A..Z then AA, AB, ... ZZ, each kept when it is one token."""
    names, ids = [], []
    for name in list(string.ascii_uppercase) + [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]:
        token = tokenizer.encode(name, add_special_tokens=False)
        if len(token) == 1:
            names.append(name)
            ids.append(token[0])
        if len(ids) == MAX_OPTIONS:
            break
    if len(ids) != MAX_OPTIONS or len(set(ids)) != MAX_OPTIONS:
        raise ServingError(
            f"Decider needs {MAX_OPTIONS} distinct single-token labels (A..Z, AA..ZZ); this tokenizer "
            f"has {len(set(ids))}"
        )
    return names, ids


@dataclass(frozen=True)
class DeciderRow(RowSpec):
    """A question piece: its text (`content`, for reading) and what its ids are built from."""

    question: str = ""
    options: tuple[str, ...] = ()


class DeciderBuilder(PromptBuilder):
    max_length = MAX_ROW_TOKENS  # upstream's per-row limit (processing.rs), refused in its words
    cuts_state = True  # the state is cut at 32,768 tokens, as upstream does

    def __init__(self, tokenizer, recipe, identity: str):
        super().__init__(tokenizer, recipe, identity, controls=ControlTokens(()))
        self.label_names, self.label_ids = label_table(tokenizer)
        self.open_ids = self.encode("\n(")

    def encode(self, value: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(value, add_special_tokens=False))

    def row(self, question: str, options: list[str]) -> DeciderRow:
        """The row of a question with these options (2..255), read over their labels."""
        names = NARROW if len(options) <= len(NARROW) else self.label_names
        content = (
            f"\n\nQuestion: {question}\nOptions:"
            + "".join(f"\n({n}) {o}" for n, o in zip(names, options))
            + "\nAnswer: ("
        )
        return DeciderRow(content, tuple(self.label_ids[: len(options)]), question=question, options=tuple(options))

    def piece(self, row: DeciderRow) -> tuple[int, ...]:
        if len(row.options) <= len(NARROW):
            return self.encode(row.content)
        ids = self.encode(f"\n\nQuestion: {row.question}\nOptions:")
        for label, option in zip(self.label_ids, row.options):
            ids += self.open_ids + (label,) + self.encode(f") {option}")
        return ids + self.encode("\nAnswer: (")

    def prepare(
        self, state_text_: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        """The context segment (the state as upstream renders it, from the plan's state) and each question piece."""
        if len(rows) > MAX_ROWS:
            raise UnreadableInput(
                f"too many questions: the request expands to {len(rows)} scoring rows (a score "
                f"question is one row per level), Decider's limit is {MAX_ROWS}"
            )
        state = plan.state if plan is not None else state_text_
        context = self.encode("Context:\n" + state_text(state))[:MAX_STATE_TOKENS]
        pieces = tuple(self.piece(row) for row in rows)
        longest = len(context) + max(len(p) for p in pieces)
        if longest > MAX_ROW_TOKENS:
            raise UnreadableInput(
                f"too many tokens: one row has {longest} tokens, Decider's limit is {MAX_ROW_TOKENS} per row"
            )
        total = len(context) * len(pieces) + sum(len(p) for p in pieces)
        if total > MAX_REQUEST_TOKENS:
            raise UnreadableInput(
                f"too many tokens: the request has {total} tokens over {len(pieces)} rows, "
                f"Decider's limit is {MAX_REQUEST_TOKENS}"
            )
        return PreparedRequest(
            prefix_ids=context,
            rows=pieces,
            row_labels=tuple(row.labels for row in rows),
            image_keys=tuple(image_keys),
            prefix_key=ids_key(f"{self.identity}|decider|", context),
            plan=plan,
        )
