"""JEV-VL's label head: the merged LM-head rows of the readout's tokens in FP32, logits in FP64 as the native
executor computes them (`Σ row_f32[i] · h_f32[i]` in f64)."""

from __future__ import annotations

import logging
import os

import torch

from jev_common.checkpoint_files import ServingError

from ...engine.head import DecisionHead
from .contract import LABEL_HEAD

log = logging.getLogger("jev.worker.jev_vl")


class LabelHead(DecisionHead):
    """Rows from the export's `label_head.safetensors` (export_merged.py's layout: `rows` F32 [n, hidden],
    `ids` I64 [n]: the LoRA merged in FP32, never rounded to BF16) when the checkpoint folder holds it, which
    must then hold every token the readout reads (`needed`); else the LM head's rows, read in FP32."""

    def __init__(self, model: torch.nn.Module, folder: str, needed: list[int]):
        super().__init__(model, folder)
        self.source = "lm_head"
        path = os.path.join(folder, LABEL_HEAD)
        if os.path.isfile(path):
            from safetensors.torch import load_file

            tensors = load_file(path)
            rows, ids = tensors.get("rows"), tensors.get("ids")
            hidden = self._weight.shape[1]
            if (
                rows is None
                or ids is None
                or rows.dtype != torch.float32
                or ids.dtype != torch.int64
                or rows.shape != (ids.shape[0], hidden)
            ):
                raise ServingError(f"{path}: needs `rows` float32 [n, {hidden}] and `ids` int64 [n]")
            self._exported = {int(t): rows[i].to(self._weight.device) for i, t in enumerate(ids.tolist())}
            missing = sorted(set(needed) - set(self._exported))
            if missing:
                raise ServingError(f"{path} has no row for token(s) {missing[:8]} that the readout reads")
            self.source = LABEL_HEAD
            log.info("label head: %d merged FP32 rows from %s", len(self._exported), path)

    def logits(self, hidden: torch.Tensor, label_ids: tuple[int, ...]) -> torch.Tensor:
        weight, _ = self.rows(label_ids)
        return hidden.to(torch.float64) @ weight.to(torch.float64).T
