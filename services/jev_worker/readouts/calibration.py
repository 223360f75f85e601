"""Calibration from the checkpoint's own config: a temperature (and for yes/no a log-odds bias) per type.

Read from a JSON file of the checkpoint (`decision_config.json` by default; Open-Jev's `calibration.json`):
`temperature` (every type), `temperatures` or `temperature_by_type` {type: T} (wins for its type; the name
StartLux's and Decider's releases use), `biases` {type: b} and `position_prior` (PriDe's prior over option positions,
values/position_prior.py: the request's x_coherence `prior`).
For a type, FP32 logits become `(logits + b * e0) / T`: the bias moves the first label's logit (noul's
Yes: its log-odds) before the temperature. `set` falls back to noul's values, `span` to choice's.
Every readout applies it the same way (CalibratedKind); /health reports what was loaded.
"""

from __future__ import annotations

from ..protocols import QuestionKind
from ..values.datatypes import (
    FALLBACK as FALLBACK,  # declared below the protocols
    TYPES as TYPES,
    Calibration as Calibration,
)


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
