"""Prometheus HTTP metrics shared by every service: counts by route/status, latency, in-flight.

Names carry the service (jev_frontend_http_requests_total, jev_worker_http_...), so the frontend can
append a worker's exposition to its own without clashing families.
"""

from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class HttpMetrics:
    def __init__(self, service: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        prefix = f"jev_{service}_http"
        self.requests = Counter(
            f"{prefix}_requests_total",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            f"{prefix}_request_seconds",
            "HTTP request latency",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.in_flight = Gauge(f"{prefix}_in_flight", "HTTP requests in flight", registry=self.registry)

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        started = time.perf_counter()
        status = 500
        self.in_flight.inc()
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.in_flight.dec()
            self.requests.labels(route, str(status)).inc()
            self.latency.labels(route).observe(time.perf_counter() - started)

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
