"""The decision head: LM-head rows of the label tokens, copied once and kept in FP32."""

from __future__ import annotations

import logging
import os
import threading

import torch

from ..protocols import Head

log = logging.getLogger("jev.worker.head")
EXPORTED_HEAD_FILE = "decision_head.safetensors"  # written by tools/export_checkpoint.py


class DecisionHead(Head):
    """logits[label] = h_last(FP32) @ W[label](FP32) (+ bias), with the model's final soft-cap if any.

    Rows are copied from the output embedding the first time a label set is used (the verbalizer's
    letters and yes/no at load), so a BF16 backbone never rounds the decision logits. An exported
    checkpoint's `decision_head.safetensors` holds the rows taken from the FP32 head before the
    backbone was rounded to BF16; those rows are used for the tokens it covers.
    """

    def __init__(self, model: torch.nn.Module, checkpoint_dir: str | None = None):
        output = model.get_output_embeddings()
        self._weight = output.weight
        self._bias = getattr(output, "bias", None)
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        self.softcap = getattr(config, "final_logit_softcapping", None)
        self._rows: dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor | None]] = {}
        self._lock = threading.Lock()
        self._exported: dict[int, torch.Tensor] = {}
        path = os.path.join(checkpoint_dir, EXPORTED_HEAD_FILE) if checkpoint_dir else None
        if path and os.path.isfile(path):
            from safetensors.torch import load_file

            tensors = load_file(path)
            weight, token_ids = tensors["weight"].to(torch.float32), tensors["token_ids"].tolist()
            if weight.shape != (len(token_ids), self._weight.shape[1]):
                raise ValueError(
                    f"{path}: weight {tuple(weight.shape)} does not fit {len(token_ids)} tokens x "
                    f"hidden {self._weight.shape[1]}"
                )
            self._exported = {int(t): weight[i].to(self._weight.device) for i, t in enumerate(token_ids)}
            log.info("decision head: %d exported FP32 rows from %s", len(token_ids), path)

    def rows(self, label_ids: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        with self._lock:
            cached = self._rows.get(label_ids)
            if cached is None:
                index = torch.tensor(label_ids, device=self._weight.device)
                weight = self._weight.detach().index_select(0, index).to(torch.float32).clone()
                for i, token in enumerate(label_ids):
                    if token in self._exported:
                        weight[i] = self._exported[token]
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
