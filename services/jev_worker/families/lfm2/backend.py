"""lfm2-values: the causal-lm engine run as system1-omni's LFM2 engine scores candidates (`engine.py`
`Engine.score`): one prefill per question (its whole prompt), forked per candidate batch (the engine's cache
snapshot: the attention layers' KV and the convolution layers' state, copied and repeated per row), each
candidate row `'  "answer": '` + value tokens after it, right-padded. The head reads every position of a row:
the value tokens' log-probabilities over the full vocabulary at the positions that predict them.

What this adds to the causal-lm runner (runner.py), and nothing else:
- each question is its own prefix group (Lfm2Builder.prefix_groups: its prompt is its own prefix, kept in L3
  under its own key);
- its forward adapter (Lfm2Adapter): rows hand the head every real position, packing is off (rows after a
  snapshot are right-padded anyway), and the once-per-model check that a forked snapshot equals a whole
  forward compares the row's positions (the runner does so for every adapter that reads whole rows).
"""

from __future__ import annotations

import threading

import torch

from ...backends.causal_lm import CausalLM
from ...engine.adapters import TextAdapter
from ...protocols import Head


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
        states = hidden[-(n + 1) : -1].to(torch.float32)
        logits = states @ self.weight.T
        if self._bias is not None:
            logits = logits + self._bias.detach().float()
        targets = torch.tensor(labels, device=logits.device).unsqueeze(1)
        return logits.log_softmax(-1).gather(1, targets).sum().reshape(1)


class Lfm2Adapter(TextAdapter):
    """Rows hand the head every real position (the value tokens' log-probabilities), and run right-padded after
    a forked snapshot (the packed paths read last positions only). Not graph-captured: snapshots are not KV."""

    reads = "row"
    packs = False
    graph_capturable = False


class Lfm2Values(CausalLM):
    name = "lfm2-values"
    prefix_reuse = (
        "on: each question's prompt (schema system turn + state + '{\\n') is one prefill, kept in L3 "
        "as a cache snapshot (attention KV and convolution state) and forked per candidate batch"
    )

    def adapter(self, vision) -> Lfm2Adapter:
        return Lfm2Adapter()
