"""What workers write to the index for the frontend's routing: their registrations (discovery) and the
route keys of their resident prefixes (jev_common.index + jev_worker.registration), on a real Redis."""

from __future__ import annotations

import asyncio
import logging
import random
import uuid

import pytest

from jev_common.index import IndexConnection, IndexUnavailable
from jev_common.index.l2 import l2_owners
from jev_common.index.owners import Owner
from jev_common.index.routes import route_owners
from jev_worker.registration import RouteRegistry, WorkerIndex, WorkerRegistration

from .test_cache_index import DEAD_URL, needs_redis

pytestmark = needs_redis


@pytest.fixture
async def index():
    made = WorkerIndex.over(
        IndexConnection(f"redis://127.0.0.1:6379/{random.randint(1, 15)}"),
        f"test/{uuid.uuid4().hex}@1",
        Owner(f"w-{uuid.uuid4().hex[:8]}", "http://127.0.0.1:9"),
        60,
    )
    yield made
    await made.directory.unregister(made.routes.owner.worker_id)
    await made.connection.purge(made.ns)
    await made.close()


def mine(records, worker_id):
    return [r for r in records if r["worker_id"] == worker_id]


async def test_worker_registration_expires_with_its_ttl_and_leaves_on_stop(index):
    owner_id = index.routes.owner.worker_id
    record = {"worker_id": owner_id, "url": "http://127.0.0.1:9", "model": "m", "ns": index.ns, "queue_depth": 3}
    await index.directory.register(record, ttl_s=1)
    [found] = mine(await index.directory.list(), owner_id)
    assert found["model"] == "m" and found["ns"] == index.ns and found["queue_depth"] == 3
    await asyncio.sleep(2.1)  # a dead host: nobody refreshes it
    assert mine(await index.directory.list(), owner_id) == []
    assert owner_id not in await index.connection.redis().smembers("jev:workers")  # pruned on read

    registration = WorkerRegistration(index.directory, index.routes, lambda: record, ttl_s=0.6)
    registration.start()
    await asyncio.sleep(1.5)  # refreshed every TTL/3: still there after two TTLs
    assert mine(await index.directory.list(), owner_id)
    await registration.stop()
    assert mine(await index.directory.list(), owner_id) == []


async def test_route_keys_follow_the_prefixes_in_l3(index):
    own, conn, owner_id = index.routes, index.connection, index.routes.owner.worker_id
    routes = RouteRegistry()
    routes.note(own, "prefix-1", "route-1")
    assert await route_owners(conn, index.ns, "route-1") == []  # noted, not resident yet
    await routes.resident(own, "prefix-1")
    [owner] = await route_owners(conn, index.ns, "route-1")
    assert owner.worker_id == owner_id and owner.url == "http://127.0.0.1:9"
    routes.note(own, "prefix-1", "route-2")  # another state with the same prefix, already resident
    await asyncio.sleep(0.1)
    assert [o.worker_id for o in await route_owners(conn, index.ns, "route-2")] == [owner_id]
    assert await own.refresh() == 2
    await routes.evicted(own, "prefix-1")
    assert await route_owners(conn, index.ns, "route-1") == await route_owners(conn, index.ns, "route-2") == []
    assert await own.refresh() == 0

    await routes.resident(own, "prefix-3")
    routes.note(own, "prefix-3", "route-3")
    await index.l2.register("asset-1")
    await asyncio.sleep(0.1)
    assert await route_owners(conn, index.ns, "route-3") and await l2_owners(conn, index.ns, "asset-1")
    assert await route_owners(conn, "another-ns", "route-3") == []
    await index.unregister_owner()  # a clean stop removes route and L2 entries too
    assert await route_owners(conn, index.ns, "route-3") == await l2_owners(conn, index.ns, "asset-1") == []


async def test_redis_down_never_fails_the_worker_side():
    dead = WorkerIndex.over(IndexConnection(DEAD_URL), "test/dead@1", Owner("w", "http://x"))
    routes = RouteRegistry()
    routes.note(dead.routes, "p", "r")
    await routes.resident(dead.routes, "p")
    await routes.evicted(dead.routes, "p")
    registration = WorkerRegistration(
        dead.directory, dead.routes, lambda: {"worker_id": "w", "url": "http://x"}, ttl_s=0.3
    )
    registration.start()
    await asyncio.sleep(0.2)
    await registration.stop()
    with pytest.raises(IndexUnavailable):
        await dead.directory.list()
    await dead.close()


async def test_an_index_restarted_empty_gets_the_worker_and_its_routes_back_at_once(index, caplog):
    """The registration finds its record gone (Redis restarted empty) and re-announces the resident prefixes and
    routes then, not at their next refresh (a third of the 60 s prefix TTL here)."""
    owner_id = index.routes.owner.worker_id
    record = {"worker_id": owner_id, "url": "http://127.0.0.1:9", "model": "m", "ns": index.ns}
    routes = RouteRegistry()
    routes.note(index.routes, "prefix-1", "route-1")
    await routes.resident(index.routes, "prefix-1")
    registration = WorkerRegistration(index.directory, index.routes, lambda: record, ttl_s=0.3)
    registration.start()
    try:
        await asyncio.sleep(0.2)
        redis = index.connection.redis()
        keys = [key async for key in redis.scan_iter(f"jev:{index.ns}:*")] + [f"jev:worker:{owner_id}"]
        with caplog.at_level(logging.INFO, logger="jev"):
            # what an empty Redis holds of this worker: nothing (one transaction, so no refresh lands in between)
            assert await redis.delete(*keys) > 0
            await asyncio.sleep(0.4)
        assert "had lost this worker's record" in caplog.text  # noticed and re-announced, not waited out
        assert mine(await index.directory.list(), owner_id)
        assert [o.worker_id for o in await route_owners(index.connection, index.ns, "route-1")] == [owner_id]
    finally:
        await registration.stop()
