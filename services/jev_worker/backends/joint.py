"""causal-lm-joint: a causal LM run once over each request's ONE sequence (all its questions together), for
readouts whose head answers a whole request at once (Clef's joint schema head).

The readout's prompt builder lays the request out as one row; this engine runs that row whole (no cache,
no prefix state), one request at a time on the worker's model thread, and hands the final hidden states
of every position, with the prepared request, to `head.request_logits(hidden, prepared)`, which returns
one logit tensor per question (the envelope's answer rows). Nothing is reused between requests: the head
reads every position, the state's included, after the questions have been seen (L3 off, said in stats).
"""
from __future__ import annotations

import torch

from ..engine import DecisionEngine, EngineResult
from ..protocols import RequestHead
from ..readouts.base import ServingError
from .causal_lm import CausalLM


class JointEngine(DecisionEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.head, RequestHead):
            raise ServingError("backend 'causal-lm-joint' needs a readout whose head answers whole requests "
                               "(a protocols.RequestHead)")
        self.kv_branching = False

    @torch.inference_mode()
    def run(self, items) -> list[EngineResult]:
        results = []
        for item in items:  # one request at a time: each is one sequence, read whole by the head
            prepared = item.prepared
            ids, _ = self._ids([prepared.prefix_ids + prepared.rows[0]])
            if item.assets:  # the preencoded images at their pad positions, M-RoPE over their grids
                embeds, positions, _ = self.vision.splice_image_embeds(self.model, ids, item.assets)
                hidden = self._forward(inputs_embeds=embeds, position_ids=positions, use_cache=False)
            else:
                hidden = self._forward(input_ids=ids, position_ids=self._positions(0, ids.shape[1], 1, 0),
                                       use_cache=False)
            logits = self.head.request_logits(hidden[0], prepared)
            results.append(EngineResult(row_logits=logits, cached_tokens=0, l3="off"))
        return results


class CausalJoint(CausalLM):
    name = "causal-lm-joint"
    engine_class = JointEngine
    prefix_reuse = ("off: the readout's head reads every position of each request's one sequence (all questions "
                    "jointly), so each request runs whole and alone; no prefix state is reused (L3 off)")

    def l3_bytes(self, configured: int) -> int:
        return 0
