"""A request's questions as rows, and the rows' logits as answers: each question type (registry.py) builds its
rows and reads its answer; the plan remembers which rows are whose."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jev_common.errors import UnsupportedQuestionType, validation_error
from jev_common.schema import SystemOneRequest

from ..prompt.builder import RowSpec
from .base import BuildContext
from .coherence import check as check_coherence
from .registry import QUESTION_KINDS


@dataclass(frozen=True)
class QuestionPlan:
    qid: str
    question: object
    first_row: int
    n_rows: int


@dataclass(frozen=True)
class EnvelopePlan:
    questions: tuple[QuestionPlan, ...]
    state: object
    coherence: str = "off"


def question_rows(
    request: SystemOneRequest, builder, kinds: dict | None = None, served_by: str = "label-tokens"
) -> tuple[list[RowSpec], EnvelopePlan]:
    return rows_for(request.questions, request.state, builder, kinds, served_by)


def rows_for(
    questions: dict,
    state: object,
    builder,
    kinds: dict | None = None,
    served_by: str = "label-tokens",
    coherence: str = "off",
) -> tuple[list[RowSpec], EnvelopePlan]:
    """Rows of every question (id -> question), by the served readout's question types (`kinds`)."""
    kinds = QUESTION_KINDS if kinds is None else kinds
    ctx = BuildContext(builder, state, coherence=coherence)
    rows: list[RowSpec] = []
    check_coherence(questions, kinds, coherence, served_by)
    plans = []
    for qid, question in questions.items():
        kind = kinds.get(question.type)
        if kind is None:
            raise UnsupportedQuestionType(
                f"questions[{qid!r}]: question type {question.type!r} is not answered by this model's readout "
                f"({served_by}); it answers {', '.join(sorted(kinds))}"
            )
        if question.type == "choice" and len(question.criteria) < kind.min_options:
            raise validation_error(
                f"questions[{qid!r}].criteria: this model's readout ({served_by}) answers a choice of at least "
                f"{kind.min_options} options, as its upstream does; got {len(question.criteria)} (too_short)",
                ("questions", qid, "criteria"),
                "too_short",
            )
        built = kind.rows(question, ctx, f"questions[{qid!r}]")
        plans.append(QuestionPlan(qid, question, len(rows), len(built)))
        rows.extend(built)
    return rows, EnvelopePlan(tuple(plans), state, coherence)


def answers(plan: EnvelopePlan, row_logits: list[torch.Tensor], builder, kinds: dict | None = None) -> dict:
    kinds = QUESTION_KINDS if kinds is None else kinds
    # a family's own plan (JEMM's, Clef's) carries no coherence: its choice types offer none (refused in rows_for)
    coherence = plan.coherence if isinstance(plan, EnvelopePlan) else "off"
    ctx = BuildContext(builder, plan.state, plan, coherence=coherence)
    out = {}
    for q in plan.questions:
        kind = kinds[q.question.type]
        out[q.qid] = kind.answer(q.question, row_logits[q.first_row : q.first_row + q.n_rows], ctx)
    return out
