"""The values the worker's protocols (protocols.py) name: a loaded checkpoint, a prepared prompt and its rows, a
job, a batch's items, groups and output, a prefix state and its cache match, a calibration. Plain data; this module
imports nothing of the worker but the position prior a calibration carries, so protocols.py can import it without a
cycle."""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from .position_prior import PositionPrior


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Any
    processor: Any
    device: torch.device
    dtype: torch.dtype
    folder: str


@dataclass(frozen=True)
class RowSpec:
    """One forward row: the text after the state block, and the label tokens read at its end; `after`
    follows the template's tail (text the model's own answer turn starts with, e.g. option blocks)."""

    content: str
    labels: tuple[int, ...]
    after: str = ""


@dataclass(frozen=True)
class PreparedRequest:
    prefix_ids: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    row_labels: tuple[tuple[int, ...], ...]
    image_keys: tuple[str, ...]
    prefix_key: str
    plan: Any = None  # what turns the rows' logits into answers (the caller's, opaque here)
    boundary_mismatch: bool = field(default=False, compare=False)

    @property
    def prompt_tokens(self) -> int:
        return len(self.prefix_ids) + sum(len(r) for r in self.rows)

    @cached_property
    def work_key(self) -> str:
        """What computing it means: its prefix key (checkpoint, images, prefix ids), rows and their labels. Requests
        with the same work key share one computation (the scheduler's single flight); a prepared request taken from
        L1 computes it once."""
        digest = hashlib.sha256(self.prefix_key.encode())
        digest.update(repr((self.rows, self.row_labels)).encode())
        return digest.hexdigest()

    @property
    def nbytes(self) -> int:
        return 8 * self.prompt_tokens + 256

    def full_ids(self, row: int) -> tuple[int, ...]:
        return self.prefix_ids + self.rows[row]


def layer_tensors(layer: Any) -> Iterator[tuple[Any, Any, torch.Tensor]]:
    """(owner, key, tensor) for every batch-major tensor a cache layer holds, directly or in a dict."""
    for name, value in vars(layer).items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            yield vars(layer), name, value
        elif isinstance(value, dict):
            for key, tensor in value.items():
                if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
                    yield value, key, tensor


@dataclass
class PrefixState:
    """The state of a prompt prefix (batch 1), plus what positions after it need."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    length: int
    rope_delta: int = 0
    snapshot: Any = None

    @property
    def nbytes(self) -> int:
        if self.snapshot is not None:
            return sum(
                t.numel() * t.element_size() for layer in self.snapshot.layers for _, _, t in layer_tensors(layer)
            )
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


@dataclass(frozen=True)
class Match:
    """A prefix key's lookup: the state to start from (a hit), or why there is none."""

    state: PrefixState | None
    outcome: str  # hit | miss (compute it and insert) | bypass (cached, but recomputing pays) | off

    @property
    def store(self) -> bool:
        return self.outcome == "miss"


@dataclass
class EngineItem:
    prepared: PreparedRequest
    assets: list[Any] = field(default_factory=list)  # parsed image assets, in prompt order


@dataclass(frozen=True)
class BatchTiming:
    """When a job's batch ran (time.perf_counter()), and how long of that the device took (`device_s`: a simulated
    device's seconds for the batch; None on a real device)."""

    queued: float  # the job entered the queue
    started: float  # its batch began on the model thread
    finished: float
    device_s: float | None = None
    requests: int = 0  # the batch's size: its jobs, and their rows
    rows: int = 0


@dataclass
class EngineResult:
    row_logits: list[torch.Tensor]  # FP32 label logits, one tensor per row
    cached_tokens: int  # prefix tokens the rows continued from a state instead of computing
    l3: str = "off"  # hit | miss | bypass | off: the scheduler's, from its prefix-cache match
    timing: BatchTiming | None = None  # the scheduler's


@dataclass
class PrefixGroup:
    """The batch's items that share one prefix key, and the scheduler's plan for that prefix: a cached state the
    rows continue (`start`), whether the state computed now is handed back for the cache (`keep`), and whether the
    runner may compute the prefix once and branch the rows from it (`branch`: not where recomputing the prefix in
    each row's own forward pays)."""

    key: str
    indices: list[int]  # positions in the batch's items, in order
    start: PrefixState | None = None
    keep: bool = False
    branch: bool = True


@dataclass
class BatchOutput:
    results: list[EngineResult]
    states: dict[str, PrefixState] = field(default_factory=dict)  # computed for the groups the plan keeps
    device_s: float | None = None  # a simulated device's seconds for this batch
    # the batch's device event, where its forwards were launched and not yet done (CUDA, the simulated device):
    # waiting on it is the batch's sync, done off the model thread so that the next batch launches meanwhile
    ready: Callable[[], None] | None = None


@dataclass(frozen=True)
class ImageSlot:
    key: str  # sha256 of the image bytes: the preencoder's asset name


@dataclass(frozen=True)
class Job:
    """One request, whatever its form: what the pipeline needs to answer it."""

    questions: dict[str, Any]  # question id -> question (System One types, or the form's own kinds)
    state: Any  # the state as sent (span candidates are located in it)
    pieces: tuple[str | ImageSlot, ...]  # the rendered state: text pieces and ImageSlots, in prompt order
    where: str  # where the state's text is in the request (error messages)
    route_text: str  # the rendered state as sent, for the route key (jev_common.route_key)
    route_images: tuple[str, ...]  # its image keys, for the route key
    l1_key: str  # identifies the prompt (the request minus id and deadline)
    extra_kinds: dict[str, Any] = field(default_factory=dict)  # question kinds the form asks beyond the readout's
    request: Any = None  # the parsed request, for strategies that translate it whole
    coherence: str = "off"  # the request's x_coherence (questions/plan.py)
    has_images: bool = False

    @property
    def image_keys(self) -> tuple[str, ...]:
        return tuple(p.key for p in self.pieces if isinstance(p, ImageSlot))

    @property
    def images(self) -> bool:
        return self.has_images or bool(self.image_keys)


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
    def from_config(cls, config: dict[str, Any], source: str) -> Calibration:
        from jev_common.checkpoint_files import ServingError

        def number(value: object, what: str, positive: bool) -> float:
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

    def describe_type(self, type_: str) -> dict[str, float]:
        """The temperature and bias a question of `type_` gets."""
        return {"temperature": self._value(self.temperatures, type_, 1.0), "bias": self._value(self.biases, type_, 0.0)}

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "temperatures": dict(self.temperatures),
            "biases": dict(self.biases),
        }
        if self.position_prior is not None or self.position_prior_unused is not None:
            out["position_prior"] = (
                self.position_prior.describe()
                if self.position_prior is not None
                else {"unused": self.position_prior_unused}
            )
        return out
