"""lfm2-values: the causal-lm engine run as system1-omni's LFM2 engine scores candidates (`engine.py`
`Engine.score`): one prefill per question (its whole prompt), forked per candidate batch (the engine's cache
snapshot: the attention layers' KV and the convolution layers' state, copied and repeated per row), each
candidate row `'  "answer": '` + value tokens after it, right-padded. The head reads every position of a row:
the value tokens' log-probabilities over the full vocabulary at the positions that predict them.

What this adds to DecisionEngine (engine.py), and nothing else:
- a prepared request's questions run as separate items (`Lfm2Prepared.parts`: each question's prompt is its
  own prefix, kept in L3 under its own key), their results joined back in row order;
- rows hand the head their hidden states at every real position (as causal-lm-rows does), not only the last;
- packing is off (rows after a snapshot are right-padded anyway; the packed paths read last positions only),
  and the once-per-model check that a forked snapshot equals a whole forward compares the row's positions.
"""
from __future__ import annotations

import threading

import torch

from ...backends.causal_lm import CausalLM
from ...engine import DecisionEngine, EngineItem, EngineResult, _relative_error, log
from ...protocols import Head
from .prompt import Lfm2Prepared


class ValueLogProbHead(Head):
    """The summed FP32 log-probability of a row's value tokens: `labels` are the value token ids, the row's
    last len(labels) tokens; position i of the row predicts token i + 1, so the positions read are the
    len(labels) before the row's last. Full-vocabulary log-softmax of h(FP32) @ W(FP32)ᵀ, the LM head's
    matrix copied once in FP32 (LFM2's head is its tied input embedding; it has no bias or soft-cap)."""

    def __init__(self, model: torch.nn.Module):
        output = model.get_output_embeddings()
        self._source = output.weight
        self._bias = output.bias
        self._weight: torch.Tensor | None = None
        self._lock = threading.Lock()

    @property
    def weight(self) -> torch.Tensor:
        with self._lock:
            if self._weight is None:
                self._weight = self._source.detach().to(torch.float32).clone()
            return self._weight

    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        n = len(labels)
        states = hidden[-(n + 1):-1].to(torch.float32)
        logits = states @ self.weight.T
        if self._bias is not None:
            logits = logits + self._bias.detach().float()
        targets = torch.tensor(labels, device=logits.device).unsqueeze(1)
        return logits.log_softmax(-1).gather(1, targets).sum().reshape(1)


class Lfm2ValueEngine(DecisionEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.packing = False

    @staticmethod
    def _last(hidden: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Each row's hidden states up to its own length (the head addresses them from the row's end)."""
        return [hidden[i, :n] for i, n in enumerate(lengths.tolist())]

    def _snapshot_branching_is_exact(self, item: EngineItem, state) -> bool:
        row = item.prepared.rows[0]
        branched = self._rows_after_states([(state, row), (state, row)])
        whole = self._text_full([(item.prepared.prefix_ids, row)], False)[0][0][-len(row):]
        error = max(_relative_error(h, whole) for h in branched)
        if error > 1e-3:
            log.warning("prefix snapshot branching differs from a whole forward (relative %.2e): disabled", error)
            return False
        return True

    @torch.inference_mode()
    def run(self, items: list[EngineItem]) -> list[EngineResult]:
        parts, owner = [], []
        for i, item in enumerate(items):
            prepared = item.prepared
            for part in (prepared.parts if isinstance(prepared, Lfm2Prepared) else (prepared,)):
                parts.append(EngineItem(prepared=part, assets=item.assets))
                owner.append(i)
        results = super().run(parts)
        joined = []
        for i in range(len(items)):
            mine = [r for r, o in zip(results, owner) if o == i]
            outcomes = {r.l3 for r in mine}
            joined.append(EngineResult(row_logits=[x for r in mine for x in r.row_logits],
                                       cached_tokens=sum(r.cached_tokens for r in mine),
                                       l3=outcomes.pop() if len(outcomes) == 1 else "miss"))
        return joined


class Lfm2Values(CausalLM):
    name = "lfm2-values"
    engine_class = Lfm2ValueEngine
    prefix_reuse = ("on: each question's prompt (schema system turn + state + '{\\n') is one prefill, kept in L3 "
                    "as a cache snapshot (attention KV and convolution state) and forked per candidate batch")
