"""Vela 2.0 0.3B's marker head (the packages' `_Vela2Forward.heads`) in FP32, from the tensors the release keeps
beside `encoder.*` in `model.safetensors`: `norm` (one LayerNorm shared by every branch), `w_o`, `w_q`, `w_p`,
`w_t`, `w_e` (Linear hidden -> proj_dim, with bias), `log_tau`, `log_tau_span` and, for config `readout` mlp or
both, `cls_mlp` (Linear(H, 2H) -> ReLU -> dropout slot 2 -> Linear(2H, 1)).

Sources (reference only): vLLM-SR's `MarkerHead` (`vllm_srun/heads/marker.py`) and a Swift port of
`_Vela2Forward.heads` (`Vela2Heads.run`). LN is `norm`, eps 1e-5; normalize is L2 (eps 1e-12).
  option logit  = normalize(w_o LN(h[O]) + w_q LN(h[Q])) . normalize(w_p LN(mean h[pool])) / exp(log_tau)
                  (readout cosine | both)  +  cls_mlp(h[O]) on the raw state (readout mlp | both)
  span logits   = normalize(w_t LN(h[word start])) . normalize(w_e LN(h[E]))^T / exp(log_tau_span)   [W, E]
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from jev_common.checkpoint_files import ServingError

from ...protocols import Head
from .marker_layout import SequenceReadout

PROJECTIONS = ("w_o", "w_q", "w_p", "w_t", "w_e")
MLP = ("cls_mlp.0.weight", "cls_mlp.0.bias", "cls_mlp.3.weight", "cls_mlp.3.bias")
READOUTS = ("cosine", "mlp", "both")


def tensor_names(readout: str) -> tuple[str, ...]:
    """The head tensors a package with config `readout` ships."""
    names = (
        "norm.weight",
        "norm.bias",
        *(f"{p}.{k}" for p in PROJECTIONS for k in ("weight", "bias")),
        "log_tau",
        "log_tau_span",
    )
    return names + (MLP if readout in ("mlp", "both") else ())


def expected_shapes(readout: str, hidden: int, projection: int) -> dict[str, tuple[int, ...]]:
    shapes = {"norm.weight": (hidden,), "norm.bias": (hidden,), "log_tau": (), "log_tau_span": ()}
    for p in PROJECTIONS:
        shapes.update({f"{p}.weight": (projection, hidden), f"{p}.bias": (projection,)})
    if readout in ("mlp", "both"):
        shapes.update(
            {
                "cls_mlp.0.weight": (2 * hidden, hidden),
                "cls_mlp.0.bias": (2 * hidden,),
                "cls_mlp.3.weight": (1, 2 * hidden),
                "cls_mlp.3.bias": (1,),
            }
        )
    return shapes


class VelaMarkerHead(Head):
    def __init__(self, tensors: dict, *, readout: str, hidden: int, projection: int, source: str):
        if readout not in READOUTS:
            raise ServingError(f"config.json readout must be one of {', '.join(READOUTS)}, got {readout!r}")
        self.readout = readout
        self.t = {}
        for name, shape in expected_shapes(readout, hidden, projection).items():
            if name not in tensors:
                raise ServingError(f"{source} has no {name!r} (the 0.3B's marker head)")
            value = tensors[name].to(torch.float32)
            if value.numel() != math.prod(shape) or (shape and tuple(value.shape) != shape):
                raise ServingError(
                    f"{source}: {name} is {list(value.shape)}, expected {list(shape)} (hidden "
                    f"{hidden}, proj_dim {projection})"
                )
            self.t[name] = value.reshape(shape)
        self.hidden = hidden

    def to(self, device) -> VelaMarkerHead:
        self.t = {name: value.to(device) for name, value in self.t.items()}
        return self

    def _ln(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (self.hidden,), self.t["norm.weight"], self.t["norm.bias"], 1e-5)

    def _project(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.t[f"{name}.weight"], self.t[f"{name}.bias"])

    def options(self, states: torch.Tensor, query: int, pool: tuple[int, int], markers: list[int]) -> torch.Tensor:
        """One question's logits, one per [O] / [ABS] marker in order."""
        options = states[markers]
        logits = torch.zeros(len(markers), dtype=torch.float32, device=states.device)
        if self.readout in ("cosine", "both"):
            part = F.normalize(self._project("w_p", self._ln(states[pool[0] : pool[1]].mean(0))), dim=-1)
            question = self._project("w_q", self._ln(states[query]))
            option = F.normalize(self._project("w_o", self._ln(options)) + question, dim=-1)
            logits = logits + (option * part).sum(-1) / self.t["log_tau"].exp()
        if self.readout in ("mlp", "both"):
            inner = F.relu(F.linear(options, self.t["cls_mlp.0.weight"], self.t["cls_mlp.0.bias"]))
            logits = logits + F.linear(inner, self.t["cls_mlp.3.weight"], self.t["cls_mlp.3.bias"]).squeeze(-1)
        return logits

    def span(self, states: torch.Tensor, words: list[int], labels: list[int]) -> torch.Tensor:
        word = F.normalize(self._project("w_t", self._ln(states[words])), dim=-1)
        label = F.normalize(self._project("w_e", self._ln(states[labels])), dim=-1)
        return word @ label.T / self.t["log_tau_span"].exp()

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> list[torch.Tensor]:
        """A sequence's readouts from its hidden states [L, H]: each question's option logits, then the span
        question's word x label logits [W, E] when it holds one."""
        states = hidden.to(torch.float32)
        read = SequenceReadout.from_labels(labels)
        out = [
            self.options(states, query, (start, end), list(markers)).cpu()
            for query, start, end, markers in read.questions
        ]
        if read.labels:
            out.append(self.span(states, list(read.words), list(read.labels)).cpu())
        return out
