"""What every readout is: what it needs from the checkpoint, its projection, its question types.

A readout declares its checkpoint requirements (`requirements`); `check` verifies them before the
model is loaded, so a checkpoint that lacks a file or tensor stops the worker with a message naming
it. `load` builds the FP32 projection (`head.logits(hidden, labels)`, what the engine calls on each
row's last hidden state) and the question types it answers (`kinds`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from jev_common.checkpoint_files import ServingError, load_torch_state, read_json  # noqa: F401 - re-exported

from .calibration import Calibration, CalibratedKind


@dataclass(frozen=True)
class Requirement:
    """A file the checkpoint folder must hold, and the keys (tensor names or JSON fields) it must have."""

    file: str
    keys: tuple[str, ...] = ()

    def check(self, folder: str, readout: str) -> None:
        path = os.path.join(folder, self.file)
        if not os.path.isfile(path):
            raise ServingError(f"readout {readout!r} needs {self.file} in the checkpoint folder {folder}; it is missing")
        missing = [key for key in self.keys if key not in file_keys(path)]
        if missing:
            raise ServingError(f"readout {readout!r}: {self.file} has no {', '.join(map(repr, missing))} "
                               f"(in {folder})")


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
        raise ServingError(f"{source}: the tensors do not fit {fits} (missing {missing[:3]}, unexpected {unexpected[:3]})")


@dataclass
class Readout:
    """Base of every readout; a subclass sets `name`, `question_types` and implements `load`."""

    options: dict = field(default_factory=dict)
    name = "readout"
    question_types = frozenset()
    needs_lm_head = False          # load the checkpoint with its LM head (AutoModelForCausalLM)
    single_question_form = False   # answers the JEV-VL `kind` form too (label-token rows only)
    head: object = None
    calibration: Calibration = field(default_factory=Calibration)
    kinds: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(self.known_options()))
        if unknown:
            raise ServingError(f"readout {self.name!r} has no option(s) {', '.join(unknown)}; "
                               f"known: {', '.join(sorted(self.known_options())) or 'none'}")

    def known_options(self) -> dict:
        return {}

    def option(self, key: str):
        return self.options.get(key, self.known_options()[key])

    def requirements(self) -> list[Requirement]:
        return []

    def check(self, folder: str) -> None:
        for requirement in self.requirements():
            requirement.check(folder, self.name)

    def load(self, loaded, builder) -> None:
        raise NotImplementedError

    def serve(self, kinds: list, calibration: Calibration) -> None:
        """Answer `kinds` (question-type objects), each calibrated; called at the end of `load`."""
        self.calibration = calibration
        self.kinds = {kind.type: CalibratedKind(kind, calibration) for kind in kinds}
        assert set(self.kinds) == set(self.question_types), (self.name, sorted(self.kinds))

    def describe(self) -> dict:
        return {"readout": self.name, "question_types": sorted(self.question_types),
                "calibration": self.calibration.describe()}
