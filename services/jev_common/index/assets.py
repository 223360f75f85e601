"""`jev:{ns}:asset:{key}`: where a prepared image asset is. The preencoder writes an entry per asset it encodes;
a worker reads it to find the asset's folder, and removes an entry whose file is gone (the caller treats it as
not prepared). Hash fields: grid (JSON [t,h,w]), n_tokens, nbytes, dtype, path, identity, created."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import Any

from .connection import IndexConnection, namespace

log = logging.getLogger("jev.cache_index")


class AssetIndex:
    def __init__(self, connection: IndexConnection, identity: str) -> None:
        self.connection = connection
        self.identity = identity
        self.ns = namespace(identity)

    def entry_key(self, key: str) -> str:
        return f"jev:{self.ns}:asset:{key}"

    async def register(
        self,
        key: str,
        *,
        grid: Iterable[int],
        nbytes: int,
        path: str,
        n_tokens: int | None = None,
        dtype: str = "",
        created: str = "",
    ) -> None:
        mapping = {
            "grid": json.dumps([int(x) for x in grid]),
            "nbytes": int(nbytes),
            "path": str(path),
            "identity": self.identity,
            "n_tokens": int(n_tokens) if n_tokens is not None else "",
            "dtype": dtype,
            "created": created,
        }
        await self.connection.call("register_asset", lambda r: r.hset(self.entry_key(key), mapping=mapping))

    async def lookup(self, key: str) -> dict[str, Any] | None:
        """The asset entry, or None when the index has none. Raises IndexUnavailable."""
        raw = await self.connection.call("lookup_asset", lambda r: r.hgetall(self.entry_key(key)))
        if not raw:
            return None
        try:
            return {
                "grid": json.loads(raw["grid"]),
                "nbytes": int(raw["nbytes"]),
                "path": raw["path"],
                "identity": raw.get("identity", ""),
                "n_tokens": int(raw["n_tokens"]) if raw.get("n_tokens") else None,
                "dtype": raw.get("dtype", ""),
                "created": raw.get("created", ""),
            }
        except (KeyError, ValueError, TypeError):
            log.warning("cache index: malformed asset entry %s removed", key)
            await self.remove(key)
            return None

    async def remove(self, key: str) -> None:
        await self.connection.call("remove_asset", lambda r: r.delete(self.entry_key(key)))
