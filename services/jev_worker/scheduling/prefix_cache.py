"""The prefix cache (L3), owned by the scheduler: which prompt prefixes have a computed state, and whether a
cached one is used.

A prefix state is what the rows after a prompt prefix continue from. Plain attention models keep per-layer
(keys, values), which can be sliced, expanded and padded; models with recurrent or sliding state (hybrid
conv/linear attention) keep a `snapshot` of the whole cache, copied and repeated per branch. The cache holds
either kind under the prefix key (checkpoint, images, prefix ids), bounded in bytes (caches.BudgetLRU), and
asks the measured reuse policy (reuse.py) whether a hit pays: on a GPU a short cached prefix can cost more to
assemble than to recompute, so such a hit is a `bypass` and the prefix is recomputed.

The scheduler matches every group of a batch before the runner sees it (vLLM v1 asks its KV cache manager
for computed blocks the same way), inserts the states the runner computed for misses, and asks `resident`
(without touching recency or counters) when it orders the queue.
"""

from __future__ import annotations

from ..protocols import PrefixCache
from ..values.datatypes import (
    Match as Match,
    PrefixState as PrefixState,
    layer_tensors as layer_tensors,  # declared below the protocols
)
from .caches import BudgetLRU
from .reuse import ReusePolicy


class L3PrefixCache(PrefixCache):
    def __init__(self, lru: BudgetLRU | None = None, reuse: ReusePolicy | None = None, device_type: str = "cpu"):
        self.lru: BudgetLRU[PrefixState] = lru if lru is not None else BudgetLRU("l3", 0)
        self.reuse = (reuse or ReusePolicy()).resolved(device_type)

    @property
    def enabled(self) -> bool:
        return self.lru.enabled

    def match(self, key: str, reusable: bool = True) -> Match:
        """`reusable`: the runner can continue a prefix state (it cannot for noncausal or whole-row models)."""
        if not (self.enabled and reusable):
            return Match(None, "off")
        state = self.lru.get(key)
        if state is None:
            return Match(None, "miss")
        if not self.reuse.use_cached(state.length):
            return Match(None, "bypass")
        return Match(state, "hit")

    def insert(self, key: str, state: PrefixState) -> bool:
        return self.lru.put(key, state)

    def evict(self, key: str) -> None:
        self.lru.pop(key)

    def resident(self, key: str) -> bool:
        return key in self.lru

    @property
    def size(self) -> int:
        return len(self.lru)

    def describe(self) -> dict:
        return {"l3_reuse": self.reuse.describe()}
