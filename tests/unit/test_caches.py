"""BudgetLRU: budgets, LRU order, counters, eviction callbacks."""
from __future__ import annotations

from jev_worker.caches import BudgetLRU


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
