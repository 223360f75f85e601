"""noul: a yes/no question; the answer is P(yes) from the Yes/No label tokens of one row."""

from __future__ import annotations

from jev_common.schema import NoulAnswer, NoulQuestion

from ..prompt.builder import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities


class Noul(QuestionKind):
    type = "noul"

    def rows(self, question: NoulQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        prompt = ctx.prompt
        criteria = ""
        if question.criteria is not None:
            if question.criteria.true is not None:
                criteria += prompt.noul_true.format(
                    description=ctx.user_text(question.criteria.true, f"{where}.criteria.true")
                )
            if question.criteria.false is not None:
                criteria += prompt.noul_false.format(
                    description=ctx.user_text(question.criteria.false, f"{where}.criteria.false")
                )
        content = ctx.question_line(question, where) + prompt.noul_instruction.format(criteria=criteria)
        return [RowSpec(content, ctx.builder.yes_no_ids)]

    def answer(self, question: NoulQuestion, logits, ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=probabilities(logits[0])[0])
