"""The frontend's one pooled client to the worker, with its backend metrics.

Every backend call either returns the worker's answer (any HTTP status) or raises the error
envelope: 502 backend_unavailable when the worker cannot be reached or breaks the connection,
504 backend_timeout when it does not answer within the deadline.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from jev_common.errors import ApiError
from jev_common.metrics import LATENCY_BUCKETS

from .settings import Settings

log = logging.getLogger("jev_frontend.proxy")

DECISION_HEADER_PREFIX = "x-jev-"


class BackendMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.errors = Counter(
            "jev_frontend_backend_errors_total", "Failed backend calls by endpoint and error type",
            ["endpoint", "type"], registry=registry,
        )
        self.latency = Histogram(
            "jev_frontend_backend_request_seconds", "Backend call latency (answered calls, any status)",
            ["endpoint"], buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.up = Gauge(
            "jev_frontend_backend_up",
            "1 when the worker answered the frontend's latest backend call, 0 when it was unreachable or timed out",
            registry=registry,
        )


@dataclass(frozen=True)
class BackendAnswer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def passthrough_headers(self) -> CIMultiDict[str]:
        """Content-Type, Retry-After and every x-jev-* decision header, unchanged (repeats kept)."""
        out: CIMultiDict[str] = CIMultiDict()
        for name, value in self.headers.items():
            lower = name.lower()
            if lower.startswith(DECISION_HEADER_PREFIX) or lower in ("content-type", "retry-after"):
                out.add(name, value)
        return out


class Backend:
    def __init__(self, settings: Settings, metrics: BackendMetrics):
        self.settings = settings
        self.metrics = metrics
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.settings.max_connections)
        self._session = aiohttp.ClientSession(connector=connector, raise_for_status=False)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("backend client not started (the app's cleanup_ctx starts it)")
        return self._session

    async def call(
        self,
        method: str,
        path: str,
        *,
        endpoint: str,
        timeout_s: float,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout_note: str = "",
    ) -> BackendAnswer:
        url = self.settings.backend_url + path
        started = time.perf_counter()
        try:
            async with self.session.request(
                method, url, data=data, headers=headers, allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                body = await resp.read()
                answer = BackendAnswer(resp.status, resp.headers, body)
        except asyncio.TimeoutError:  # also aiohttp's ServerTimeoutError / ConnectionTimeoutError
            self._failed(endpoint, "backend_timeout")
            raise ApiError(
                504, "backend_timeout",
                f"backend {self.settings.backend_url} did not answer {method} {path} within {timeout_s:g}s{timeout_note}",
            ) from None
        except aiohttp.ClientError as exc:
            self._failed(endpoint, "backend_unavailable")
            detail = str(exc) or type(exc).__name__
            raise ApiError(
                502, "backend_unavailable",
                f"backend {self.settings.backend_url} is unavailable for {method} {path}: {detail}",
            ) from None
        self.metrics.up.set(1)
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
        return answer

    def _failed(self, endpoint: str, type_: str) -> None:
        self.metrics.up.set(0)
        self.metrics.errors.labels(endpoint, type_).inc()
        log.warning("backend call %s failed: %s", endpoint, type_)
