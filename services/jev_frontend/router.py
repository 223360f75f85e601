"""Which replica of a model a request goes to.

`prefix` routing (the default), in order:

1. **warm**: a replica where the request's state is resident. Workers register the route key of
   every state whose prefix is in their L3 (`jev_common.route_key`, cache-index `route` entries);
   the frontend computes the same key from the request, without a tokenizer.
2. **affinity**: no replica is known warm in the index, but this frontend sent the same state to one
   recently (covers the moment before the worker's registration lands, and a down index).
3. **l2**: the request has images and a replica's L2 held one of them recently.
4. **cold**: power of two choices: two random replicas, the less loaded one (on a tie, the one that
   was given fewer cold states, so new states spread evenly over the replicas' caches).

A preferred replica whose load (requests in flight from this frontend, or the worker's own queue
depth, whichever is larger) exceeds the least-loaded replica's by more than
`JEV_ROUTING_MAX_IMBALANCE` is passed over for the least-loaded one (**load**). `round_robin` routing
sends requests to the replicas in turn (a baseline for the benchmark).
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import OrderedDict
from dataclasses import dataclass

from jev_common.index import IndexConnection, IndexUnavailable
from jev_common.index.l2 import l2_owners
from jev_common.index.routes import route_owners

from .pool import BackendPool, BackendState
from .settings import Settings

log = logging.getLogger("jev_frontend.router")

AFFINITY_ENTRIES = 65536


@dataclass(frozen=True)
class Route:
    backend: BackendState
    decision: str  # warm | affinity | l2 | load | cold | round_robin | only | down


class Router:
    def __init__(
        self, settings: Settings, pool: BackendPool, index: IndexConnection | None, rng: random.Random | None = None
    ):
        self.settings = settings
        self.pool = pool
        self.index = index
        self.rng = rng or random.Random()
        self._affinity: OrderedDict[str, str] = OrderedDict()  # route key -> backend url
        self._turns: dict[str, itertools.count] = {}

    async def choose(
        self,
        model: str,
        route_key: str | None = None,
        image_keys: list[str] | tuple = (),
        exclude: frozenset[str] | set[str] = frozenset(),
    ) -> Route | None:
        """A replica of `model` (None when every replica is excluded)."""
        members = [b for b in self.pool.replicas(model) if b.url not in exclude]
        if not members:
            return None
        up = [b for b in members if b.up]
        if not up:  # every replica is out: try the one out the longest (it may be back; its error names it)
            return Route(min(members, key=lambda b: b.changed_at), "down")
        if len(up) == 1:
            return self._remember(route_key, Route(up[0], "only"))
        if self.settings.routing == "round_robin":
            turn = next(self._turns.setdefault(model, itertools.count()))
            return Route(up[turn % len(up)], "round_robin")
        route = await self._preferred(up, route_key, image_keys)
        return self._remember(route_key, route or Route(self._two_choices(up), "cold"))

    async def _preferred(self, up: list[BackendState], route_key: str | None, image_keys) -> Route | None:
        if route_key:
            warm = await self._owners(up, lambda index, ns: route_owners(index, ns, route_key))
            if warm:
                return self._unless_overloaded(warm, up, "warm")
            url = self._affinity.get(route_key)
            sticky = [b for b in up if b.url == url]
            if sticky:
                return self._unless_overloaded(sticky, up, "affinity")
        for key in image_keys:
            holders = await self._owners(up, lambda index, ns, key=key: l2_owners(index, ns, key))
            if holders:
                return self._unless_overloaded(holders, up, "l2")
        return None

    async def _owners(self, up: list[BackendState], lookup) -> list[BackendState]:
        """Replicas in rotation that the index names as owners (matched by worker id, else URL)."""
        index = self.index
        if index is None:
            return []
        found = []
        for ns in sorted({b.ns for b in up if b.ns}):
            try:
                owners = await lookup(index, ns)
            except IndexUnavailable:
                return []
            ids = {o.worker_id for o in owners}
            urls = {o.url.rstrip("/") for o in owners}
            found += [b for b in up if b.ns == ns and ((b.worker_id and b.worker_id in ids) or b.url in urls)]
        return found

    def _unless_overloaded(self, preferred: list[BackendState], up: list[BackendState], decision: str) -> Route:
        best = min(preferred, key=lambda b: b.load)
        least = min(up, key=lambda b: b.load)
        if best.load - least.load > self.settings.max_imbalance:
            return Route(least, "load")
        return Route(best, decision)

    def _two_choices(self, up: list[BackendState]) -> BackendState:
        a, b = self.rng.sample(up, 2)
        chosen = min((a, b), key=lambda x: (x.load, x.cold_assigned))
        chosen.cold_assigned += 1
        return chosen

    @property
    def remembered(self) -> int:
        """Route keys with a remembered replica (at most AFFINITY_ENTRIES, the oldest forgotten first)."""
        return len(self._affinity)

    def _remember(self, route_key: str | None, route: Route) -> Route:
        """Affinity follows where a state was sent, except an overflow (`load`): the state stays with
        the replica it was warm on, so a hot state does not flip between replicas."""
        if route_key and route.decision != "load":
            self._affinity[route_key] = route.backend.url
            self._affinity.move_to_end(route_key)
            while len(self._affinity) > AFFINITY_ENTRIES:
                self._affinity.popitem(last=False)
        return route
