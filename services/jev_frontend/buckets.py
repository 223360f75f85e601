"""Token buckets for the rate limits, two per caller (requests, prompt tokens), shared by every frontend in Redis.

A bucket holds at most one minute of its limit and refills at limit/60 per second. `take` admits a request when
the requests bucket holds one and the tokens bucket is not empty (at least one token; prompt tokens are only
known from the answer), and takes the request; `debit` takes the answer's prompt tokens, and may leave the tokens
bucket below zero, which then holds the caller's next requests until it has refilled.

In Redis both buckets of a caller are one hash, `jev:ratelimit:{namespace}:{identity}` (the deployment's
namespace, jev_common.identity, so deployments sharing a Redis never share a bucket; `r`, `t`: levels; `ts`:
Redis's own clock in ms), changed by one Lua script, so concurrent frontends never lose an update and clock skew
between them does not matter; the key expires once both buckets would be full again, so an idle caller leaves
nothing behind.

When Redis cannot answer (down, or too slow: 0.25 s) the frontend keeps its own buckets in memory and enforces
the full limit alone (so N replicas admit up to N times the limit), tries Redis again after a 2 s back-off, and
says so in `state()` (its /health).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass
from typing import Any

from .limits import Limit

log = logging.getLogger("jev_frontend.ratelimit")

KEY_PREFIX = "jev:ratelimit:"
SOCKET_TIMEOUT_S = 0.25
BACKOFF_S = 2.0
MINUTE_MS = 60_000

# KEYS[1] the caller's hash; ARGV: requests/min, tokens/min, requests to take (0 or 1), tokens to debit
BUCKET_SCRIPT = """
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local take, debit = tonumber(ARGV[3]), tonumber(ARGV[4])
local clock = redis.call('TIME')
local now = clock[1] * 1000 + math.floor(clock[2] / 1000)
local saved = redis.call('HMGET', KEYS[1], 'r', 't', 'ts')
local r = tonumber(saved[1]) or rpm
local t = tonumber(saved[2]) or tpm
local elapsed = math.max(0, now - (tonumber(saved[3]) or now))
r = math.min(rpm, r + elapsed * rpm / 60000)
t = math.min(tpm, t + elapsed * tpm / 60000)
local admitted = 1
if take > 0 then
  if (rpm > 0 and r < take) or (tpm > 0 and t < 1) then
    admitted = 0
  elseif rpm > 0 then
    r = r - take
  end
end
if tpm > 0 then t = t - debit end
local full_ms = 0
if rpm > 0 then full_ms = math.max(full_ms, (rpm - r) * 60000 / rpm) end
if tpm > 0 then full_ms = math.max(full_ms, (tpm - t) * 60000 / tpm) end
redis.call('HSET', KEYS[1], 'r', tostring(r), 't', tostring(t), 'ts', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(full_ms) + 1000)
return {admitted, tostring(r), tostring(t)}
"""


@dataclass(frozen=True)
class Levels:
    """What a bucket operation left: whether the request was admitted, and both buckets' levels."""

    admitted: bool
    requests: float
    tokens: float


def refill(level: float, limit: int, elapsed_ms: float) -> float:
    return min(limit, level + elapsed_ms * limit / MINUTE_MS)


