"""numeric (the single-question form's `score` only, not a System One type): options that are numbers, read
from their own tokens when each is one token (`Options:` listing the numbers, the recipe's
score_instruction), else lettered like choice; score = sum(value * p)."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from ..prompt.builder import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities
from .choice import Choice


@dataclass(frozen=True)
class NumericQuestion:
    instructions: str
    options: tuple[str, ...]  # numbers as sent (validated by the request schema)
    type: str = "numeric"


class NumericAnswer(BaseModel):
    probabilities: list[float]
    score: float


class NumericLevels(QuestionKind):
    type = "numeric"

    def rows(self, question: NumericQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        options = list(question.options)
        own = (
            [ctx.builder._try_single_token(o) for o in options]
            if ctx.builder.recipe.verbalizer.numeric_labels_for_score
            else []
        )
        if own and all(i is not None for i in own) and len(set(own)) == len(own):
            for i, option in enumerate(options):
                ctx.builder.check_user_text(option, f"{where}.options[{i}]")
            content = ctx.question_line(question, where) + ctx.prompt.score_instruction.format(
                options="\n".join(options)
            )
            return [RowSpec(content, tuple(own))]
        return Choice().rows(_as_choice(question), ctx, where)

    def answer(self, question: NumericQuestion, logits, ctx: BuildContext) -> NumericAnswer:
        probs = probabilities(logits[0])
        return NumericAnswer(probabilities=probs, score=sum(p * float(v) for p, v in zip(probs, question.options)))


def _as_choice(question: NumericQuestion):
    from jev_common.schema import ChoiceQuestion

    return ChoiceQuestion.model_construct(
        type="choice", instructions=question.instructions, criteria=dict.fromkeys(question.options)
    )
