"""The decision head: LM-head rows of the label tokens, copied once and kept in FP32."""
from __future__ import annotations

import threading

import torch


class DecisionHead:
    """logits[label] = h_last(FP32) @ W[label](FP32) (+ bias), with the model's final soft-cap if any.

    Rows are copied from the output embedding the first time a label set is used (the verbalizer's
    letters and yes/no at load), so a BF16 backbone never rounds the decision logits.
    """

    def __init__(self, model: torch.nn.Module):
        output = model.get_output_embeddings()
        self._weight = output.weight
        self._bias = getattr(output, "bias", None)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self._rows: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._lock = threading.Lock()

    def rows(self, label_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self._lock:
            cached = self._rows.get(label_ids)
            if cached is None:
                index = torch.tensor(label_ids, device=self._weight.device)
                weight = self._weight.detach().index_select(0, index).to(torch.float32).clone()
                bias = None if self._bias is None else self._bias.detach().index_select(0, index).float().clone()
                cached = self._rows[label_ids] = (weight, bias)
            return cached

    def logits(self, hidden: torch.Tensor, label_ids: tuple[int, ...]) -> torch.Tensor:
        weight, bias = self.rows(label_ids)
        logits = hidden.to(torch.float32) @ weight.T
        if bias is not None:
            logits = logits + bias
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    @property
    def nbytes(self) -> int:
        return sum(w.numel() * 4 for w, _ in self._rows.values())
