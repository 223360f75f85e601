"""One service's connection to the Redis cache index: fast failure and a back-off instead of retries.

Every call that cannot reach Redis raises `IndexUnavailable` (fast: short socket timeouts, no retries, and after a
failure the connection stays "down" for `backoff_s` without trying); callers fall back to what they know without
the index (the asset folder on disk, routing by load).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger("jev.cache_index")

DEFAULT_SOCKET_TIMEOUT_S = 0.25
DEFAULT_BACKOFF_S = 2.0

T = TypeVar("T")


class IndexUnavailable(RuntimeError):
    """Redis could not answer (down, timed out, refused, misconfigured). Fall back to the filesystem."""


def namespace(identity: str) -> str:
    """The key namespace of a checkpoint identity."""
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:16]


class IndexConnection:
    def __init__(
        self,
        url: str | None,
        *,
        socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S,
        backoff_s: float = DEFAULT_BACKOFF_S,
        client: Any = None,
    ) -> None:
        self.url = url or ""
        self.backoff_s = backoff_s
        self._timeout = socket_timeout_s
        self._client = client
        self._down_until = 0.0
        self.last_error: str | None = None if self.url or client is not None else "no Redis URL configured"
        self.errors = 0
        self.degraded_calls = 0

    @property
    def enabled(self) -> bool:
        return bool(self.url) or self._client is not None

    @property
    def reachable(self) -> bool:
        """Whether the latest call reached Redis (True before the first call)."""
        return self.enabled and self.last_error is None

    def redis(self) -> Any:
        """The redis.asyncio client, made on first use (no connection is opened by constructing it)."""
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

    async def call(self, what: str, fn: Callable[[Any], Awaitable[T]], *, force: bool = False) -> T:
        """`fn(redis)` within a bounded time; raises IndexUnavailable (and backs off) when Redis does not answer."""
        import redis.exceptions as rexc

        if not self.enabled:
            self.degraded_calls += 1
            raise IndexUnavailable("cache index disabled: no Redis URL configured")
        if not force and time.monotonic() < self._down_until:
            self.degraded_calls += 1
            raise IndexUnavailable(f"cache index unavailable ({self.last_error}); retrying after a back-off")
        try:
            result = await asyncio.wait_for(fn(self.redis()), timeout=self._timeout * 4)
        except (TimeoutError, rexc.RedisError, OSError) as exc:
            self.errors += 1
            self.degraded_calls += 1
            self.last_error = f"{what}: {type(exc).__name__}: {str(exc)[:160]}"
            self._down_until = time.monotonic() + self.backoff_s
            log.warning("cache index %s failed: %s", what, self.last_error)
            raise IndexUnavailable(self.last_error) from None
        self._down_until = 0.0
        self.last_error = None
        return result

    async def health(self, ns: str) -> dict[str, Any]:
        """{"status": "ok"|"degraded", "reason", "namespace"}; a real PING, back-off or not."""
        if not self.enabled:
            return {"status": "degraded", "reason": "no Redis URL configured", "namespace": ns}
        try:
            await self.call("ping", lambda r: r.ping(), force=True)
        except IndexUnavailable as exc:
            return {"status": "degraded", "reason": str(exc), "namespace": ns}
        return {"status": "ok", "reason": None, "namespace": ns}

    def stats(self) -> dict[str, Any]:
        return {
            "enabled": self.enabled,
            "errors": self.errors,
            "degraded_calls": self.degraded_calls,
            "last_error": self.last_error,
        }

    async def scan(self, what: str, pattern: str, on_key: Callable[[Any, str], Awaitable[int]]) -> int:
        """`on_key(redis, key)` for every key matching `pattern`; the sum of what it returns."""

        async def run(r: Any) -> int:
            total = 0
            async for name in r.scan_iter(match=pattern, count=500):
                total += await on_key(r, name)
            return total

        return await self.call(what, run)

    async def purge(self, ns: str) -> int:
        """Delete every key of namespace `ns` (tests, and re-indexing after a checkpoint change)."""

        async def delete(r: Any, name: str) -> int:
            return int(await r.delete(name))

        return await self.scan("purge_namespace", f"jev:{ns}:*", delete)

    async def close(self) -> None:
        if self._client is not None:
            try:
                await self._client.aclose()
            except Exception:  # noqa: BLE001 - closing a dead connection must not fail shutdown
                pass
            self._client = None
