"""Calibration from the checkpoint's own config: a temperature (and for yes/no a log-odds bias) per type.

Read from a JSON file of the checkpoint (`decision_config.json` by default; Open-Jev's `calibration.json`):
`temperature` (every type), `temperatures` or `temperature_by_type` {type: T} (wins for its type; the name
StartLux's and Decider's releases use), `biases` {type: b} and `position_prior` (PriDe's prior over option positions,
questions/position_prior.py: the request's x_coherence `prior`).
For a type, FP32 logits become `(logits + b * e0) / T`: the bias moves the first label's logit (noul's
Yes: its log-odds) before the temperature. `set` falls back to noul's values, `span` to choice's.
Every readout applies it the same way (CalibratedKind); /health reports what was loaded.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from ..protocols import QuestionKind
from ..questions.position_prior import PositionPrior

FALLBACK = {"set": "noul", "span": "choice"}
TYPES = ("noul", "choice", "score", "span", "set")


@dataclass(frozen=True)
class Calibration:
    temperatures: dict[str, float] = field(default_factory=dict)
    biases: dict[str, float] = field(default_factory=dict)
    source: str | None = None
    position_prior: PositionPrior | None = None
    position_prior_unused: str | None = None  # why a prior that was found is not applied (it fits another model)

    @classmethod
    def from_config(cls, config: dict, source: str) -> Calibration:
        from jev_common.checkpoint_files import ServingError

        def number(value, what: str, positive: bool) -> float:
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or (positive and value <= 0)
            ):
                raise ServingError(
                    f"{source}: {what} must be a {'positive ' if positive else ''}finite number, got {value!r}"
                )
            return float(value)

        temperatures = {}
        if "temperature" in config:
            temperatures = dict.fromkeys(TYPES, number(config["temperature"], "temperature", True))
        for key in ("temperatures", "temperature_by_type"):
            for type_, value in (config.get(key) or {}).items():
                temperatures[type_] = number(value, f"{key}.{type_}", True)
        biases = {
            type_: number(value, f"biases.{type_}", False) for type_, value in (config.get("biases") or {}).items()
        }
        unknown = sorted((set(temperatures) | set(biases)) - set(TYPES))
        if unknown:
            raise ServingError(f"{source}: calibration for unknown question type(s) {', '.join(unknown)}")
        prior = (
            PositionPrior.from_config(config["position_prior"], f"{source} position_prior")
            if "position_prior" in config
            else None
        )
        return cls(temperatures, biases, source, prior)

    def fit_prior(self, kept_apart: PositionPrior | None, checkpoint: str, layout: str) -> Calibration:
        """This calibration with the position prior that fits what is served: its own (the checkpoint's file, which
        travels with the weights) first, else `kept_apart` (a recipe's file, for a checkpoint folder that cannot be
        written), which must also name the served `checkpoint`; both must match the `layout` digest. A prior that
        does not fit is not applied, and describe() says why."""
        from dataclasses import replace

        notes = []
        for prior, identity in ((self.position_prior, None), (kept_apart, checkpoint)):
            if prior is None:
                continue
            why = prior.mismatch(identity, layout)
            if why is None:
                return replace(self, position_prior=prior, position_prior_unused=None)
            notes.append(f"{prior.source}: not applied, {why}")
        return replace(self, position_prior=None, position_prior_unused="; ".join(notes) or None)

    @classmethod
    def from_file(cls, folder: str, name: str) -> Calibration:
        """The calibration in `folder/name`, or none when the checkpoint has no such file."""
        from jev_common.checkpoint_files import read_json

        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            return cls()
        config = read_json(path)
        return cls.from_config(config if isinstance(config, dict) else {}, name)

    def _value(self, table: dict[str, float], type_: str, default: float) -> float:
        if type_ in table:
            return table[type_]
        return table.get(FALLBACK.get(type_, type_), default)

    def apply(self, type_: str, logits: torch.Tensor) -> torch.Tensor:
        temperature = self._value(self.temperatures, type_, 1.0)
        bias = self._value(self.biases, type_, 0.0)
        if temperature == 1.0 and bias == 0.0:
            return logits
        logits = logits.to(torch.float32).clone()
        logits[0] += bias
        return logits / temperature

    def describe_type(self, type_: str) -> dict:
        """The temperature and bias a question of `type_` gets."""
        return {"temperature": self._value(self.temperatures, type_, 1.0), "bias": self._value(self.biases, type_, 0.0)}

    def describe(self) -> dict:
        out = {"source": self.source, "temperatures": dict(self.temperatures), "biases": dict(self.biases)}
        if self.position_prior is not None or self.position_prior_unused is not None:
            out["position_prior"] = (
                self.position_prior.describe()
                if self.position_prior is not None
                else {"unused": self.position_prior_unused}
            )
        return out


class CalibratedKind(QuestionKind):
    """A question type whose row logits are calibrated before its answer is computed."""

    def __init__(self, kind: QuestionKind, calibration: Calibration):
        self.kind = kind
        self.type = kind.type
        self.min_options = kind.min_options
        self.coherence_modes = kind.coherence_modes
        self.position_free = kind.position_free
        self.coherence_note = kind.coherence_note
        self.calibration = calibration

    def refuses(self, question, mode: str) -> str | None:
        return self.kind.refuses(question, mode)

    def rows(self, question, ctx, where: str):
        return self.kind.rows(question, ctx, where)

    def answer(self, question, logits, ctx):
        return self.kind.answer(question, [self.calibration.apply(self.type, row) for row in logits], ctx)
