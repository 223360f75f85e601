"""Reading a checkpoint's files without executing anything in them, shared by the worker and the preencoder,
and the one error that says a service cannot serve its recipe (never an HTTP answer: the service exits or
reports it in /health)."""

from __future__ import annotations

import json
import os
from typing import Any


class ServingError(RuntimeError):
    """The recipe's serving cannot start: unknown backend or readout, or the checkpoint lacks what it needs."""


def read_json(path: str) -> object:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def load_torch_state(path: str) -> dict[str, Any]:
    """A torch pickle of tensors only (`weights_only=True`): a pickle that needs code is refused."""
    import pickle

    import torch

    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError) as exc:
        raise ServingError(
            f"{os.path.basename(path)} is not a plain tensor state (torch.load(weights_only=True) refused it): {exc}"
        ) from None
    if not isinstance(state, dict):
        raise ServingError(f"{os.path.basename(path)} holds {type(state).__name__}, not a state dict of tensors")
    return state
