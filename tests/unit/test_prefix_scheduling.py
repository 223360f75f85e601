"""The scheduler forms batches by prefix (scheduler.py) over the prefix cache it owns (prefix_cache.py): same-prefix
jobs together, then prefixes resident in L3, each in fair order; the fair queue's first job leads every batch, so
a popular prefix cannot starve the rest; a shared prefix costs a batch its rows' tokens only."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from jev_worker.prompt.builder import PreparedRequest
from jev_worker.protocols import Engine
from jev_worker.scheduling.batch import EngineItem
from jev_worker.scheduling.caches import BudgetLRU
from jev_worker.scheduling.prefix_cache import L3PrefixCache, PrefixState
from jev_worker.scheduling.reuse import LinearCost, ReuseCosts, ReusePolicy
from jev_worker.scheduling.scheduler import Scheduler


class NoEngine(Engine):
    reuses_prefix = True

    def run(self, items, groups):
        raise AssertionError("batches are formed here, not run")


def item(prefix: str, n: int, prefix_tokens: int = 100, row_tokens: int = 5) -> EngineItem:
    prepared = PreparedRequest(
        prefix_ids=tuple(range(prefix_tokens)),
        rows=((n,) * row_tokens,),
        row_labels=((1, 2),),
        image_keys=(),
        prefix_key=prefix,
    )
    return EngineItem(prepared=prepared)


def state(length: int = 4) -> PrefixState:
    return PrefixState(kv=[(torch.zeros(1, 1, length, 2), torch.zeros(1, 1, length, 2))], length=length)


def scheduler(prefix_aware: bool = True, cache: L3PrefixCache | None = None, rows: int = 3, tokens: int = 0):
    return Scheduler(
        NoEngine(),
        ThreadPoolExecutor(1),
        max_queue=100,
        batching=True,
        max_batch_rows=rows,
        max_wait_ms=0,
        prefix_cache=cache,
        prefix_aware=prefix_aware,
        max_batch_tokens=tokens,
    )


def queue(s: Scheduler, names: list[str]) -> None:
    for n, name in enumerate(names):
        s._new_job(item(name[0], n), f"flight-{n}", "client", 60.0)
        s._pending[-1].waiters = 1


def taken(s: Scheduler) -> list[str]:
    return [job.prefix_key + str(job.item.prepared.rows[0][0]) for job in s._take_batch()]


async def test_same_prefix_jobs_fill_a_batch_first_and_the_fair_first_leads_the_next():
    s = scheduler()
    queue(s, ["A", "B", "C", "A", "B", "A"])
    assert taken(s) == ["A0", "A3", "A5"]
    assert taken(s) == ["B1", "B4", "C2"]  # the fair queue's first (B1) leads: A's popularity did not skip it


async def test_first_come_fills_in_fair_order():
    s = scheduler(prefix_aware=False)
    queue(s, ["A", "B", "C", "A", "B", "A"])
    assert taken(s) == ["A0", "B1", "C2"]


async def test_prefixes_resident_in_l3_come_before_the_others():
    cache = L3PrefixCache(BudgetLRU("l3", 1 << 20, size_of=lambda s: s.nbytes))
    cache.insert("C", state())
    s = scheduler(cache=cache)
    queue(s, ["A", "B", "C", "B", "C"])
    assert taken(s) == ["A0", "C2", "C4"]


async def test_a_shared_prefix_costs_only_its_rows_tokens():
    """Three jobs of one 100-token prefix and 5-token rows fit 120 tokens; three different prefixes do not."""
    s = scheduler(tokens=120)
    queue(s, ["A", "A", "A"])
    assert taken(s) == ["A0", "A1", "A2"]
    s = scheduler(tokens=120)
    queue(s, ["A", "B", "C"])
    assert taken(s) == ["A0"]


def test_the_prefix_cache_says_why_a_state_is_not_used():
    lru = BudgetLRU("l3", 1 << 20, size_of=lambda s: s.nbytes)
    cache = L3PrefixCache(lru)
    assert cache.match("k").outcome == "miss" and cache.match("k").store
    assert cache.insert("k", state()) and cache.size == 1 and cache.resident("k")
    hits = lru.hits
    cache.resident("k")
    assert lru.hits == hits  # asking whether it is resident is not a lookup
    assert cache.match("k").outcome == "hit" and cache.match("k").state is not None
    assert cache.match("k", reusable=False).outcome == "off"
    assert L3PrefixCache().match("k").outcome == "off"  # no budget: L3 off
    slow_reuse = ReuseCosts(LinearCost(0.0, 1e-6), LinearCost(1.0, 0.0))  # reusing costs more than recomputing
    measured = L3PrefixCache(lru, ReusePolicy("measured", slow_reuse))
    assert measured.match("k").outcome == "bypass" and not measured.match("k").store
    cache.evict("k")
    assert not cache.resident("k") and cache.match("k").outcome == "miss"
