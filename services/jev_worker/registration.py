"""What a worker tells the frontends through the cache index (jev_common.cache_index):

- `WorkerRegistration`: this worker's record (model, URL, namespace, health, queue depth) under
  `jev:worker:{id}` with a short TTL, refreshed every TTL/3 and removed on a clean stop; a host that
  dies drops out when the TTL runs out. When a refresh finds the record gone (an index restarted empty), the
  worker's resident prefixes and routes are re-announced at once, not at their next refresh.
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
from collections.abc import Callable

from jev_common.cache_index import WORKER_TTL_S, CacheIndex, IndexUnavailable

log = logging.getLogger("jev.worker.registration")

MAX_PENDING_PREFIXES = 8192  # prefixes noted by requests but not (or no longer) resident


async def _quietly(call) -> None:
    try:
        await call
    except IndexUnavailable:
        pass  # logged by the index; routing falls back to load


class WorkerRegistration:
    def __init__(self, index: CacheIndex, record: Callable[[], dict], ttl_s: float = WORKER_TTL_S):
        self.index = index
        self.record = record
        self.ttl_s = ttl_s
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.ttl_s > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="jev-registration")

    async def _loop(self) -> None:
        announced = False
        while True:
            try:
                present = await self.index.register_worker(self.record(), self.ttl_s)
                if announced and not present:  # the index lost this worker (restarted empty): everything again now
                    count = await self.index.refresh_own_prefixes()
                    log.info(
                        "the index had lost this worker's record: re-announced it and %d prefixes and routes", count
                    )
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
        await _quietly(self.index.unregister_worker(str(self.record()["worker_id"])))


class RouteRegistry:
    """prefix_key -> route keys of the states that produced it. Loop thread only."""

    def __init__(self) -> None:
        self._routes: OrderedDict[str, set[str]] = OrderedDict()
        self._resident: set[str] = set()
        self._registered: set[str] = set()

    def note(self, index: CacheIndex | None, prefix_key: str, route_key: str) -> None:
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

    def _register(self, index: CacheIndex, route_key: str) -> None:
        self._registered.add(route_key)
        asyncio.get_running_loop().create_task(_quietly(index.register_route(route_key)))

    async def resident(self, index: CacheIndex, prefix_key: str) -> None:
        self._resident.add(prefix_key)
        new = [r for r in self._routes.get(prefix_key, ()) if r not in self._registered]
        self._registered.update(new)
        await asyncio.gather(*(_quietly(index.register_route(r)) for r in new))

    async def evicted(self, index: CacheIndex, prefix_key: str) -> None:
        self._resident.discard(prefix_key)
        gone = [r for r in self._routes.pop(prefix_key, ()) if r in self._registered]
        self._registered.difference_update(gone)
        await asyncio.gather(*(_quietly(index.unregister_route(r)) for r in gone))

    def resident_routes(self) -> int:
        return len(self._registered)


class IndexLink:
    """The worker's best-effort calls to the cache index, from the event loop or the model thread: prefixes
    entering and leaving L3 (with their route keys), images warm in L2. A down index only degrades routing."""

    def __init__(self) -> None:
        self.index: CacheIndex | None = None
        self.routes = RouteRegistry()  # route keys of resident prefixes, for prefix-aware frontends
        self._loop: asyncio.AbstractEventLoop | None = None

    def connect(self, index: CacheIndex, loop: asyncio.AbstractEventLoop) -> None:
        self.index, self._loop = index, loop

    def _call(self, call) -> None:
        """Schedule `call(index)` on the loop (safe from any thread) and never wait for it."""
        index, loop = self.index, self._loop
        if index is None or loop is None:
            return

        def schedule() -> None:
            task = loop.create_task(call(index))
            task.add_done_callback(lambda t: t.exception())  # a down index only degrades, never fails

        loop.call_soon_threadsafe(schedule)

    # on the model thread (engine callbacks)
    def prefix_resident(self, key: str, state) -> None:
        self._call(lambda index: index.register_prefix(key, None, state.length, state.nbytes))
        self._call(lambda index: self.routes.resident(index, key))

    def prefix_evicted(self, key: str, _state) -> None:
        self._call(lambda index: index.unregister_prefix(key))
        self._call(lambda index: self.routes.evicted(index, key))

    # on the loop
    def note_route(self, prefix_key: str, route_key: str) -> None:
        self.routes.note(self.index, prefix_key, route_key)

    def register_l2(self, key: str) -> None:
        if self.index is not None:
            task = asyncio.get_running_loop().create_task(self.index.register_l2(key))
            task.add_done_callback(lambda t: t.exception())
