"""scalar-head: Open-Jev's trained FP32 scalar head, one scalar per candidate row (candidates.py), over
the saved calibration temperature.

Checkpoint (an export of `package/checkpoint`: merged backbone + the head and calibration files copied
beside it): `head.pt`, an `nn.Linear(hidden, 1)` state dict (`weight` [1, hidden], `bias` [1]) read with
`torch.load(weights_only=True)`, and `calibration.json` with `temperature`. The head reads the final
hidden state of each candidate row's last token. File names: serving.options head_file / calibration_file.
"""
from __future__ import annotations

import os

import torch

from ...protocols import Head, Readout
from ...readouts.base import Requirement, ServingError, load_torch_state, read_json
from ...readouts.calibration import Calibration
from .candidates import CANDIDATE, NOUL, NOUL_CRITERIA, CandidateChoice, CandidateNoul, CandidateScore
from ...readouts.code_readout import hidden_size


class LinearScalarHead(Head):
    """s = h_last(FP32) @ w(FP32) + b: one logit per row (labels unused)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor):
        self.weight = weight.to(torch.float32)
        self.bias = bias.to(torch.float32)

    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        return hidden.to(torch.float32) @ self.weight.T + self.bias


class ScalarHead(Readout):
    """On the causal-lm backend with the recipe's chat template (the protocol's defaults)."""

    name = "scalar-head"
    question_types = frozenset({"choice", "score", "noul"})

    def known_options(self) -> dict:
        return {"head_file": "head.pt", "calibration_file": "calibration.json", "candidate": CANDIDATE,
                "noul": NOUL, "noul_criteria": NOUL_CRITERIA}

    def requirements(self) -> list[Requirement]:
        return [Requirement(self.option("head_file"), ("weight", "bias")),
                Requirement(self.option("calibration_file"), ("temperature",))]

    def load(self, loaded, builder) -> None:
        state = load_torch_state(os.path.join(loaded.folder, self.option("head_file")))
        hidden = hidden_size(loaded.model)
        weight, bias = state["weight"], state["bias"]
        if tuple(weight.shape) != (1, hidden) or tuple(bias.shape) != (1,):
            raise ServingError(f"{self.option('head_file')}: weight {list(weight.shape)} / bias {list(bias.shape)}, "
                               f"expected [1, {hidden}] / [1] (a Linear(hidden, 1))")
        self.head = LinearScalarHead(weight.to(loaded.device), bias.to(loaded.device))
        calibration_file = self.option("calibration_file")
        config = read_json(os.path.join(loaded.folder, calibration_file))
        calibration = Calibration.from_config({"temperature": config["temperature"]}, calibration_file)
        self.serve([CandidateChoice(self.option("candidate")), CandidateScore(self.option("candidate")),
                    CandidateNoul(self.option("noul"), self.option("noul_criteria"))], calibration)
