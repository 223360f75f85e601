"""Open-Jev's question types: every candidate its own row after the shared `Context:` prefix (layout.py), one
scalar s per row from the head (readout.py), already divided by the temperature (Calibration).

- choice: one candidate per option, `name` or `name: description`, in request order; softmax over the scalars.
- score: one candidate per level; softmax over the scalars; score = sum(i * p_i).
- noul: one row; the logits are [0, s], so noul = P(yes) = softmax([0, s])[1].

Choice and score are position-free: a candidate's row never shows another option, so no option order reaches the
answer, and every x_coherence mode is answered unchanged (questions/coherence.py; GET /v1/models says so).

As upstream's `compile_request` does, `instructions` are required (text, an object or an array) and a noul's
`criteria`, when given, must describe both `true` and `false`; the softmax is in float64, as upstream's.
"""

from __future__ import annotations

import torch

from jev_common.errors import UnreadableInput
from jev_common.schema import (
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    choice_answer,
    score_answer,
)

from ...prompt.builder import RowSpec
from ...protocols import QuestionKind
from ...questions.base import BuildContext
from .layout import CANDIDATE, NOUL, NOUL_CRITERIA, QUESTION, render


def text(value, ctx: BuildContext, where: str) -> str:
    """A value as Open-Jev renders it, checked for the model's control tokens."""
    rendered = render(value)
    ctx.builder.check_user_text(rendered, where)
    return rendered


def question_text(question, ctx: BuildContext, where: str) -> str:
    if question.instructions is None:
        raise UnreadableInput(
            f"{where}.instructions: Open-Jev needs the question's instructions (text, an object "
            "or an array); it has no default question"
        )
    return text(question.instructions, ctx, f"{where}.instructions")


def softmax(logits) -> list[float]:
    """Softmax in float64 over the rows' scalars (each row's one logit)."""
    values = torch.cat([row.reshape(-1)[:1] for row in logits]).to(torch.float64)
    return torch.softmax(values, dim=-1).tolist()


def candidate_rows(question, ctx: BuildContext, where: str, options: list[str]) -> list[RowSpec]:
    head = QUESTION.format(question=question_text(question, ctx, where))
    return [RowSpec(head + CANDIDATE.format(option=option), ()) for option in options]


class CandidateChoice(QuestionKind):
    type = "choice"
    min_options = 1  # upstream answers one option ({"only": 1.0} in its golden contract)
    position_free = True  # each candidate its own row, seeing no other option: every x_coherence mode, unchanged

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        options = []
        for name, description in question.criteria.items():
            ctx.builder.check_user_text(name, f"{where}.criteria")
            options.append(
                name if description is None else f"{name}: {text(description, ctx, f'{where}.criteria[{name!r}]')}"
            )
        return candidate_rows(question, ctx, where, options)

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        return choice_answer(list(question.criteria), softmax(logits))


class CandidateScore(QuestionKind):
    type = "score"
    position_free = True  # each level its own row

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        levels = [text(level, ctx, f"{where}.criteria[{i}]") for i, level in enumerate(question.criteria)]
        return candidate_rows(question, ctx, where, levels)

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        return score_answer(question.criteria, softmax(logits))


class CandidateNoul(QuestionKind):
    type = "noul"

    def rows(self, question: NoulQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        asked = question_text(question, ctx, where)
        criteria = question.criteria
        if criteria is not None:
            if criteria.true is None or criteria.false is None:
                raise UnreadableInput(
                    f"{where}.criteria: Open-Jev reads noul criteria only with both a true and a "
                    "false description (text, an object or an array)"
                )
            asked += NOUL_CRITERIA.format(
                true=text(criteria.true, ctx, f"{where}.criteria.true"),
                false=text(criteria.false, ctx, f"{where}.criteria.false"),
            )
        return [RowSpec(QUESTION.format(question=asked) + NOUL, ())]

    def answer(self, question: NoulQuestion, logits, ctx: BuildContext) -> NoulAnswer:
        score = logits[0].reshape(-1)[:1].to(torch.float64)
        return NoulAnswer(noul=float(torch.softmax(torch.cat([torch.zeros_like(score), score]), dim=-1)[1]))
