"""label-tokens: the LM-head rows of each row's label tokens (option codes, Yes/No, digits), kept in FP32.

The rows are the exact one-pass prompts of questions/ (README: "How answers are computed"); the head
is DecisionHead (LM-head rows, or an export's FP32 `decision_head.safetensors`). Calibration from the
checkpoint's `decision_config.json` when it ships one (Decider, StartLux, JEMM, JEV exports). The position
prior of x_coherence `prior` (values/position_prior.py) from that file's `position_prior` block, or from the
file the recipe names beside its recipe.yaml (`serving.options.position_prior_file`, for a checkpoint folder that
cannot be written, such as the embedded model's package), applied only when it was estimated on the checkpoint and
layout served.
"""

from __future__ import annotations

import os
from dataclasses import replace

from jev_common.checkpoint_files import ServingError, read_json

from ..engine.head import DecisionHead
from ..loading.checkpoint import Requirement
from ..questions.registry import QUESTION_KINDS
from ..values.position_prior import PositionPrior, layout_digest
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
        # position_prior_file: a JSON file beside the recipe's recipe.yaml with a `position_prior` block
        return {"calibration_file": "decision_config.json", "calibration_required": False, "position_prior_file": None}

    def requirements(self) -> list[Requirement]:
        return [Requirement(self.option("calibration_file"))] if self.option("calibration_required") else []

    def load(self, loaded, builder) -> None:
        self.head = DecisionHead(loaded.model, loaded.folder)
        calibration = Calibration.from_file(loaded.folder, self.option("calibration_file"))
        prior, missing = self.recipe_prior(builder.recipe)
        calibration = calibration.fit_prior(
            prior, builder.identity, layout_digest(self.name, builder.recipe, calibration)
        )
        if missing and calibration.position_prior is None:
            calibration = replace(calibration, position_prior_unused=missing)
        self.serve(list(QUESTION_KINDS.values()), calibration)

    def recipe_prior(self, recipe) -> tuple[PositionPrior | None, str | None]:
        """The position prior in the file the recipe names beside its recipe.yaml (None when it names none), or
        why there is none: a named file not computed yet leaves `prior` unoffered, it does not stop the worker
        (tools.calibrate_prior loads this very worker to compute it)."""
        name = self.option("position_prior_file")
        if name is None:
            return None, None
        if not isinstance(name, str) or recipe.folder is None:
            raise ServingError(
                f"recipe {recipe.name}: serving.options.position_prior_file must name a file beside its recipe.yaml"
            )
        path = os.path.join(recipe.folder, name)
        source = f"recipes/{recipe.folder.name}/{name}"
        if not os.path.isfile(path):
            return None, f"{source}: no such file (compute it with python -m tools.calibrate_prior)"
        config = read_json(path)
        return PositionPrior.from_config(
            config.get("position_prior") if isinstance(config, dict) else None, source
        ), None
