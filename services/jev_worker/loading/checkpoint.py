"""What readouts check a checkpoint with (the Readout protocol itself is protocols.Readout).

A readout declares its checkpoint requirements (`requirements`, a list of Requirement); `check` verifies
them before the model is loaded, so a checkpoint that lacks a file or tensor stops the worker with a message
naming it. `load_exactly` is the one strict tensor load that names the file and what the tensors must fit.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from jev_common.checkpoint_files import ServingError, load_torch_state, read_json


@dataclass(frozen=True)
class Requirement:
    """A file the checkpoint folder must hold, and the keys (tensor names or JSON fields) it must have."""

    file: str
    keys: tuple[str, ...] = ()

    def check(self, folder: str, readout: str) -> None:
        require_files(folder, (self.file,), f"readout {readout!r}")
        missing = [key for key in self.keys if key not in file_keys(os.path.join(folder, self.file))]
        if missing:
            raise ServingError(f"readout {readout!r}: {self.file} has no {', '.join(map(repr, missing))} (in {folder})")


def require_files(folder: str, names, who: str) -> None:
    """Each of `names` is a file in `folder`, else ServingError naming the first missing one and `who` needs it."""
    for name in names:
        if not os.path.isfile(os.path.join(folder, name)):
            raise ServingError(f"{who} needs {name} in the checkpoint folder {folder}; it is missing")


def file_keys(path: str) -> set[str]:
    """Tensor names of a safetensors file or torch state dict, or the top-level fields of a JSON object."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as handle:
            return set(handle.keys())
    if path.endswith(".json"):
        value = read_json(path)
        return set(value) if isinstance(value, dict) else set()
    return set(load_torch_state(path))


def load_exactly(module, state: dict, *, source: str, fits: str) -> None:
    """`module` takes exactly `state`'s tensors; a missing or unexpected one stops the worker naming the file
    (`source`) and what they should fit (`fits`)."""
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ServingError(
            f"{source}: the tensors do not fit {fits} (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
