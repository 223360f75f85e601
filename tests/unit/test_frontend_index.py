"""What workers write to the index for the frontend's routing: their registrations (discovery) and the
route keys of their resident prefixes (cache_index + jev_worker.registration), on a real Redis."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid

import pytest

from jev_common.cache_index import CacheIndex, IndexUnavailable
from jev_worker.registration import RouteRegistry, WorkerRegistration

from .test_cache_index import DEAD_URL, needs_redis

pytestmark = needs_redis


@pytest.fixture
async def index():
    made = CacheIndex(
        f"redis://127.0.0.1:6379/{random.randint(1, 15)}",
        f"test/{uuid.uuid4().hex}@1",
        owner_id=f"w-{uuid.uuid4().hex[:8]}",
        owner_url="http://127.0.0.1:9",
        prefix_ttl_s=60,
    )
    yield made
    await made.unregister_worker(made.owner_id)
    await made.purge_namespace()
    await made.close()


def mine(records, worker_id):
    return [r for r in records if r["worker_id"] == worker_id]


async def test_worker_registration_expires_with_its_ttl_and_leaves_on_stop(index):
    record = {"worker_id": index.owner_id, "url": "http://127.0.0.1:9", "model": "m", "ns": index.ns, "queue_depth": 3}
    await index.register_worker(record, ttl_s=1)
    [found] = mine(await index.list_workers(), index.owner_id)
    assert found["model"] == "m" and found["ns"] == index.ns and found["queue_depth"] == 3
    await asyncio.sleep(2.1)  # a dead host: nobody refreshes it
    assert mine(await index.list_workers(), index.owner_id) == []
    assert index.owner_id not in await index._redis().smembers("jev:workers")  # pruned on read

    registration = WorkerRegistration(index, lambda: record, ttl_s=0.6)
    registration.start()
    await asyncio.sleep(1.5)  # refreshed every TTL/3: still there after two TTLs
    assert mine(await index.list_workers(), index.owner_id)
    await registration.stop()
    assert mine(await index.list_workers(), index.owner_id) == []


async def test_route_keys_follow_the_prefixes_in_l3(index):
    routes = RouteRegistry()
    routes.note(index, "prefix-1", "route-1")
    assert await index.route_owners(index.ns, "route-1") == []  # noted, not resident yet
    await routes.resident(index, "prefix-1")
    [owner] = await index.route_owners(index.ns, "route-1")
    assert owner.worker_id == index.owner_id and owner.url == "http://127.0.0.1:9"
    routes.note(index, "prefix-1", "route-2")  # another state with the same prefix, already resident
    await asyncio.sleep(0.1)
    assert [o.worker_id for o in await index.route_owners(index.ns, "route-2")] == [index.owner_id]
    assert await index.refresh_own_prefixes() == 2
    await routes.evicted(index, "prefix-1")
    assert await index.route_owners(index.ns, "route-1") == await index.route_owners(index.ns, "route-2") == []
    assert await index.refresh_own_prefixes() == 0

    await routes.resident(index, "prefix-3")
    routes.note(index, "prefix-3", "route-3")
    await index.register_l2("asset-1")
    await asyncio.sleep(0.1)
    assert await index.route_owners(index.ns, "route-3") and await index.l2_owners(index.ns, "asset-1")
    assert await index.route_owners("another-ns", "route-3") == []
    await index.unregister_owner()  # a clean stop removes route and L2 entries too
    assert await index.route_owners(index.ns, "route-3") == await index.l2_owners(index.ns, "asset-1") == []


async def test_redis_down_never_fails_the_worker_side():
    dead = CacheIndex(DEAD_URL, "test/dead@1", owner_id="w", owner_url="http://x")
    routes = RouteRegistry()
    routes.note(dead, "p", "r")
    await routes.resident(dead, "p")
    await routes.evicted(dead, "p")
    registration = WorkerRegistration(dead, lambda: {"worker_id": "w", "url": "http://x"}, ttl_s=0.3)
    registration.start()
    await asyncio.sleep(0.2)
    await registration.stop()
    with pytest.raises(IndexUnavailable):
        await dead.list_workers()
    await dead.close()


async def test_an_index_restarted_empty_gets_the_worker_and_its_routes_back_at_once(index, caplog):
    """The registration finds its record gone (Redis restarted empty) and re-announces the resident prefixes and
    routes then, not at their next refresh (a third of the 60 s prefix TTL here)."""
    record = {"worker_id": index.owner_id, "url": "http://127.0.0.1:9", "model": "m", "ns": index.ns}
    routes = RouteRegistry()
    routes.note(index, "prefix-1", "route-1")
    await routes.resident(index, "prefix-1")
    registration = WorkerRegistration(index, lambda: record, ttl_s=0.3)
    registration.start()
    try:
        await asyncio.sleep(0.2)
        redis = index._redis()
        keys = [key async for key in redis.scan_iter(f"jev:{index.ns}:*")] + [f"jev:worker:{index.owner_id}"]
        with caplog.at_level(logging.INFO, logger="jev"):
            # what an empty Redis holds of this worker: nothing (one transaction, so no refresh lands in between)
            assert await redis.delete(*keys) > 0
            await asyncio.sleep(0.4)
        assert "had lost this worker's record" in caplog.text  # noticed and re-announced, not waited out
        assert mine(await index.list_workers(), index.owner_id)
        assert [o.worker_id for o in await index.route_owners(index.ns, "route-1")] == [index.owner_id]
    finally:
        await registration.stop()
