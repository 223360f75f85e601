"""choice under coherence `prior` (the request's x_coherence): one row, as `off`, its label logits debiased by the
served recipe's position prior (values/position_prior.py: PriDe, Zheng et al., ICLR 2024) before the softmax.

Wraps the readout's own choice type (questions/choice.py), whose cyclic rows the prior was estimated from; every
other mode is the wrapped type's. A choice whose option count the prior does not cover is refused before any
forward (a 422 naming the counts it covers), never answered biased."""

from __future__ import annotations

from ..protocols import QuestionKind
from ..values.position_prior import PositionPrior


class PriorChoice(QuestionKind):
    type = "choice"

    def __init__(self, kind: QuestionKind, prior: PositionPrior):
        if kind.type != "choice" or "cyclic" not in kind.coherence_modes:
            raise ValueError(
                f"a position prior debiases a choice read from option codes (one that offers cyclic); "
                f"this readout's {kind.type} type does not"
            )
        self.kind = kind
        self.prior = prior
        self.min_options = kind.min_options
        self.coherence_modes = kind.coherence_modes | {"prior"}
        self.position_free = kind.position_free
        self.coherence_note = kind.coherence_note

    def refuses(self, question, mode: str) -> str | None:
        if mode != "prior":
            return self.kind.refuses(question, mode)
        n = len(question.criteria)
        if not self.prior.covers(n):
            return (
                f"has no position prior for a choice of {n} options (its prior covers {self.prior.counts()} "
                f'options: {self.prior.source}); send x_coherence "cyclic" or "off" for this question'
            )
        return None

    def rows(self, question, ctx, where: str):
        return self.kind.rows(question, ctx, where)  # under `prior` the choice's single row, as `off`

    def answer(self, question, logits, ctx):
        if ctx.coherence == "prior":
            logits = [self.prior.debias(row) for row in logits]
        return self.kind.answer(question, logits, ctx)
