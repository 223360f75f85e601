"""LRU caches with a budget (entry count or bytes) and hit/miss/eviction counters, and the worker's three
levels of them, owned in one place (`WorkerCaches`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Generic, TypeVar

from jev_common.schema import CacheLevelStats

if TYPE_CHECKING:
    from ..settings import CacheSettings

V = TypeVar("V")


class BudgetLRU(Generic[V]):
    """Least-recently-used map bounded by the sum of `size_of(value)`.

    With size_of = lambda _: 1 the budget is an entry count (L1); with a byte size it is a byte budget
    (L2, L3). A budget of 0 turns the level off. Thread-safe: the event loop prepares requests while
    the model thread inserts KV state. `on_insert` / `on_evict` let owners (un)register entries in the cache
    index.
    """

    def __init__(
        self,
        name: str,
        budget: int,
        size_of: Callable[[V], int] = lambda _: 1,
        on_evict: Callable[[Hashable, V], None] | None = None,
        bytes_of: Callable[[V], int] | None = None,
        on_insert: Callable[[Hashable, V], None] | None = None,
    ):
        self.name = name
        self.budget = max(0, int(budget))
        self._size_of = size_of
        self._on_evict = on_evict
        self._on_insert = on_insert
        self._bytes_of = bytes_of or size_of  # what resident_bytes reports when the budget is a count
        self._entries: OrderedDict[Hashable, tuple[V, int, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.resident = 0
        self.resident_bytes = 0
        self.hits = self.misses = self.evictions = 0

    @property
    def enabled(self) -> bool:
        return self.budget > 0

    def get(self, key: Hashable) -> V | None:
        if not self.enabled:
            return None
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key: Hashable, value: V) -> bool:
        """Insert; False when the level is off or the value alone exceeds the budget."""
        size = self._size_of(value)
        if not self.enabled or size > self.budget:
            return False
        nbytes = self._bytes_of(value)
        evicted: list[tuple[Hashable, V]] = []
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.resident -= old[1]
                self.resident_bytes -= old[2]
            self._entries[key] = (value, size, nbytes)
            self.resident += size
            self.resident_bytes += nbytes
            while self.resident > self.budget:
                old_key, (old_value, old_size, old_bytes) = self._entries.popitem(last=False)
                self.resident -= old_size
                self.resident_bytes -= old_bytes
                self.evictions += 1
                evicted.append((old_key, old_value))
        if self._on_evict:
            for old_key, old_value in evicted:
                self._on_evict(old_key, old_value)
        if self._on_insert and key in self._entries:
            self._on_insert(key, value)
        return True

    def pop(self, key: Hashable) -> V | None:
        """Remove `key` (an eviction the owner asks for); its value, or None."""
        with self._lock:
            item = self._entries.pop(key, None)
            if item is not None:
                self.resident -= item[1]
                self.resident_bytes -= item[2]
                self.evictions += 1
        if item is not None and self._on_evict:
            self._on_evict(key, item[0])
        return item[0] if item is not None else None

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def keys(self) -> list[Hashable]:
        with self._lock:
            return list(self._entries)

    def reset_counters(self) -> None:
        with self._lock:
            self.hits = self.misses = self.evictions = 0

    def clear(self) -> None:
        with self._lock:
            items = list(self._entries.items())
            self._entries.clear()
            self.resident = 0
            self.resident_bytes = 0
        if self._on_evict:
            for key, (value, _, _) in items:
                self._on_evict(key, value)

    def stats(self) -> CacheLevelStats:
        with self._lock:
            return CacheLevelStats(
                enabled=self.enabled,
                hits=self.hits,
                misses=self.misses,
                evictions=self.evictions,
                resident_bytes=self.resident_bytes,
                resident_entries=len(self._entries),
                budget=self.budget,
            )


class WorkerCaches:
    """The worker's cache levels, each a BudgetLRU made and counted here:

    - L1: prepared prompt records (token ids of prefix and rows), by entry count; the request path fills it;
    - L2: parsed image assets, by bytes (vision-language recipes); the asset store fills it;
    - L3: prefix states (KV or cache snapshots), by bytes, within what the backend can use
      (`Backend.l3_bytes`); the engine fills it on the model thread, and every insert and eviction is told to
      the cache index (`on_l3_insert` / `on_l3_evict`).
    """

    def __init__(self, settings: CacheSettings, *, on_l3_insert=None, on_l3_evict=None):
        self.enabled = settings.enabled
        self.l1: BudgetLRU = BudgetLRU("l1", settings.l1_max if settings.l1_on else 0, bytes_of=lambda p: p.nbytes)
        self.l2: BudgetLRU = BudgetLRU("l2", settings.l2_bytes if settings.l2_on else 0, size_of=lambda a: a.nbytes)
        self._l3_configured = settings.l3_bytes if settings.l3_on else 0
        self._l3_hooks = {"on_insert": on_l3_insert, "on_evict": on_l3_evict}
        self.l3: BudgetLRU = BudgetLRU("l3", 0)  # sized once the backend is known (`size_l3`)

    def size_l3(self, backend) -> BudgetLRU:
        """L3 within the configured budget as far as `backend` reuses prefix state (0: it reuses none)."""
        self.l3 = BudgetLRU("l3", backend.l3_bytes(self._l3_configured), size_of=lambda s: s.nbytes, **self._l3_hooks)
        return self.l3

    def levels(self) -> tuple[BudgetLRU, BudgetLRU, BudgetLRU]:
        return self.l1, self.l2, self.l3

    def stats(self) -> dict[str, CacheLevelStats]:
        return {cache.name: cache.stats() for cache in self.levels()}

    def reset_counters(self) -> None:
        for cache in self.levels():
            cache.reset_counters()
