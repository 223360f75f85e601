"""The summed log-probability of a row's continuation: the tokens a row ends with, each scored by the model's full
next-token distribution at the position before it (LFM2.5's candidate values, option scoring's option texts)."""

from __future__ import annotations

import threading

import torch

from ..protocols import Head


class ContinuationLogProbHead(Head):
    """The summed FP32 log-probability of a row's continuation: `labels` are its token ids, the row's last
    len(labels) tokens; position i of the row predicts token i + 1, so the positions read are the len(labels) before
    the row's last. Full-vocabulary log-softmax of h(FP32) @ W(FP32)ᵀ (+ bias), the LM head's matrix copied once in
    FP32 (no soft-cap: the families served this way have none)."""

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