class MemoryBuckets:
    """The same buckets in this process only (the per-replica fallback, and the store without Redis)."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock
        self._buckets: dict[str, tuple[float, float, float, float]] = {}  # identity -> (r, t, at_ms, full_at_ms)
        self._next_sweep = 0.0

    def apply(self, identity: str, limit: Limit, take: int, debit: int) -> Levels:
        now = self._clock() * 1000
        self._sweep(now)
        r, t, at, _full = self._buckets.get(identity, (limit.requests, limit.tokens, now, now))
        elapsed = max(0.0, now - at)
        r, t = refill(r, limit.requests, elapsed), refill(t, limit.tokens, elapsed)
        admitted = True
        if take:
            if (limit.requests and r < take) or (limit.tokens and t < 1):
                admitted = False
            elif limit.requests:
                r -= take
        if limit.tokens:
            t -= debit
        full_ms = max(
            (limit.requests - r) * MINUTE_MS / limit.requests if limit.requests else 0.0,
            (limit.tokens - t) * MINUTE_MS / limit.tokens if limit.tokens else 0.0,
        )
        self._buckets[identity] = (r, t, now, now + full_ms)
        return Levels(admitted, r, t)

    def _sweep(self, now_ms: float) -> None:
        """Drop the buckets that are full again (as good as absent), at most once a second."""
        if now_ms < self._next_sweep:
            return
        self._next_sweep = now_ms + 1000
        for identity in [i for i, (_r, _t, _at, full) in self._buckets.items() if full <= now_ms]:
            del self._buckets[identity]

    def __len__(self) -> int:
        return len(self._buckets)


class Buckets:
    """The buckets every frontend shares in Redis (`redis_url`), else (none configured, or Redis not answering)
    this frontend's own."""

    def __init__(self, redis_url: str | None, namespace: str = "", client=None, clock=time.monotonic):
        self.redis_url = redis_url
        self.prefix = f"{KEY_PREFIX}{namespace}:"
        self.memory = MemoryBuckets(clock)
        self._client = client
        self._script = None
        self._clock = clock
        self._down_until = 0.0
        self.reason: str | None = None if redis_url or client is not None else "no Redis configured (JEV_REDIS_URL)"

    @property
    def shared(self) -> bool:
        """Whether the latest operation used Redis (every replica's one limit)."""
        return self.reason is None

    def state(self) -> dict:
        """For /health: where the buckets are, and so whether the limits hold across replicas."""
        if self.shared:
            return {"store": "redis", "enforced": "across replicas"}
        return {"store": "memory", "enforced": "per replica", "reason": self.reason}

    async def take(self, identity: str, limit: Limit) -> Levels:
        return await self._apply(identity, limit, 1, 0)

    async def debit(self, identity: str, limit: Limit, tokens: int) -> Levels:
        return await self._apply(identity, limit, 0, max(0, int(tokens)))

    async def _apply(self, identity: str, limit: Limit, take: int, debit: int) -> Levels:
        if not self.redis_url and self._client is None:  # no Redis configured: this frontend's own, always
            return self.memory.apply(identity, limit, take, debit)
        if self._clock() < self._down_until:
            return self.memory.apply(identity, limit, take, debit)
        try:
            admitted, requests, tokens = await asyncio.wait_for(
                self._run(identity, limit, take, debit), SOCKET_TIMEOUT_S * 4
            )
        except Exception as exc:  # noqa: BLE001 - any Redis failure: enforce here alone, say so, retry later
            self._down_until = self._clock() + BACKOFF_S
            reason = (
                f"Redis unreachable ({type(exc).__name__}: {str(exc)[:120]}); each frontend enforces the limits alone"
            )
            if self.shared:
                log.warning("rate limits: %s", reason)
            self.reason = reason
            return self.memory.apply(identity, limit, take, debit)
        if not self.shared:
            log.info("rate limits: Redis answers again; the limits hold across replicas")
            self.reason = None
        return Levels(bool(int(admitted)), float(requests), float(tokens))

    async def _run(self, identity: str, limit: Limit, take: int, debit: int):
        if self._script is None:
            self._script = self._redis().register_script(BUCKET_SCRIPT)
        script: Any = self._script
        return await script(
            keys=[self.prefix + identity], args=[limit.requests, limit.tokens, take, debit], client=self._redis()
        )

    def _redis(self):
        if self._client is None:
            import redis.asyncio as aioredis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            self._client = aioredis.Redis.from_url(
                self.redis_url,
                socket_timeout=SOCKET_TIMEOUT_S,
                socket_connect_timeout=SOCKET_TIMEOUT_S,
                retry=Retry(NoBackoff(), 0),
                retry_on_timeout=False,
                decode_responses=True,
                health_check_interval=0,
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


def seconds_until(level: float, need: float, limit: int) -> float:
    """Seconds until a bucket of `limit` per minute refills from `level` to `need` (0 when it is there)."""
    return max(0.0, (need - level) * 60.0 / limit) if limit else 0.0


def ceil_seconds(seconds: float) -> int:
    return max(1, math.ceil(seconds))
