"""`jev:{ns}:l2:{asset_key}`: workers whose L2 held an image asset recently, as an owner hash (owners.py). A worker
writes it on each use of the asset (never refreshed otherwise: a hint that lapses after `ttl_s`); a frontend reads
it to send a request with that image where the image is warm."""

from __future__ import annotations

from . import owners
from .connection import IndexConnection
from .owners import DEFAULT_OWNER_TTL_S, Owner, WarmOwner


def entry_key(ns: str, asset: str) -> str:
    return f"jev:{ns}:l2:{asset}"


async def l2_owners(connection: IndexConnection, ns: str, asset: str) -> list[WarmOwner]:
    """(frontend) Live owners of an image asset in namespace `ns`. Raises IndexUnavailable."""
    return await owners.live(connection, "l2_owners", entry_key(ns, asset))


class OwnL2:
    """(worker) The image assets this worker's L2 holds."""

    def __init__(self, connection: IndexConnection, ns: str, owner: Owner, ttl_s: float = DEFAULT_OWNER_TTL_S) -> None:
        self.connection = connection
        self.ns = ns
        self.owner = owner
        self.ttl_s = ttl_s

    async def register(self, asset: str) -> None:
        await owners.put(self.connection, "register_l2", entry_key(self.ns, asset), self.owner, self.ttl_s)

    async def unregister_all(self) -> int:
        """Remove this worker from every L2 entry of the namespace (a clean stop); how many it was in."""
        return await owners.drop_everywhere(
            self.connection, "unregister_l2", entry_key(self.ns, "*"), self.owner.worker_id
        )
