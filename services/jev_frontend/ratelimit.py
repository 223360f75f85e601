"""Per-caller rate limits at the edge: requests and prompt tokens per minute (limits.py), in token buckets every
frontend shares (buckets.py), for the work routes (`POST /v1/systemone`, `POST /v1/preencode`).

A caller is its API key's HMAC identity (jev_common.identity), or its address when keys are off. Before a request
is passed on, one request is taken from its bucket (429 `rate_limit_error` when there is none, or when its prompt
tokens are spent); after the answer, its `usage` prompt tokens are taken (the frontend has no tokenizer). Every
answer of a limited caller says where it stands: `x-ratelimit-limit-requests`, `x-ratelimit-remaining-requests`,
`x-ratelimit-reset-requests` (seconds until the bucket is full again) and the same three for `tokens`.
"""

from __future__ import annotations

import json
import logging

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from jev_common.errors import DomainError, RateLimited
from jev_common.identity import CallerIdentity, bearer_key

from .buckets import Buckets, Levels, ceil_seconds, seconds_until
from .limits import Limit, RateLimits

log = logging.getLogger("jev_frontend.ratelimit")

LIMITED_ROUTES = ("/v1/systemone", "/v1/preencode")
# What every answer of a limited caller says, per dimension (`x-ratelimit-{field}-{dimension}`), and what a refusal
# adds: the one table that limit_headers() and the OpenAPI description (jev_common.openapi) read.
DIMENSIONS = {"requests": "requests", "tokens": "prompt tokens"}
LIMIT_FIELDS = {
    "limit": "the {what} per minute this caller may use",
    "remaining": "the {what} left in this caller's bucket now (whole; 0 when it is spent or in debt)",
    "reset": "seconds until this caller's {what} bucket is full again",
}
RETRY_AFTER_MS_HEADER = "retry-after-ms"  # on a 429 rate_limit_error beside Retry-After: the exact wait (typesafe-sdk)


def limit_header(field: str, dimension: str) -> str:
    return f"x-ratelimit-{field}-{dimension}"


def documented_headers() -> dict[str, str]:
    """Every header this module sets, by name, with what it says (every answer of a limited caller carries the limit
    headers of the dimensions its limit sets; a refusal also carries retry-after-ms)."""
    headers = {
        limit_header(field, dimension): text.format(what=what) + f" (only while {what} are limited)"
        for dimension, what in DIMENSIONS.items()
        for field, text in LIMIT_FIELDS.items()
    }
    headers[RETRY_AFTER_MS_HEADER] = "milliseconds until a refused (429 rate_limit_error) request may be retried"
    return headers


class RateLimiter:
    def __init__(
        self,
        limits: RateLimits,
        api_keys: tuple[str, ...],
        identity: CallerIdentity,
        buckets: Buckets,
        registry: CollectorRegistry,
    ):
        self.limits = limits
        self.identity = identity
        self.buckets = buckets
        self._by_key = {key: limits.for_key(key) for key in api_keys}  # keys on: every key's limit, looked up once
        self.refused = Counter(
            "jev_frontend_rate_limited_total",
            "Requests refused 429 by the rate limits, by the limit reached (requests or tokens)",
            ["limit"],
            registry=registry,
        )
        self.shared = Gauge(
            "jev_frontend_rate_limit_shared",
            "1 while the rate limits' buckets are in Redis (one limit across replicas), 0 while this frontend "
            "keeps its own (Redis unreachable or not configured: each replica enforces the full limit alone) or no "
            "limits are set",
            registry=registry,
        )
        self.shared.set(int(self.enabled and buckets.shared))
        if api_keys:
            for prefix in limits.unmatched(api_keys):
                log.warning("JEV_RATE_LIMITS: sha256:%s matches none of JEV_API_KEYS; that entry limits nobody", prefix)
        elif limits.by_digest:
            log.warning("JEV_RATE_LIMITS names keys, but keys are off: every address gets the default limit")

    @property
    def enabled(self) -> bool:
        return bool(self.limits)

    def caller(self, request: web.Request) -> tuple[str, Limit] | None:
        """Who is limited and how, or None when this request is not limited."""
        if not self.enabled or request.method != "POST" or request.path not in LIMITED_ROUTES:
            return None
        key = bearer_key(request) if self._by_key else None  # keys on: the auth middleware checked it
        limit = self._by_key.get(key, self.limits.default) if key else self.limits.default
        return (self.identity.of(request), limit) if limit else None

    def health(self) -> dict:
        self.shared.set(int(self.buckets.shared))
        return {
            **self.buckets.state(),
            "default": self.limits.default.text() if self.limits.default else None,
            "keys_with_own_limits": len(self.limits.by_digest),
        }

    def middleware(self):
        @web.middleware
        async def rate_limits(request: web.Request, handler):
            caller = self.caller(request)
            if caller is None:
                return await handler(request)
            identity, limit = caller
            levels = await self.buckets.take(identity, limit)
            self.shared.set(int(self.buckets.shared))
            if not levels.admitted:
                raise self._refusal(limit, levels)
            try:
                response = await handler(request)
            except DomainError as exc:
                exc.headers.update(limit_headers(limit, levels))
                raise
            tokens = prompt_tokens(response) if limit.tokens else 0
            if tokens:
                debited = await self.buckets.debit(identity, limit, tokens)
                levels = Levels(True, levels.requests, debited.tokens)
            response.headers.update(limit_headers(limit, levels))
            return response

        return rate_limits

    def _refusal(self, limit: Limit, levels: Levels) -> RateLimited:
        waits = {
            "requests": seconds_until(levels.requests, 1, limit.requests),
            "tokens": seconds_until(levels.tokens, 1, limit.tokens),
        }
        reached = max(waits, key=lambda name: waits[name])
        wait_s = waits[reached]
        self.refused.labels(reached).inc()
        per_minute = limit.requests if reached == "requests" else limit.tokens
        what = "requests" if reached == "requests" else "prompt tokens"
        return RateLimited(
            f"rate limit reached: {per_minute} {what} per minute; retry in {ceil_seconds(wait_s)} s",
            retry_after=ceil_seconds(wait_s),
            headers={**limit_headers(limit, levels), RETRY_AFTER_MS_HEADER: str(max(1, round(wait_s * 1000)))},
        )


def limit_headers(limit: Limit, levels: Levels) -> dict[str, str]:
    headers = {}
    for name, per_minute, level in (
        ("requests", limit.requests, levels.requests),
        ("tokens", limit.tokens, levels.tokens),
    ):
        if per_minute:
            headers[limit_header("limit", name)] = str(per_minute)
            headers[limit_header("remaining", name)] = str(max(0, int(level)))
            headers[limit_header("reset", name)] = f"{seconds_until(level, per_minute, per_minute):.3f}"
    return headers


def prompt_tokens(response: web.StreamResponse) -> int:
    """The prompt tokens an answer reports (`usage.input_tokens` of the System One form, `usage.prompt_tokens` of
    the single-question form); 0 for anything else."""
    body = getattr(response, "body", None)
    if response.status != 200 or not isinstance(body, bytes | bytearray):
        return 0
    try:
        usage = json.loads(body).get("usage") or {}
        value = usage.get("input_tokens", usage.get("prompt_tokens", 0))
    except (ValueError, AttributeError):
        return 0
    return value if isinstance(value, int) and value > 0 else 0
