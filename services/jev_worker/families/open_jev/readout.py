"""scalar-head: Open-Jev's trained FP32 scalar head, one scalar per candidate row (candidates.py, layout.py),
over the saved temperature; on the causal-lm backend.

Checkpoint (recipes/open-jev-*/export.py: the base with the `package/checkpoint/adapter` LoRA merged, and
`package/checkpoint`'s `head.pt`, `temperature.json` and `model.json` copied beside it): `head.pt` is an
`nn.Linear(hidden, 1)` state dict (`weight` [1, hidden], `bias` [1]) read with `torch.load(weights_only=True)`,
`temperature.json` holds `{"temperature": T}`. The head reads the final hidden state of each candidate's last
token (the `\\n\\n` after `</think>`) in FP32: s = h @ w.T + b, then s / T. Options (recipe `serving.options`):
`head_file`, `calibration_file` (the files' names) and `max_length` (tokens per candidate, 4096).
"""

from __future__ import annotations

import os

import torch

from jev_common.checkpoint_files import ServingError, load_torch_state, read_json

from ...loading.checkpoint import Requirement
from ...protocols import Head
from ...readouts.calibration import Calibration
from ...readouts.code_readout import hidden_size
from ...readouts.standard import StandardReadout
from .candidates import CandidateChoice, CandidateNoul, CandidateScore
from .layout import MAX_LENGTH, OpenJevBuilder


class LinearScalarHead(Head):
    """s = h_last(FP32) @ w(FP32) + b: one logit per row (labels unused)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        self.weight = weight.to(torch.float32)
        self.bias = bias.to(torch.float32)

    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        return hidden.to(torch.float32) @ self.weight.T + self.bias


class ScalarHead(StandardReadout):
    """On the causal-lm backend (the protocol's default), with Open-Jev's own prompt layout."""

    name = "scalar-head"
    question_types = frozenset({"choice", "score", "noul"})

    def known_options(self) -> dict:
        return {"head_file": "head.pt", "calibration_file": "temperature.json", "max_length": MAX_LENGTH}

    def requirements(self) -> list[Requirement]:
        return [
            Requirement(self.option("head_file"), ("weight", "bias")),
            Requirement(self.option("calibration_file"), ("temperature",)),
        ]

    def prompt_builder(self, tokenizer, recipe, identity: str) -> OpenJevBuilder:
        limit = self.option("max_length")
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ServingError(
                f"readout {self.name!r}: serving.options.max_length must be a positive integer, got {limit!r}"
            )
        return OpenJevBuilder(tokenizer, recipe, identity, max_length=limit)

    def load(self, loaded, builder) -> None:
        state = load_torch_state(os.path.join(loaded.folder, self.option("head_file")))
        hidden = hidden_size(loaded.model)
        weight, bias = state["weight"], state["bias"]
        if tuple(weight.shape) != (1, hidden) or tuple(bias.shape) != (1,):
            raise ServingError(
                f"{self.option('head_file')}: weight {list(weight.shape)} / bias {list(bias.shape)}, "
                f"expected [1, {hidden}] / [1] (a Linear(hidden, 1))"
            )
        self.head = LinearScalarHead(weight.to(loaded.device), bias.to(loaded.device))
        calibration_file = self.option("calibration_file")
        config = read_json(os.path.join(loaded.folder, calibration_file))
        calibration = Calibration.from_config({"temperature": config["temperature"]}, calibration_file)
        self.serve([CandidateChoice(), CandidateScore(), CandidateNoul()], calibration)

    def describe(self) -> dict:
        return {**super().describe(), "max_length": self.option("max_length")}
