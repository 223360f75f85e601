"""The frontend's one pooled HTTP client to its backends, with its backend metrics.

Every backend call either returns the worker's answer (any HTTP status) or raises the error
envelope: 502 backend_unavailable when the worker cannot be reached or breaks the connection
(`BackendConnectError` when the connection was never made, so the request can go to another
replica), 504 backend_timeout when it does not answer within the deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable
from dataclasses import dataclass

import aiohttp
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from jev_common.errors import BackendTimeout, BackendUnavailable, DomainError
from jev_common.internal_auth import backend_headers
from jev_common.metrics import LATENCY_BUCKETS
from jev_common.tracing import Tracing

from .settings import Settings
from .tracing import OFF_CONTEXT, FrontendSpans

log = logging.getLogger("jev_frontend.proxy")

DECISION_HEADER_PREFIX = "x-jev-"
OVERHEAD_BUCKETS = (2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1)


class BackendMetrics:
    def __init__(self, registry: CollectorRegistry):
        # totals over every backend (names kept from the single-backend frontend)
        self.errors = Counter(
            "jev_frontend_backend_errors_total",
            "Failed backend calls by endpoint and error type",
            ["endpoint", "type"],
            registry=registry,
        )
        self.latency = Histogram(
            "jev_frontend_backend_request_seconds",
            "Backend call latency (answered calls, any status)",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.up = Gauge(
            "jev_frontend_backend_up",
            "1 when a backend answered the frontend's latest call to it (any backend, with several), "
            "0 when none is reachable",
            registry=registry,
        )
        # per backend
        self.routed = Counter(
            "jev_frontend_route_requests_total",
            "Decision requests sent to a backend, by routing decision (warm, affinity, l2, load, cold, "
            "round_robin, only, down, single)",
            ["backend", "model", "decision"],
            registry=registry,
        )
        self.backend_errors = Counter(
            "jev_frontend_route_errors_total",
            "Failed calls per backend and error type",
            ["backend", "type"],
            registry=registry,
        )
        self.backend_latency = Histogram(
            "jev_frontend_route_request_seconds",
            "Decision latency per backend (answered calls, any status)",
            ["backend"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.backend_up = Gauge(
            "jev_frontend_route_backend_up",
            "1 while a backend is in rotation (healthy), 0 while taken out",
            ["backend", "model"],
            registry=registry,
        )
        self.overhead = Histogram(
            "jev_frontend_overhead_seconds",
            "The frontend's own time per decision: from its handler's start to the answer, less the backend call "
            "that answered (reading and validating the body, routing, refused tries, passing the answer on)",
            buckets=OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "jev_frontend_route_in_flight",
            "Requests this frontend has in flight per backend",
            ["backend"],
            registry=registry,
        )


@dataclass(frozen=True)
class BackendAnswer:
    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    seconds: float = 0.0  # the call's duration, request sent to body read

    def passthrough_headers(self) -> CIMultiDict[str]:
        """Content-Type, Retry-After and every x-jev-* decision header, unchanged (repeats kept)."""
        out: CIMultiDict[str] = CIMultiDict()
        for name, value in self.headers.items():
            lower = name.lower()
            if lower.startswith(DECISION_HEADER_PREFIX) or lower in ("content-type", "retry-after"):
                out.add(name, value)
        return out


class BackendConnectError(BackendUnavailable):
    """The backend refused or could not be reached: nothing was sent, another replica may answer."""


class BackendUnreachable(BackendUnavailable):
    """The backend stopped answering while a request waited on it (its health probe found it unreachable)."""


class BackendDisconnected(BackendUnavailable):
    """The backend broke the connection during the call (it may have died)."""


class Backend:
    """One pooled client for every backend; `call` names the backend URL."""

    def __init__(self, settings: Settings, metrics: BackendMetrics, spans: FrontendSpans | None = None):
        self.settings = settings
        self.metrics = metrics
        self.spans = spans or FrontendSpans(Tracing("jev-frontend", env={}))  # decisions' `proxy` spans
        self.credential = backend_headers(settings.internal_tokens)  # on every call: the backends' internal token
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
        url: str | None = None,
        data: bytes | AsyncIterable[bytes] | None = None,
        headers: dict[str, str] | None = None,
        timeout_note: str = "",
    ) -> BackendAnswer:
        """`data` may be the caller's body as it streams in (jev_common.http.stream_body): the caller's own fault
        found while it streams (too large, undecodable) is raised as that error, not as the backend's."""
        base = url or self.settings.backend_url
        started = time.perf_counter()
        headers = {**(headers or {}), **self.credential}
        traced = self.spans.proxy(base, method, path, headers) if endpoint == "systemone" else OFF_CONTEXT
        try:
            with traced as proxy:  # the decision's call, carrying the trace on (its traceparent)
                async with self.session.request(
                    method,
                    base + path,
                    data=data,
                    headers=headers,
                    allow_redirects=False,
                    timeout=aiohttp.ClientTimeout(total=timeout_s),
                ) as resp:
                    body = await resp.read()
                    answer = BackendAnswer(resp.status, resp.headers, body, time.perf_counter() - started)
                proxy.answered(resp.status)
        except TimeoutError:  # also aiohttp's ServerTimeoutError / ConnectionTimeoutError
            self._failed(base, endpoint, "backend_timeout")
            raise BackendTimeout(
                f"backend {base} did not answer {method} {path} within {timeout_s:g}s{timeout_note}",
            ) from None
        except aiohttp.ClientError as exc:
            if isinstance(exc.__cause__, DomainError):  # the streamed body's own error, raised while it was sent
                raise exc.__cause__ from None
            self._failed(base, endpoint, "backend_unavailable")
            detail = str(exc) or type(exc).__name__
            error = BackendConnectError if isinstance(exc, aiohttp.ClientConnectorError) else BackendDisconnected
            raise error(f"backend {base} is unavailable for {method} {path}: {detail}") from None
        elapsed = time.perf_counter() - started
        self.metrics.up.set(1)
        self.metrics.latency.labels(endpoint).observe(elapsed)
        if endpoint == "systemone":
            self.metrics.backend_latency.labels(base).observe(elapsed)
        return answer

    def _failed(self, base: str, endpoint: str, type_: str) -> None:
        if self.settings.single_backend and base == self.settings.backend_url:  # the worker, not the preencoder
            self.metrics.up.set(0)
        self.metrics.errors.labels(endpoint, type_).inc()
        self.metrics.backend_errors.labels(base, type_).inc()
        log.warning("backend call %s to %s failed: %s", endpoint, base, type_)
