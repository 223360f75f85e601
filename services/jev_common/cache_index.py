"""The Redis cache index: which image assets exist, and which workers hold a prefix's KV state warm.

Keys are namespaced by the checkpoint identity (`ns` = sha256(identity)[:16]), so two checkpoints
sharing one Redis never see each other's entries:

- `jev:{ns}:asset:{key}`  hash: grid (JSON [t,h,w]), n_tokens, nbytes, dtype, path, identity, created
- `jev:{ns}:prefix:{prefix_hash}`  hash: one field per owner worker id -> JSON {"url", "expires",
  "length", "nbytes"};
  the key carries a TTL (refreshed on each registration) and expired owners are dropped on read.
  The index re-registers this worker's own prefixes every `prefix_ttl_s / 3`, so an entry lives as
  long as the prefix stays resident and at most `prefix_ttl_s` (120 s) after the worker died; a worker
  that stops cleanly removes its entries (`unregister_owner`).
- `jev:{ns}:route:{route_key}`  the same owner hash, keyed by the frontend's routing key of a state
  (`jev_common.route_key`: sha256 of the rendered state text and its image keys, computable without a
  tokenizer). A worker registers it next to the prefix the state produced and removes it with that
  prefix, so a frontend finds the worker where a request's prefix is resident.
- `jev:{ns}:l2:{asset_key}`  the same owner hash: workers whose L2 held that image asset recently
  (re-registered on use, never refreshed otherwise: a hint that lapses after `prefix_ttl_s`).
- `jev:worker:{worker_id}`  JSON {worker_id, url, model, ns, state, queue_depth, max_queue, updated}
  with a short TTL (`WORKER_TTL_S`, refreshed every TTL/3 by a live worker); `jev:workers` is the set
  of ids a frontend reads to discover workers (ids whose key expired are pruned on read). Not
  namespaced: a frontend learns each worker's `ns` from it.

The index is an accelerator, never the truth: every call that cannot reach Redis raises
`IndexUnavailable` (fast: short socket timeouts, no retries, and after a failure the index stays
"down" for `backoff_s` without trying), and callers fall back to the asset folder on disk. An asset
entry whose file is gone is treated as not prepared by the caller, which removes it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from dataclasses import dataclass

log = logging.getLogger("jev.cache_index")

DEFAULT_SOCKET_TIMEOUT_S = 0.25
DEFAULT_PREFIX_TTL_S = 120  # an entry of a dead worker lingers at most this long
DEFAULT_BACKOFF_S = 2.0
WORKER_TTL_S = 10.0  # a dead worker's registration lingers at most this long
WORKERS_SET = "jev:workers"


class IndexUnavailable(RuntimeError):
    """Redis could not answer (down, timed out, refused, misconfigured). Fall back to the filesystem."""


def namespace(identity: str) -> str:
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class PrefixOwner:
    worker_id: str
    url: str
    expires: float
    length: int | None = None
    nbytes: int | None = None


class CacheIndex:
    def __init__(
        self,
        url: str | None,
        identity: str,
        *,
        owner_id: str = "",
        owner_url: str = "",
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        prefix_ttl_s: float = DEFAULT_PREFIX_TTL_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
        client=None,
    ):
        self.url = url or ""
        self.identity = identity
        self.ns = namespace(identity)
        self.owner_id = owner_id
        self.owner_url = owner_url
        self.prefix_ttl_s = prefix_ttl_s
        self.backoff_s = backoff_s
        self._timeout = socket_timeout_s
        self._client = client
        self._down_until = 0.0
        self._last_error: str | None = None if self.url or client is not None else "no Redis URL configured"
        self.errors = 0
        self.degraded_calls = 0
        self._own_prefixes: dict[str, tuple[int | None, int | None]] = {}  # hash -> (length, nbytes)
        self._own_routes: set[str] = set()  # route keys of resident prefixes, refreshed with them
        self._refresher: asyncio.Task | None = None

    # --- plumbing ---

    @property
    def enabled(self) -> bool:
        return bool(self.url) or self._client is not None

    @property
    def reachable(self) -> bool:
        """Whether the latest call reached Redis (True before the first call)."""
        return self.enabled and self._last_error is None

    def _redis(self):
        if self._client is None:
            import redis.asyncio as aioredis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            self._client = aioredis.Redis.from_url(
                self.url,
                socket_timeout=self._timeout,
                socket_connect_timeout=self._timeout,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
                decode_responses=True,
                health_check_interval=0,
            )
        return self._client

    async def _call(self, what: str, fn, *, force: bool = False):
        import redis.exceptions as rexc

        if not self.enabled:
            self.degraded_calls += 1
            raise IndexUnavailable("cache index disabled: no Redis URL configured")
        if not force and time.monotonic() < self._down_until:
            self.degraded_calls += 1
            raise IndexUnavailable(f"cache index unavailable ({self._last_error}); retrying after a back-off")
        try:
            result = await asyncio.wait_for(fn(self._redis()), timeout=self._timeout * 4)
        except (TimeoutError, rexc.RedisError, OSError) as exc:
            self.errors += 1
            self.degraded_calls += 1
            self._last_error = f"{what}: {type(exc).__name__}: {str(exc)[:160]}"
            self._down_until = time.monotonic() + self.backoff_s
            log.warning("cache index %s failed: %s", what, self._last_error)
            raise IndexUnavailable(self._last_error) from None
        self._down_until = 0.0
        self._last_error = None
        return result

    def asset_entry_key(self, key: str) -> str:
        return f"jev:{self.ns}:asset:{key}"

    def prefix_entry_key(self, prefix_hash: str) -> str:
        return f"jev:{self.ns}:prefix:{prefix_hash}"

    def route_entry_key(self, route_key: str, ns: str | None = None) -> str:
        return f"jev:{ns or self.ns}:route:{route_key}"

    def l2_entry_key(self, asset: str, ns: str | None = None) -> str:
        return f"jev:{ns or self.ns}:l2:{asset}"

    # --- assets ---

    async def register_asset(
        self, key: str, *, grid, nbytes: int, path: str, n_tokens: int | None = None, dtype: str = "", created: str = ""
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
        await self._call("register_asset", lambda r: r.hset(self.asset_entry_key(key), mapping=mapping))

    async def lookup_asset(self, key: str) -> dict | None:
        """The asset entry, or None when the index has none. Raises IndexUnavailable."""
        raw = await self._call("lookup_asset", lambda r: r.hgetall(self.asset_entry_key(key)))
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
            await self.remove_asset(key)
            return None

    async def remove_asset(self, key: str) -> None:
        await self._call("remove_asset", lambda r: r.delete(self.asset_entry_key(key)))

    # --- warm prefixes ---

    def _owner(self, owner) -> tuple[str, str]:
        """owner: a worker id, a {"worker_id", "url"} dict, or None (this index's own owner)."""
        if isinstance(owner, dict):
            worker_id, url = str(owner.get("worker_id") or self.owner_id), owner.get("url")
        else:
            worker_id, url = str(owner or self.owner_id), None
        if not worker_id:
            raise ValueError("a prefix owner needs a worker id")
        return worker_id, str(url if url is not None else self.owner_url)

    async def register_prefix(
        self,
        prefix_hash: str,
        owner=None,
        length: int | None = None,
        nbytes: int | None = None,
        *,
        url: str | None = None,
        ttl_s: float | None = None,
    ) -> None:
        """This worker (or `owner`) holds the prefix's KV state warm, for `ttl_s` (default prefix_ttl_s)."""
        ttl = float(ttl_s if ttl_s is not None else self.prefix_ttl_s)
        worker_id, owner_url = self._owner(owner)
        value = {"url": url if url is not None else owner_url, "expires": time.time() + ttl}
        if length is not None:
            value["length"] = int(length)
        if nbytes is not None:
            value["nbytes"] = int(nbytes)
        entry = self.prefix_entry_key(prefix_hash)

        async def run(r):
            async with r.pipeline(transaction=True) as pipe:
                pipe.hset(entry, worker_id, json.dumps(value))
                pipe.expire(entry, max(1, int(ttl + 0.999)))
                return await pipe.execute()

        if worker_id == self.owner_id and url is None and ttl_s is None:  # ours: kept fresh while resident
            self._own_prefixes[prefix_hash] = (length, nbytes)
            self._start_refresher()
        await self._call("register_prefix", run)

    async def unregister_prefix(self, prefix_hash: str, owner=None) -> None:
        worker_id, _ = self._owner(owner)
        if worker_id == self.owner_id:
            self._own_prefixes.pop(prefix_hash, None)
        await self._call("unregister_prefix", lambda r: r.hdel(self.prefix_entry_key(prefix_hash), worker_id))

    def _start_refresher(self) -> None:
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_loop())

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(max(0.05, self.prefix_ttl_s / 3))
            try:
                await self.refresh_own_prefixes()
            except IndexUnavailable:
                pass  # logged by _call; the next round tries again

    async def refresh_own_prefixes(self) -> int:
        """Re-register every prefix this worker registered and still holds (one pipeline)."""
        own = dict(self._own_prefixes)
        routes = set(self._own_routes)
        if not own and not routes:
            return 0
        worker_id, url = self._owner(None)
        ttl = max(1, int(self.prefix_ttl_s + 0.999))

        async def run(r):
            async with r.pipeline(transaction=False) as pipe:
                for prefix_hash, (length, nbytes) in own.items():
                    value = {"url": url, "expires": time.time() + self.prefix_ttl_s}
                    value.update({k: int(v) for k, v in (("length", length), ("nbytes", nbytes)) if v is not None})
                    pipe.hset(self.prefix_entry_key(prefix_hash), worker_id, json.dumps(value))
                    pipe.expire(self.prefix_entry_key(prefix_hash), ttl)
                for route_key in routes:
                    pipe.hset(
                        self.route_entry_key(route_key),
                        worker_id,
                        json.dumps({"url": url, "expires": time.time() + self.prefix_ttl_s}),
                    )
                    pipe.expire(self.route_entry_key(route_key), ttl)
                await pipe.execute()
            return len(own) + len(routes)

        return await self._call("refresh_prefixes", run)

    async def unregister_owner(self, owner=None) -> int:
        """Remove this worker (or `owner`) from every prefix entry of the namespace, e.g. on shutdown,
        so no entry points at an address that no longer answers. Returns how many entries it was in."""
        worker_id, _ = self._owner(owner)
        if worker_id == self.owner_id:
            self._own_prefixes.clear()
            self._own_routes.clear()

        async def run(r):
            removed = 0
            for kind in ("prefix", "route", "l2"):
                async for name in r.scan_iter(match=f"jev:{self.ns}:{kind}:*", count=500):
                    removed += await r.hdel(name, worker_id)
            return removed

        return await self._call("unregister_owner", run)

    async def where_is_prefix_warm(self, prefix_hash: str) -> list[PrefixOwner]:
        """Live owners of a prefix (expired ones dropped). Raises IndexUnavailable."""
        return await self._live_owners("where_is_prefix_warm", self.prefix_entry_key(prefix_hash))

    async def _live_owners(self, what: str, entry: str) -> list[PrefixOwner]:
        raw = await self._call(what, lambda r: r.hgetall(entry))
        now = time.time()
        owners, stale = [], []
        for worker_id, value in (raw or {}).items():
            try:
                data = json.loads(value)
                owner = PrefixOwner(
                    worker_id, str(data.get("url", "")), float(data["expires"]), data.get("length"), data.get("nbytes")
                )
            except (ValueError, KeyError, TypeError):
                stale.append(worker_id)
                continue
            if owner.expires > now:
                owners.append(owner)
            else:
                stale.append(worker_id)
        if stale:
            try:
                await self._call("prune_prefix", lambda r: r.hdel(entry, *stale))
            except IndexUnavailable:
                pass
        return sorted(owners, key=lambda o: o.worker_id)

    # --- routing: state route keys and L2 residency (worker side) ---

    async def register_route(self, route_key: str) -> None:
        """This worker holds warm the prefix of the state whose route key this is; kept fresh with the
        prefixes until `unregister_route` (the prefix left L3) or `unregister_owner`."""
        self._own_routes.add(route_key)
        self._start_refresher()
        await self._owner_hset("register_route", self.route_entry_key(route_key), self.prefix_ttl_s)

    async def unregister_route(self, route_key: str) -> None:
        self._own_routes.discard(route_key)
        await self._call("unregister_route", lambda r: r.hdel(self.route_entry_key(route_key), self.owner_id))

    async def register_l2(self, asset: str) -> None:
        """This worker's L2 holds the image asset (a hint for routing; lapses after prefix_ttl_s)."""
        await self._owner_hset("register_l2", self.l2_entry_key(asset), self.prefix_ttl_s)

    async def _owner_hset(self, what: str, entry: str, ttl: float) -> None:
        worker_id, url = self._owner(None)
        value = json.dumps({"url": url, "expires": time.time() + ttl})

        async def run(r):
            async with r.pipeline(transaction=True) as pipe:
                pipe.hset(entry, worker_id, value)
                pipe.expire(entry, max(1, int(ttl + 0.999)))
                return await pipe.execute()

        await self._call(what, run)

    # --- routing: lookups (frontend side; `ns` is the worker's, learned from its registration) ---

    async def route_owners(self, ns: str, route_key: str) -> list[PrefixOwner]:
        """Live owners of a state's route key in namespace `ns`. Raises IndexUnavailable."""
        return await self._live_owners("route_owners", self.route_entry_key(route_key, ns))

    async def l2_owners(self, ns: str, asset: str) -> list[PrefixOwner]:
        return await self._live_owners("l2_owners", self.l2_entry_key(asset, ns))

    # --- worker registrations (discovery) ---

    async def register_worker(self, record: dict, ttl_s: float = WORKER_TTL_S) -> bool:
        """Announce a worker (model, url, ns, health, queue depth) for `ttl_s`; call again to refresh. Returns
        whether its record was still there (False: a first announcement, or an index that lost it)."""
        worker_id = str(record["worker_id"])
        payload = json.dumps({**record, "updated": time.time()})

        async def run(r):
            async with r.pipeline(transaction=True) as pipe:
                pipe.exists(f"jev:worker:{worker_id}")
                pipe.set(f"jev:worker:{worker_id}", payload, ex=max(1, int(ttl_s + 0.999)))
                pipe.sadd(WORKERS_SET, worker_id)
                return await pipe.execute()

        existed, *_ = await self._call("register_worker", run)
        return bool(existed)

    async def unregister_worker(self, worker_id: str) -> None:
        async def run(r):
            async with r.pipeline(transaction=True) as pipe:
                pipe.delete(f"jev:worker:{worker_id}")
                pipe.srem(WORKERS_SET, worker_id)
                return await pipe.execute()

        await self._call("unregister_worker", run)

    async def list_workers(self) -> list[dict]:
        """Every live worker registration; ids whose key expired (a dead host) are pruned from the set."""

        async def run(r):
            ids = sorted(await r.smembers(WORKERS_SET))
            if not ids:
                return []
            values = await r.mget([f"jev:worker:{i}" for i in ids])
            gone = [i for i, v in zip(ids, values) if v is None]
            if gone:
                await r.srem(WORKERS_SET, *gone)
            return [v for v in values if v is not None]

        records = []
        for raw in await self._call("list_workers", run):
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("worker_id") and record.get("url"):
                records.append(record)
        return records

    # --- admin ---

    async def health(self) -> dict:
        """{"status": "ok"|"degraded", "reason", "namespace"}; a real PING, back-off or not."""
        if not self.enabled:
            return {"status": "degraded", "reason": "no Redis URL configured", "namespace": self.ns}
        try:
            await self._call("ping", lambda r: r.ping(), force=True)
        except IndexUnavailable as exc:
            return {"status": "degraded", "reason": str(exc), "namespace": self.ns}
        return {"status": "ok", "reason": None, "namespace": self.ns}

    def stats(self) -> dict:
        return {
            "enabled": self.enabled,
            "namespace": self.ns,
            "errors": self.errors,
            "degraded_calls": self.degraded_calls,
            "last_error": self._last_error,
        }

    async def purge_namespace(self) -> int:
        """Delete every key of this namespace (tests, and re-indexing after a checkpoint change)."""

        async def run(r):
            deleted = 0
            async for name in r.scan_iter(match=f"jev:{self.ns}:*", count=500):
                deleted += await r.delete(name)
            return deleted

        return await self._call("purge_namespace", run)

    async def close(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            await asyncio.gather(self._refresher, return_exceptions=True)
            self._refresher = None
        if self._client is not None:
            try:
                await self._client.aclose()
            except Exception:  # noqa: BLE001 - closing a dead connection must not fail shutdown
                pass
            self._client = None
