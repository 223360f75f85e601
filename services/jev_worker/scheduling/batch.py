"""What the scheduler hands the runner and gets back: the batch's items (one prepared prompt each), grouped by
prefix key with each group's cache match, and the results."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..prompt.builder import PreparedRequest
from ..protocols import PrefixCache
from .prefix_cache import Match, PrefixState


@dataclass
class EngineItem:
    prepared: PreparedRequest
    assets: list = field(default_factory=list)  # parsed image assets, in prompt order


@dataclass
class EngineResult:
    row_logits: list[torch.Tensor]  # FP32 label logits, one tensor per row
    cached_tokens: int
    l3: str  # hit | miss | bypass | off


@dataclass
class PrefixGroup:
    """The batch's items that share one prefix key, and where their rows start from."""

    key: str
    indices: list[int]  # positions in the batch's items, in order
    match: Match

    @property
    def state(self) -> PrefixState | None:
        return self.match.state


@dataclass
class BatchOutput:
    results: list[EngineResult]
    states: dict[str, PrefixState] = field(default_factory=dict)  # computed for groups that missed


def group_by_prefix(items: list[EngineItem], cache: PrefixCache, reusable: bool) -> list[PrefixGroup]:
    """The items by prefix key, in first-seen order, each group matched once in the cache."""
    indices: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        indices.setdefault(item.prepared.prefix_key, []).append(i)
    return [PrefixGroup(key, members, cache.match(key, reusable)) for key, members in indices.items()]
