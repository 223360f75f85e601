"""Rows that end with a text to score (option scoring, readouts/option_scoring.py): each row is the recipe's chat
layout around the state block and the question, as a label-token row is, followed by the text the model is asked
to say (an option's name, " yes", a level), whose tokens the head scores (engine/continuation_head.py).

The row up to the answer is the one-pass tokenisation ChatPromptBuilder makes (prefix cut inside the state block);
the answer text is tokenised on its own and appended, as a continuation is scored after its context: its tokens are
the row's labels, the same ids whatever precedes them.

With a calibration baseline, the same rows are also prepared after a content-free state (`ScoredRequest.baseline`):
what each answer's log-probability is without the state. Those rows depend only on the question and its options,
never on the state, so each is keyed (`baseline_keys`) and computed once, then cached across requests
(engine/baseline_rows.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from jev_common.errors import UnreadableInput

from .builder import ChatPromptBuilder, PreparedRequest, RowSpec, ids_key


@dataclass(frozen=True)
class ScoredRow(RowSpec):
    """A row whose `answer` text is scored (its tokens become the row's labels); `labels` is unused."""

    answer: str = ""


@dataclass(frozen=True)
class ScoredRequest(PreparedRequest):
    """A prepared request of scored rows and, when calibrated, the same rows after the content-free state."""

    baseline: PreparedRequest | None = None
    baseline_keys: tuple[str, ...] = ()  # one per row: what its baseline score is cached under


class ScoredRowsBuilder(ChatPromptBuilder):
    """ChatPromptBuilder's rows with each row's answer text appended as its labels; `content_free` (None: no
    baseline) is the state the baseline rows follow."""

    def __init__(self, tokenizer, recipe, identity: str, content_free: str | None):
        super().__init__(tokenizer, recipe, identity)
        self.content_free = content_free

    def answer_ids(self, row: RowSpec) -> tuple[int, ...]:
        if not isinstance(row, ScoredRow):
            raise TypeError(f"{type(self).__name__} scores ScoredRow rows (questions/scored.py), not {row!r}")
        ids = tuple(self.tokenizer.encode(row.answer, add_special_tokens=False))
        if not ids:
            raise UnreadableInput(f"an option's text {row.answer!r} has no tokens to score; give it a visible name")
        return ids

    def prepare(
        self, state_text: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> ScoredRequest:
        answers = [self.answer_ids(row) for row in rows]
        main = self._scored(state_text, rows, answers, image_keys, plan)
        if self.content_free is None:
            return ScoredRequest(**_fields(main))
        baseline = self._scored(self.content_free, rows, answers, (), None)
        keys = tuple(
            ids_key(f"{self.identity}|baseline|{len(baseline.prefix_ids)}|", baseline.prefix_ids + row + labels)
            for row, labels in zip(baseline.rows, baseline.row_labels)
        )
        return ScoredRequest(**_fields(main), baseline=baseline, baseline_keys=keys)

    def _scored(self, state_text, rows, answers, image_keys, plan) -> PreparedRequest:
        prepared = super().prepare(state_text, [RowSpec(row.content, ()) for row in rows], image_keys, plan)
        return replace(
            prepared,
            rows=tuple(ids + answer for ids, answer in zip(prepared.rows, answers)),
            row_labels=tuple(answers),
        )


def _fields(prepared: PreparedRequest) -> dict:
    return {
        "prefix_ids": prepared.prefix_ids,
        "rows": prepared.rows,
        "row_labels": prepared.row_labels,
        "image_keys": prepared.image_keys,
        "prefix_key": prepared.prefix_key,
        "plan": prepared.plan,
        "boundary_mismatch": prepared.boundary_mismatch,
    }
