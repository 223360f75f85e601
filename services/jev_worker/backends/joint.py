"""causal-lm-joint: a causal LM run once over each request's ONE sequence (all its questions together), for
readouts whose head answers a whole request at once (Clef's joint schema head).

The readout's prompt builder lays the request out as one row; this engine runs that row whole (no cache,
no prefix state), one request at a time on the worker's model thread, and hands the final hidden states
of every position, with the prepared request, to `head.request_logits(hidden, prepared)`, which returns
one logit tensor per question (the envelope's answer rows). Nothing is reused between requests: the head
reads every position, the state's included, after the questions have been seen (L3 off, said in stats).
"""

from __future__ import annotations

from ..engine.adapters import SequenceAdapter, VisionSequenceAdapter
from .causal_lm import CausalLM


class CausalJoint(CausalLM):
    name = "causal-lm-joint"
    prefix_reuse = (
        "off: the readout's head reads every position of each request's one sequence (all questions "
        "jointly), so each request runs whole and alone; no prefix state is reused (L3 off)"
    )

    def adapter(self, vision) -> SequenceAdapter | VisionSequenceAdapter:
        return VisionSequenceAdapter(vision) if vision is not None else SequenceAdapter()

    def l3_bytes(self, configured: int) -> int:
        return 0
