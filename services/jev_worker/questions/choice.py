"""choice: one row listing the options under codes (A..Z, then two-letter codes); softmax over the codes."""
from __future__ import annotations

from jev_common.schema import ChoiceAnswer, ChoiceQuestion, choice_answer

from ..prompt import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities


def option_lines(names: list[str], descriptions: list[object | None], codes: list[str], ctx: BuildContext,
                 where: str) -> str:
    prompt = ctx.prompt
    lines = []
    for code, name, description in zip(codes, names, descriptions):
        ctx.builder.check_user_text(name, f"{where}.criteria")
        if description is None:
            lines.append(prompt.option_line.format(code=code, name=name))
        else:
            text = ctx.user_text(description, f"{where}.criteria[{name!r}]")
            lines.append(prompt.described_option_line.format(code=code, name=name, description=text))
    return "\n".join(lines)


class Choice(QuestionKind):
    type = "choice"

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        names = list(question.criteria)
        codes, ids = ctx.builder.coded(len(names))
        listing = option_lines(names, list(question.criteria.values()), codes, ctx, where)
        content = (ctx.question_line(question, where)
                   + ctx.prompt.choice_instruction.format(options=listing))
        return [RowSpec(content, ids)]

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        probs = probabilities(logits[0])
        names = list(question.criteria)
        return choice_answer(names, probs)
