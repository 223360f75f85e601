"""A recipe's serving, built from the registries: its backend (runs the network) and its readout (turns
the outputs into typed answers), checked against the checkpoint before the model is loaded."""
from __future__ import annotations

from dataclasses import dataclass

from jev_common.recipe import Recipe

from .backends.registry import build_backend
from .package_gate import check_remote_code
from .readouts.base import Readout, ServingError
from .readouts.registry import build_readout


@dataclass
class Serving:
    backend: object
    readout: Readout
    recipe: Recipe | None = None

    def check_checkpoint(self, folder: str) -> None:
        """Everything the readout needs is in `folder`, and the checkpoint's attention fits the backend; code
        the checkpoint ships passes the package gate first (package_gate.py)."""
        if self.recipe is not None:
            check_remote_code(self.recipe, folder)
        self.readout.check(folder)
        wanted = getattr(self.readout, "backend", None)
        if wanted is not None and wanted != self.backend.name:
            raise ServingError(f"the checkpoint's attention mode ({getattr(self.readout, 'attention_mode', '?')}) "
                               f"needs serving.backend {wanted!r}; the recipe names {self.backend.name!r}")

    def describe(self) -> dict:
        return {**self.backend.describe(), **self.readout.describe()}


def build_serving(recipe: Recipe) -> Serving:
    backend = build_backend(recipe.serving.backend)
    readout = build_readout(recipe.serving.readout, recipe.serving.options)
    backend.check(recipe)
    return Serving(backend, readout, recipe)


def preflight(recipe: Recipe, model_path: str | None) -> None:
    """Before serving: the recipe's backend and readout exist and its checkpoint has what the readout
    needs (raises ServingError naming what is missing). A checkpoint not on this machine is left to
    the worker's health, which says how to get it."""
    from .loader import ModelNotAvailable, resolve_checkpoint

    serving = build_serving(recipe)
    try:
        folder = resolve_checkpoint(recipe, model_path)
    except ModelNotAvailable:
        return
    serving.check_checkpoint(folder)
