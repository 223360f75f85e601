"""Per-candidate rows: every candidate of a question is its own row after the shared state prefix, and
the readout gives each row one FP32 scalar. Choice and score normalise a question's scalars with a
softmax; noul is one row whose scalar s is read as the logits [0, s] (P(yes) = sigmoid(s)).

The row text is the question line, then (for a candidate) `candidate` with the option, or (noul)
`noul`; the recipe's `serving.options` may replace either text.
"""
from __future__ import annotations

import torch

from jev_common.schema import (
    ChoiceAnswer, ChoiceQuestion, NoulAnswer, NoulQuestion, ScoreAnswer, ScoreQuestion, choice_answer,
    score_answer,
)

from ...prompt import RowSpec
from ...protocols import QuestionKind
from ...questions.base import BuildContext

CANDIDATE = "Proposed answer: {option}\nIs this proposed answer correct? Answer Yes or No."
NOUL = "Is the answer to this question yes? Answer Yes or No."
NOUL_CRITERIA = "\nYes means: {true}\nNo means: {false}"


def _softmax(logits) -> list[float]:
    return torch.softmax(torch.cat([row.reshape(-1)[:1].to(torch.float32) for row in logits]), dim=-1).tolist()


class _Candidates(QuestionKind):
    def __init__(self, candidate: str = CANDIDATE):
        self.candidate = candidate

    def candidate_rows(self, question, ctx: BuildContext, where: str, options: list[str]) -> list[RowSpec]:
        head = ctx.question_line(question, where)
        return [RowSpec(head + self.candidate.format(option=option), ()) for option in options]


class CandidateChoice(_Candidates):
    type = "choice"

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        options = [name if text is None else f"{name}: {text}" for name, text in ctx.criteria(question, where)]
        return self.candidate_rows(question, ctx, where, options)

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        probs = _softmax(logits)
        names = list(question.criteria)
        return choice_answer(names, probs)


class CandidateScore(_Candidates):
    type = "score"

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        levels = [ctx.user_text(level, f"{where}.criteria[{i}]") for i, level in enumerate(question.criteria)]
        return self.candidate_rows(question, ctx, where, levels)

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        probs = _softmax(logits)
        return score_answer(question.criteria, probs)


class CandidateNoul(QuestionKind):
    type = "noul"

    def __init__(self, noul: str = NOUL, criteria: str = NOUL_CRITERIA):
        self.noul = noul
        self.criteria = criteria

    def rows(self, question: NoulQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        text = ctx.instructions(question, where)
        if question.criteria is not None:
            sides = {side: "" if value is None else ctx.user_text(value, f"{where}.criteria.{side}")
                     for side, value in (("true", question.criteria.true), ("false", question.criteria.false))}
            text += self.criteria.format(**sides)
        return [RowSpec(ctx.prompt.question_block.format(question=text) + self.noul, ())]

    def answer(self, question: NoulQuestion, logits, ctx: BuildContext) -> NoulAnswer:
        score = logits[0].reshape(-1)[0].to(torch.float32)
        return NoulAnswer(noul=float(torch.softmax(torch.stack([torch.zeros_like(score), score]), dim=-1)[1]))
