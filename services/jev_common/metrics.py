"""Prometheus HTTP metrics shared by every service: counts by route/status, latency, in-flight."""
from __future__ import annotations

import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class HttpMetrics:
    def __init__(self, service: str, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "jev_http_requests_total", "HTTP requests by route and status", ["service", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "jev_http_request_seconds", "HTTP request latency", ["service", "route"],
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.in_flight = Gauge("jev_http_in_flight", "HTTP requests in flight", ["service"], registry=self.registry)
        self.service = service

    @web.middleware
    async def middleware(self, request: web.Request, handler):
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        started = time.perf_counter()
        status = 500
        self.in_flight.labels(self.service).inc()
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            self.in_flight.labels(self.service).dec()
            self.requests.labels(self.service, route, str(status)).inc()
            self.latency.labels(self.service, route).observe(time.perf_counter() - started)

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
