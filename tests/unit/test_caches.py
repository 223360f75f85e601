"""BudgetLRU: budgets, LRU order, counters, eviction callbacks."""

from __future__ import annotations

from jev_worker.scheduling.caches import BudgetLRU


def test_count_budget_and_lru_order():
    cache = BudgetLRU("l1", 2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # a is now most recent
    cache.put("c", 3)
    assert "b" not in cache and "a" in cache and "c" in cache
    assert (cache.hits, cache.misses, cache.evictions) == (1, 0, 1)
    assert cache.get("b") is None and cache.misses == 1


def test_byte_budget_and_eviction_callback():
    evicted = []
    cache = BudgetLRU("l3", 100, size_of=len, on_evict=lambda k, v: evicted.append(k))
    cache.put("x", b"1" * 60)
    cache.put("y", b"2" * 30)
    cache.put("z", b"3" * 30)
    assert evicted == ["x"] and cache.resident == 60 and cache.resident_bytes == 60
    assert not cache.put("huge", b"4" * 101)  # never admitted, nothing evicted for it
    assert evicted == ["x"]
    cache.put("y", b"2" * 10)  # replacing an entry updates its size
    assert cache.resident == 40


def test_zero_budget_is_off_and_reset_keeps_entries():
    off = BudgetLRU("l2", 0, size_of=len)
    assert not off.enabled and not off.put("a", b"x") and off.get("a") is None and off.misses == 0
    cache = BudgetLRU("l1", 4, bytes_of=lambda v: 100)
    cache.put("a", 1)
    cache.get("a")
    cache.reset_counters()
    stats = cache.stats()
    assert stats.hits == 0 and stats.resident_entries == 1 and stats.resident_bytes == 100


def test_worker_caches_own_every_level():
    """L1, L2 and L3 are made, sized, counted and reset in one place (caches.WorkerCaches); L3 takes the
    backend's share of the configured budget and tells the index of every insert and eviction."""
    from jev_worker.scheduling.caches import WorkerCaches
    from jev_worker.settings import CacheSettings

    inserted, evicted = [], []
    caches = WorkerCaches(
        CacheSettings(True, 8, 1000, 100),
        on_l3_insert=lambda k, v: inserted.append(k),
        on_l3_evict=lambda k, v: evicted.append(k),
    )

    class Reuses:
        def l3_bytes(self, configured):
            return configured // 2

    class State:
        nbytes = 30

    l3 = caches.size_l3(Reuses())
    assert (caches.l1.budget, caches.l2.budget, l3.budget) == (8, 1000, 50) and caches.l3 is l3
    l3.put("a", State())
    l3.put("b", State())  # 60 > 50: "a" goes
    assert inserted == ["a", "b"] and evicted == ["a"]
    assert set(caches.stats()) == {"l1", "l2", "l3"} and caches.stats()["l3"].resident_entries == 1
    caches.l1.get("missing")
    caches.reset_counters()
    assert caches.stats()["l1"].misses == 0 and caches.stats()["l3"].evictions == 0
    off = WorkerCaches(CacheSettings(False, 8, 1000, 100))
    assert not any(cache.enabled for cache in (off.l1, off.l2, off.size_l3(Reuses())))
