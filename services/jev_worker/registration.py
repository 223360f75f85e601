"""What a worker tells the frontends through the cache index (jev_common.index):

- `WorkerIndex`: the worker's view of the index, one value: the connection, and the key spaces it reads (assets)
  and writes (its routes, its L2 assets, its registration);
- `WorkerRegistration`: this worker's record (model, URL, namespace, health, queue depth) under
  `jev:worker:{id}` with a short TTL, refreshed every TTL/3 and removed on a clean stop; a host that
  dies drops out when the TTL runs out. When a refresh finds the record gone (an index restarted empty), the
  worker's route keys are re-announced at once, not at their next refresh.
- `IndexLink`: the calls the request path and the model thread make (prefixes in and out of L3, images warm
  in L2), each scheduled on the event loop without waiting;
- `RouteRegistry`: the route key (jev_common.route_key) of every state whose prefix is resident in
  this worker's L3, registered when the prefix enters L3 and removed when it leaves, so a frontend
  can send a state's next request where its prefix is warm.

Every index call is best effort: a down Redis only makes routing less informed, never fails a request.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from jev_common.index import IndexConnection, IndexUnavailable, namespace
from jev_common.index.assets import AssetIndex
from jev_common.index.l2 import OwnL2
from jev_common.index.owners import DEFAULT_OWNER_TTL_S, Owner
from jev_common.index.routes import OwnRoutes
from jev_common.index.workers import WORKER_TTL_S, WorkerDirectory

log = logging.getLogger("jev.worker.registration")

MAX_PENDING_PREFIXES = 8192  # prefixes noted by requests but not (or no longer) resident


async def _quietly(call: Awaitable[Any]) -> None:
    try:
        await call
    except IndexUnavailable:
        pass  # logged by the index; routing falls back to load


@dataclass(frozen=True)
class WorkerIndex:
    """The key spaces a worker reads (assets, the preencoder's) and writes (its route keys, its L2 assets, its
    registration), over one connection, in the namespace of its checkpoint."""

    connection: IndexConnection
    ns: str
    assets: AssetIndex
    routes: OwnRoutes
    l2: OwnL2
    directory: WorkerDirectory

    @classmethod
    def over(
        cls, connection: IndexConnection, identity: str, owner: Owner, ttl_s: float = DEFAULT_OWNER_TTL_S
    ) -> WorkerIndex:
        """`ttl_s`: how long a route or L2 entry outlives a worker that stopped refreshing it."""
        ns = namespace(identity)
        return cls(
            connection,
            ns,
            AssetIndex(connection, identity),
            OwnRoutes(connection, ns, owner, ttl_s),
            OwnL2(connection, ns, owner, ttl_s),
            WorkerDirectory(connection),
        )

    async def unregister_owner(self) -> int:
        """Remove this worker from every route and L2 entry (a clean stop), so no entry points at an address that
        no longer answers; how many entries it was in."""
        return await self.routes.unregister_all() + await self.l2.unregister_all()

    async def close(self) -> None:
        await self.routes.close()
        await self.connection.close()


class WorkerRegistration:
    def __init__(
        self,
        directory: WorkerDirectory,
        routes: OwnRoutes,
        record: Callable[[], dict[str, Any]],
        ttl_s: float = WORKER_TTL_S,
    ) -> None:
        self.directory = directory
        self.routes = routes
        self.record = record
        self.ttl_s = ttl_s
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.ttl_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="jev-registration")

    async def _loop(self) -> None:
        announced = False
        while True:
            try:
                present = await self.directory.register(self.record(), self.ttl_s)
                if announced and not present:  # the index lost this worker (restarted empty): everything again now
                    count = await self.routes.refresh()
                    log.info("the index had lost this worker's record: re-announced it and %d routes", count)
                announced = True
            except IndexUnavailable:
                pass  # logged by the index; routing falls back to load
            await asyncio.sleep(max(0.05, self.ttl_s / 3))

    async def stop(self) -> None:
        if self._task is None:
            return
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        self._task = None
        await _quietly(self.directory.unregister(str(self.record()["worker_id"])))


class RouteRegistry:
    """prefix_key -> route keys of the states that produced it. Loop thread only."""

    def __init__(self) -> None:
        self._routes: OrderedDict[str, set[str]] = OrderedDict()
        self._resident: set[str] = set()
        self._registered: set[str] = set()

    def note(self, index: OwnRoutes | None, prefix_key: str, route_key: str) -> None:
        """A request with this route key uses this prefix (called before it runs)."""
        routes = self._routes.setdefault(prefix_key, set())
        self._routes.move_to_end(prefix_key)
        routes.add(route_key)
        if prefix_key in self._resident and route_key not in self._registered and index is not None:
            self._register(index, route_key)
        if len(self._routes) > MAX_PENDING_PREFIXES:  # drop the oldest prefix that is not resident
            oldest = next((k for k in self._routes if k not in self._resident), None)
            if oldest is not None:
                self._routes.pop(oldest)

    def _register(self, index: OwnRoutes, route_key: str) -> None:
        self._registered.add(route_key)
        asyncio.get_running_loop().create_task(_quietly(index.register(route_key)))

    async def resident(self, index: OwnRoutes, prefix_key: str) -> None:
        self._resident.add(prefix_key)
        new = [r for r in self._routes.get(prefix_key, ()) if r not in self._registered]
        self._registered.update(new)
        await asyncio.gather(*(_quietly(index.register(r)) for r in new))

    async def evicted(self, index: OwnRoutes, prefix_key: str) -> None:
        self._resident.discard(prefix_key)
        gone = [r for r in self._routes.pop(prefix_key, ()) if r in self._registered]
        self._registered.difference_update(gone)
        await asyncio.gather(*(_quietly(index.unregister(r)) for r in gone))

    def resident_routes(self) -> int:
        return len(self._registered)


class IndexLink:
    """The worker's best-effort calls to the cache index, from the event loop or the model thread: prefixes
    entering and leaving L3 (the route keys of their states), images warm in L2. A down index only degrades
    routing. `bind` names the event loop the calls run on (the service's, known once it starts)."""

    def __init__(self, index: WorkerIndex) -> None:
        self.index = index
        self.routes = RouteRegistry()  # route keys of resident prefixes, for prefix-aware frontends
        self._loop: asyncio.AbstractEventLoop | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def _call(self, call: Callable[[OwnRoutes], Coroutine[Any, Any, None]]) -> None:
        """Schedule `call(routes)` on the loop (safe from any thread) and never wait for it."""
        loop = self._loop
        if loop is None:
            return
        routes = self.index.routes

        def schedule() -> None:
            task = loop.create_task(call(routes))
            task.add_done_callback(lambda t: t.exception())  # a down index only degrades, never fails

        loop.call_soon_threadsafe(schedule)

    # on the model thread (engine callbacks)
    def prefix_resident(self, key: str, _state: object) -> None:
        self._call(lambda routes: self.routes.resident(routes, key))

    def prefix_evicted(self, key: str, _state: object) -> None:
        self._call(lambda routes: self.routes.evicted(routes, key))

    # on the loop
    def note_route(self, prefix_key: str, route_key: str) -> None:
        self.routes.note(self.index.routes, prefix_key, route_key)

    def register_l2(self, key: str) -> None:
        task = asyncio.get_running_loop().create_task(self.index.l2.register(key))
        task.add_done_callback(lambda t: t.exception())
