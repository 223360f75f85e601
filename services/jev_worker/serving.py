"""A recipe's serving: the family's readout (families/registry.py), the backend the readout chooses, and the
checkpoint folder both were checked against, before any weight is read.

    resolve the folder -> the package gate -> readout.check(folder) -> backend = readout.make_backend()
    -> backend.check(recipe);  then  backend.load(recipe, folder, ...)  (Serving.load)

An external readout (CLM) has no local checkpoint: its backend is checked against the recipe only.
"""

from __future__ import annotations

from dataclasses import dataclass

from jev_common.checkpoint_files import ServingError
from jev_common.recipe import Recipe

from .families.registry import build_readout, family_class
from .loading.loader import LoadedModel, ModelNotAvailable, resolve_checkpoint
from .loading.package_gate import check_remote_code
from .protocols import Backend, Readout
from .readouts.standard import ExternalReadout


@dataclass
class Serving:
    recipe: Recipe
    readout: Readout
    backend: Backend
    folder: str | None = None  # the checked checkpoint folder (None for an external backend)

    def load(self, device: str, dtype: str) -> LoadedModel:
        """The checked checkpoint, loaded by the backend the readout chose."""
        if self.folder is None:
            raise ServingError(f"backend {self.backend.name!r} runs no local checkpoint")
        return self.backend.load(self.recipe, self.folder, device, dtype, lm_head=self.readout.needs_lm_head)

    def describe(self) -> dict:
        return {"family": self.recipe.serving.family, **self.backend.describe(), **self.readout.describe()}


def serves_externally(recipe: Recipe) -> bool:
    """Whether the recipe's family is answered by an external server (an unknown family: no; start says why)."""
    try:
        return issubclass(family_class(recipe.serving.family), ExternalReadout)
    except ServingError:
        return False


def build_serving(recipe: Recipe, model_path: str | None = None) -> Serving:
    """The recipe's readout and backend, checked against its checkpoint (ServingError naming what is missing,
    ModelNotAvailable when the checkpoint is not on this machine)."""
    readout = build_readout(recipe.serving.family, recipe.serving.options)
    folder = None
    if not isinstance(readout, ExternalReadout):
        folder = resolve_checkpoint(recipe, model_path)
        check_remote_code(recipe, folder)  # the checkpoint's own code passes the package gate first
        readout.check(folder)
    backend = readout.make_backend()
    backend.check(recipe)
    return Serving(recipe, readout, backend, folder)


def preflight(recipe: Recipe, model_path: str | None) -> None:
    """Before serving: the recipe's family exists and its checkpoint has what the readout and its backend
    need (raises ServingError naming what is missing). A checkpoint not on this machine is left to the
    worker's health, which says how to get it."""
    try:
        build_serving(recipe, model_path)
    except ModelNotAvailable:
        return
