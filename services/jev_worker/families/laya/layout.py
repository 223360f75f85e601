"""Laya's one-pass sequence per question, as the `laya` runtime lays it out (common.build_sequence):

    [cls] "{type} question: {instructions}" [sep] ([mask] " {option}")* [sep] state [sep]

Each piece is tokenised alone without special tokens; an option keeps at most 48 tokens; when the
options leave the question fewer than 16 of `head_max_len` tokens, each option is cut to
max(4, (head_max_len - 16) // n) tokens; the question keeps max(8, what is left of head_max_len);
the state fills the room to `max_len` (from its end for a list state, a conversation, else from its
start). The answer is read at each [mask] marker. Text equal to the mask token is replaced by a space
everywhere (as Laya does); the other control tokens in user text are refused (422).

`LayaSequenceBuilder` stands where the prompt builder stands for decoder recipes: it turns the
question rows (`LayaRow`) into whole-sequence rows whose labels are (question type id, marker
positions...).
"""

from __future__ import annotations

from dataclasses import dataclass

from jev_common.control_tokens import ControlTokens
from jev_common.errors import TooManyOptions
from jev_common.state_text import render_state

from ...prompt.builder import PreparedRequest, ids_key
from ...protocols import PromptBuilder

QTYPE_IDS = {"choice": 0, "score": 1, "noul": 2}
OPTION_TOKENS = 48


@dataclass(frozen=True)
class LayaRow:
    type: str
    instructions: str
    options: tuple[str, ...]


class LayaSequenceBuilder(PromptBuilder):
    """Laya's sequences; its control tokens are the encoder's special tokens but the mask (Laya replaces it)."""

    cuts_state = True  # the state fills the room left to max_len and options are cut, as upstream does

    def __init__(self, tokenizer, recipe, identity: str, *, max_len: int, head_max_len: int):
        controls = ControlTokens(
            (t for t in tokenizer.all_special_tokens if t != tokenizer.mask_token),
            what="encoder",
            hint="remove it from the text",
        )
        super().__init__(tokenizer, recipe, identity, controls=controls)
        self.max_len = max_len
        self.max_length = max_len  # every sequence is cut to it: the prompt bound
        self.head_max_len = head_max_len
        self.mask = tokenizer.mask_token
        self.mask_id = tokenizer.mask_token_id

    def _ids(self, text: str, **kwargs) -> list[int]:
        return self.tokenizer(text.replace(self.mask, " "), add_special_tokens=False, **kwargs)["input_ids"]

    def sequence(self, row: LayaRow, state_ids: list[int], truncate_left: bool) -> tuple[tuple[int, ...], list[int]]:
        tok = self.tokenizer
        head = self._ids(f"{row.type} question: {row.instructions}")
        options = [
            [self.mask_id] + self._ids(" " + option, truncation=True, max_length=OPTION_TOKENS)
            for option in row.options
        ]
        budget = self.head_max_len - sum(len(o) for o in options)
        if budget < 16:
            per = max(4, (self.head_max_len - 16) // max(1, len(options)))
            options = [o[:per] for o in options]
            budget = self.head_max_len - sum(len(o) for o in options)
        ids = [tok.cls_token_id] + head[: max(8, budget)] + [tok.sep_token_id]
        markers = []
        for option in options:
            markers.append(len(ids))
            ids.extend(option)
        ids.append(tok.sep_token_id)
        room = max(0, self.max_len - len(ids) - 1)
        state = state_ids[max(0, len(state_ids) - room) :] if truncate_left else state_ids[:room]
        ids = (ids + state + [tok.sep_token_id])[: self.max_len]
        return tuple(ids), [m for m in markers if m < self.max_len]

    def prepare(
        self, state_text: str, rows: list[LayaRow], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        state = plan.state if plan is not None else state_text
        state_ids = self._ids(render_state(state))  # Laya renders a state as the envelope does
        sequences, labels = [], []
        for row in rows:
            ids, markers = self.sequence(row, state_ids, truncate_left=isinstance(state, list))
            if len(markers) != len(row.options):
                raise TooManyOptions(
                    f"{len(row.options)} options do not fit this encoder's {self.max_len}-token "
                    f"sequence (head_max_len {self.head_max_len}); send fewer or shorter options"
                )
            sequences.append(ids)
            labels.append((QTYPE_IDS[row.type], *markers))
        return PreparedRequest(
            prefix_ids=(),
            rows=tuple(sequences),
            row_labels=tuple(labels),
            image_keys=(),
            prefix_key=ids_key(f"{self.identity}|laya|", (i for ids in sequences for i in ids)),
            plan=plan,
        )
