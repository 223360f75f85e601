"""Owner hashes, the value shape of the route and L2 key spaces: one field per worker holding a state or an asset
warm -> JSON {"url", "expires"}. The key carries a TTL (set again on each write) and expired owners are dropped
on read, so a dead worker's entries lapse on their own."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from .connection import IndexConnection, IndexUnavailable

DEFAULT_OWNER_TTL_S = 120.0  # an entry of a dead worker lingers at most this long


@dataclass(frozen=True)
class Owner:
    """A worker that writes owner hashes: its id (the field) and the URL it answers on."""

    worker_id: str
    url: str

    def __post_init__(self) -> None:
        if not self.worker_id:
            raise ValueError("an index owner needs a worker id")


@dataclass(frozen=True)
class WarmOwner:
    """A live owner read from an owner hash."""

    worker_id: str
    url: str
    expires: float


def ttl_seconds(ttl_s: float) -> int:
    return max(1, int(ttl_s + 0.999))


def value(owner: Owner, ttl_s: float) -> str:
    return json.dumps({"url": owner.url, "expires": time.time() + ttl_s})


async def put(connection: IndexConnection, what: str, entry: str, owner: Owner, ttl_s: float) -> None:
    """`owner` holds `entry` warm for `ttl_s`."""

    async def run(r: Any) -> Any:
        async with r.pipeline(transaction=True) as pipe:
            pipe.hset(entry, owner.worker_id, value(owner, ttl_s))
            pipe.expire(entry, ttl_seconds(ttl_s))
            return await pipe.execute()

    await connection.call(what, run)


async def drop(connection: IndexConnection, what: str, entry: str, worker_id: str) -> None:
    await connection.call(what, lambda r: r.hdel(entry, worker_id))


async def drop_everywhere(connection: IndexConnection, what: str, pattern: str, worker_id: str) -> int:
    """Remove `worker_id` from every owner hash matching `pattern`; how many it was in."""

    async def hdel(r: Any, name: str) -> int:
        return int(await r.hdel(name, worker_id))

    return await connection.scan(what, pattern, hdel)


async def live(connection: IndexConnection, what: str, entry: str) -> list[WarmOwner]:
    """The owners of `entry` whose time has not run out, by worker id; expired or malformed fields are pruned.
    Raises IndexUnavailable."""
    raw = await connection.call(what, lambda r: r.hgetall(entry))
    now = time.time()
    owners, stale = [], []
    for worker_id, field in (raw or {}).items():
        try:
            data = json.loads(field)
            owner = WarmOwner(worker_id, str(data.get("url", "")), float(data["expires"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            stale.append(worker_id)
            continue
        if owner.expires > now:
            owners.append(owner)
        else:
            stale.append(worker_id)
    if stale:
        try:
            await connection.call("prune_owners", lambda r: r.hdel(entry, *stale))
        except IndexUnavailable:
            pass
    return sorted(owners, key=lambda o: o.worker_id)
