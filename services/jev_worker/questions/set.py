"""set (extension): every named statement on its own Yes/No row after the shared state prefix;
probabilities[name] is that row's own P(yes), selected are those >= 0.5."""

from __future__ import annotations

from jev_common.schema import SetAnswer, SetQuestion

from ..prompt.builder import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities


class SetKind(QuestionKind):
    type = "set"

    def rows(self, question: SetQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        head = ctx.question_line(question, where)
        rows = []
        for name, text in ctx.criteria(question, where):
            statement = name if text is None else f"{name}: {text}"
            rows.append(RowSpec(head + ctx.prompt.set_instruction.format(option=statement), ctx.builder.yes_no_ids))
        return rows

    def answer(self, question: SetQuestion, logits, ctx: BuildContext) -> SetAnswer:
        yes = {name: probabilities(row)[0] for name, row in zip(question.criteria, logits)}
        return SetAnswer(selected=[name for name, p in yes.items() if p >= 0.5], probabilities=yes)
