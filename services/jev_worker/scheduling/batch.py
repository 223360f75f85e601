"""What the scheduler hands the runner and gets back: the batch's items (one prepared prompt each), grouped by
prefix key with the scheduler's plan for each prefix, and the results."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..prompt.builder import PreparedRequest
from ..protocols import PrefixCache
from .prefix_cache import PrefixState


@dataclass
class EngineItem:
    prepared: PreparedRequest
    assets: list = field(default_factory=list)  # parsed image assets, in prompt order


@dataclass(frozen=True)
class BatchTiming:
    """When a job's batch ran (time.perf_counter()), and how long of that the device took (`device_s`: a simulated
    device's measured wait; None on a real device, whose forwards the host waits for inside the run)."""

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
    device_s: float | None = None  # a simulated device's wait for this batch


def plan_by_prefix(
    items: list[EngineItem], cache: PrefixCache, reusable: bool
) -> tuple[list[PrefixGroup], dict[str, str]]:
    """The items by prefix key, in first-seen order, each key matched once in the cache and planned from its match
    (a hit's state is continued, a miss's computed state kept, a bypass recomputed in each row's forward); and each
    key's match outcome (hit | miss | bypass | off), which the scheduler reports."""
    indices: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        indices.setdefault(item.prepared.prefix_key, []).append(i)
    groups, outcomes = [], {}
    for key, members in indices.items():
        match = cache.match(key, reusable)
        outcomes[key] = match.outcome
        groups.append(
            PrefixGroup(key, members, start=match.state, keep=match.outcome == "miss", branch=match.outcome != "bypass")
        )
    return groups, outcomes
