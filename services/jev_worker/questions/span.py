"""span (extension): which candidate substring of the text state answers; lettered like choice, and
the answer locates the chosen candidate's first occurrence in the state."""
from __future__ import annotations

from jev_common.schema import Span, SpanAnswer, SpanQuestion, choice_confidence

from ..prompt import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities
from .choice import option_lines


class SpanKind(QuestionKind):
    type = "span"

    def rows(self, question: SpanQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        codes, ids = ctx.builder.coded(len(question.criteria))
        listing = option_lines(list(question.criteria), [None] * len(question.criteria), codes, ctx, where)
        content = (ctx.question_line(question, where)
                   + ctx.prompt.choice_instruction.format(options=listing))
        return [RowSpec(content, ids)]

    def answer(self, question: SpanQuestion, logits, ctx: BuildContext) -> SpanAnswer:
        probs = probabilities(logits[0])
        best = max(range(len(probs)), key=probs.__getitem__)
        text = question.criteria[best]
        start = str(ctx.state).index(text)
        return SpanAnswer(span=Span(start=start, end=start + len(text), text=text),
                          probabilities=dict(zip(question.criteria, probs)), confidence=choice_confidence(probs))
