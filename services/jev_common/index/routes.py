"""`jev:{ns}:route:{route_key}`: where a state's prefix is warm. A worker writes the route key
(jev_common.route_key: sha256 of the rendered state text and its image keys, computable without a tokenizer) of
every state whose prefix its L3 holds, as an owner hash (owners.py); a frontend reads it to send the state's next
request there.

The worker re-writes its own route keys every `ttl_s / 3`, so an entry lives as long as the prefix stays resident
and at most `ttl_s` (120 s) after the worker died; a worker that stops cleanly removes its entries.
"""

from __future__ import annotations

import asyncio
from typing import Any

from . import owners
from .connection import IndexConnection, IndexUnavailable
from .owners import DEFAULT_OWNER_TTL_S, Owner, WarmOwner


def entry_key(ns: str, route_key: str) -> str:
    return f"jev:{ns}:route:{route_key}"


async def route_owners(connection: IndexConnection, ns: str, route_key: str) -> list[WarmOwner]:
    """(frontend) Live owners of a state's route key in namespace `ns`. Raises IndexUnavailable."""
    return await owners.live(connection, "route_owners", entry_key(ns, route_key))


class OwnRoutes:
    """(worker) This worker's route keys, kept fresh while their prefixes are resident."""

    def __init__(self, connection: IndexConnection, ns: str, owner: Owner, ttl_s: float = DEFAULT_OWNER_TTL_S) -> None:
        self.connection = connection
        self.ns = ns
        self.owner = owner
        self.ttl_s = ttl_s
        self._own: set[str] = set()
        self._refresher: asyncio.Task[None] | None = None

    async def register(self, route_key: str) -> None:
        """This worker holds warm the prefix of the state whose route key this is; kept fresh until `unregister`
        (the prefix left L3) or `unregister_all`."""
        self._own.add(route_key)
        self._start_refresher()
        await owners.put(self.connection, "register_route", entry_key(self.ns, route_key), self.owner, self.ttl_s)

    async def unregister(self, route_key: str) -> None:
        self._own.discard(route_key)
        await owners.drop(self.connection, "unregister_route", entry_key(self.ns, route_key), self.owner.worker_id)

    async def refresh(self) -> int:
        """Re-write every route key this worker registered and still holds (one pipeline); how many."""
        own = sorted(self._own)
        if not own:
            return 0
        ttl = owners.ttl_seconds(self.ttl_s)

        async def run(r: Any) -> int:
            async with r.pipeline(transaction=False) as pipe:
                for route_key in own:
                    entry = entry_key(self.ns, route_key)
                    pipe.hset(entry, self.owner.worker_id, owners.value(self.owner, self.ttl_s))
                    pipe.expire(entry, ttl)
                await pipe.execute()
            return len(own)

        return await self.connection.call("refresh_routes", run)

    async def unregister_all(self) -> int:
        """Remove this worker from every route entry of the namespace (a clean stop); how many it was in."""
        self._own.clear()
        return await owners.drop_everywhere(
            self.connection, "unregister_routes", entry_key(self.ns, "*"), self.owner.worker_id
        )

    def _start_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.ttl_s / 3))
            try:
                await self.refresh()
            except IndexUnavailable:
                pass  # logged by the connection; the next round tries again

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None
