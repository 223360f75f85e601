"""label-tokens: the LM-head rows of each row's label tokens (option codes, Yes/No, digits), kept in FP32.

The rows are the exact one-pass prompts of questions/ (README: "How answers are computed"); the head
is DecisionHead (LM-head rows, or an export's FP32 `decision_head.safetensors`). Calibration from the
checkpoint's `decision_config.json` when it ships one (Decider, StartLux, JEMM, JEV exports).
"""
from __future__ import annotations

from ..head import DecisionHead

from ..questions.registry import QUESTION_KINDS
from .base import Requirement
from .calibration import Calibration
from .standard import StandardReadout


class LabelTokens(StandardReadout):
    """On the causal-lm backend (the protocol's default); the recipe's chat template builds the rows."""

    name = "label-tokens"
    question_types = frozenset(QUESTION_KINDS)
    needs_lm_head = True
    single_question_form = True

    def known_options(self) -> dict:
        # calibration_required: the checkpoint must ship its calibration file (a recipe whose model is calibrated)
        return {"calibration_file": "decision_config.json", "calibration_required": False}

    def requirements(self) -> list[Requirement]:
        return [Requirement(self.option("calibration_file"))] if self.option("calibration_required") else []

    def load(self, loaded, builder) -> None:
        self.head = DecisionHead(loaded.model, loaded.folder)
        self.serve(list(QUESTION_KINDS.values()), Calibration.from_file(loaded.folder, self.option("calibration_file")))
