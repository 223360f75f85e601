"""score: one row listing the levels 0..n-1, read from the digit tokens (codes when digits are not one
token each); score = sum(i * p_i)."""
from __future__ import annotations

from jev_common.schema import ScoreAnswer, ScoreQuestion, score_answer

from ..prompt import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities
from .choice import option_lines


class Score(QuestionKind):
    type = "score"

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        n = len(question.criteria)
        digits = ctx.builder.digit_ids
        codes, ids = ([str(i) for i in range(n)], digits[:n]) if digits else ctx.builder.coded(n)
        lines = []
        for i, (code, level) in enumerate(zip(codes, question.criteria)):
            text = ctx.user_text(level, f"{where}.criteria[{i}]")
            lines.append(ctx.prompt.option_line.format(code=code, name=text))
        listing = "\n".join(lines)
        instruction = (ctx.prompt.levels_instruction.format(levels=listing) if digits
                       else ctx.prompt.choice_instruction.format(options=listing))
        content = ctx.question_line(question, where) + instruction
        return [RowSpec(content, tuple(ids))]

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        probs = probabilities(logits[0])
        return score_answer(question.criteria, probs)


__all__ = ["Score", "option_lines"]
