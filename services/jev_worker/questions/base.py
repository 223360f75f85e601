"""What every question type is given: the context its rows are built in and its answer is computed in.

A question type is one module with one `protocols.QuestionKind` subclass; `registry.py` names them.
Logits arrive in FP32 (one tensor per row, over that row's label tokens); answers are computed in FP32.
"""

from __future__ import annotations

import math

import torch

from jev_common.state_text import render_state

from ..protocols import BuildContext as BuildContext  # declared with the question types

render_content = render_state  # the envelope's name for the one state renderer


def probabilities(logits: torch.Tensor) -> list[float]:
    """Softmax over a row's label logits (FP32 values, exact as Python floats), in double precision: for the handful
    of labels a row has, this is a few microseconds where a torch call costs tens on the event loop."""
    values = logits.tolist()
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = math.fsum(weights)
    return [w / total for w in weights]
