"""span (extension): which candidate substring of the text state answers; lettered like choice, and
the answer locates the chosen candidate's first occurrence in the state. Its candidates are listed under codes as a
choice's options are, so it carries the same position bias and answers coherence `cyclic` the same way
(questions/choice.py: the candidates by text, a row per cyclic shift, averaged); under `prior` it answers single
pass (the position prior is estimated on the choice layout, not span's)."""

from __future__ import annotations

from jev_common.schema import Span, SpanAnswer, SpanQuestion, choice_confidence

from ..prompt.builder import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext
from .choice import MAX_SHIFTS, Listings, coded_rows, option_texts


class SpanKind(QuestionKind):
    type = "span"
    coherence_modes = frozenset({"cyclic"})
    coherence_note = (
        f"cyclic: the candidates by text, then every cyclic shift up to {MAX_SHIFTS}, else {MAX_SHIFTS} "
        "evenly spaced, averaged as choice's; prior: single pass (the prior is the choice layout's)"
    )

    def rows(self, question: SpanQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        candidates = option_texts(question.criteria, [None] * len(question.criteria), ctx, where)
        return coded_rows(question, question.criteria, candidates, ctx, where)

    def answer(self, question: SpanQuestion, logits, ctx: BuildContext) -> SpanAnswer:
        return span_answer(question.criteria, Listings(question.criteria, ctx.coherence).mean(logits), ctx.state)


def span_answer(candidates: list[str], probs: list[float], state: object) -> SpanAnswer:
    """The most probable candidate as the span (where it stands in the state's text), every candidate's probability."""
    text = candidates[max(range(len(probs)), key=probs.__getitem__)]
    start = str(state).index(text)
    return SpanAnswer(
        span=Span(start=start, end=start + len(text), text=text),
        probabilities=dict(zip(candidates, probs)),
        confidence=choice_confidence(probs),
    )
