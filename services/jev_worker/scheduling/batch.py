"""What the scheduler hands the runner and gets back: the batch's items (one prepared prompt each), grouped by
prefix key with the scheduler's plan for each prefix, and the results."""

from __future__ import annotations

from ..protocols import PrefixCache
from ..values.datatypes import (
    BatchOutput as BatchOutput,
    BatchTiming as BatchTiming,
    EngineItem as EngineItem,  # declared below the protocols
    EngineResult as EngineResult,
    PrefixGroup as PrefixGroup,
)


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
