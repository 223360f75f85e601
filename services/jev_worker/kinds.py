"""From label logits to the answer of each kind of the single-question form (README: the legacy contract)."""
from __future__ import annotations

import torch

from jev_common.schema import Span

from .legacy import LegacyPlan


def decide(plan: LegacyPlan, row_logits: list[torch.Tensor], state_text: str | None) -> dict:
    """Response fields for one single-question request; every probability is computed in FP32."""
    kind = plan.kind
    options = plan.options
    if kind == "set":
        # one independent yes/no softmax per option; `probabilities` is the yes-mass normalised
        yes = [float(torch.softmax(logits, dim=-1)[0]) for logits in row_logits]
        total = sum(yes)
        normalised = [p / total for p in yes] if total > 0 else [1.0 / len(yes)] * len(yes)
        best = max(range(len(yes)), key=yes.__getitem__)
        return {
            "probabilities": normalised, "choice_index": best, "choice": options[best],
            "yes_probabilities": yes, "selected": [i for i, p in enumerate(yes) if p >= 0.5],
        }
    probs = torch.softmax(row_logits[0], dim=-1).tolist()
    if kind == "noul":
        noul = probs[-1]
        option_probs = probs[:-1]
        best = max(range(len(option_probs)), key=option_probs.__getitem__)
        if noul >= option_probs[best]:
            return {"probabilities": option_probs, "choice_index": None, "choice": None, "noul": noul}
        return {"probabilities": option_probs, "choice_index": best, "choice": options[best], "noul": noul}
    best = max(range(len(probs)), key=probs.__getitem__)
    fields = {"probabilities": probs, "choice_index": best, "choice": options[best]}
    if kind == "score":
        fields["score"] = sum(p * v for p, v in zip(probs, plan.numeric_values))
    elif kind == "span":
        start = (state_text or "").index(options[best])
        fields["span"] = Span(start=start, end=start + len(options[best]), text=options[best])
    return fields
