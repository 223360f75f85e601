"""Prometheus HTTP metrics shared by every service: counts by route/status, latency, in-flight; the cache index's
reachability (`jev_<service>_index_up`); constant labels on a service's whole exposition (the worker's `model`).

Names carry the service (jev_frontend_http_requests_total, jev_worker_http_...), so the frontend can
append a worker's exposition to its own without clashing families.
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

from .gc_pauses import GcPauses
from .outcome import status_of

if TYPE_CHECKING:
    from .index import IndexConnection

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class LoopHistogram:
    """A labelled histogram observed from one thread (the event loop) on every request: a bisect and two list
    increments, no lock and no label validation per observation (prometheus_client's Histogram takes a lock per
    bucket and walks its bounds). Exposed like any histogram (`_bucket{le}`, `_sum`, `_count`)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...] | list[str],
        buckets: tuple[float, ...],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(float(b) for b in buckets)
        self._series: dict[tuple[str, ...], list[float]] = {}  # labels -> [bucket counts..., +Inf count, sum]
        registry.register(self)

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = [0] * (len(self.bounds) + 1) + [0.0]
        series[bisect_left(self.bounds, value)] += 1
        series[-1] += value

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in sorted(self._series.items()):
            counts, running = [], 0
            for bound, count in zip((*self.bounds, float("inf")), series[:-1]):
                running += int(count)
                counts.append((str(floatToGoString(bound)), running))  # type: ignore[no-untyped-call]
            family.add_metric(list(labels), counts, series[-1])
        yield family


class Labelled:
    """A registry's families with constant labels on every sample that lacks them (a collector for
    generate_latest): the labels a target's every series shares, such as the model a worker serves."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.registry = registry
        self.labels = labels

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [
                sample._replace(
                    labels={**sample.labels, **{k: v for k, v in self.labels.items() if k not in sample.labels}}
                )
                for sample in family.samples
            ]
            yield out


class IndexGauges:
    """`jev_<service>_index_up` (1 while the cache index's latest call reached Redis, 0 after one failed) and
    `jev_<service>_index_errors_total`, read from the service's IndexConnection at each scrape; nothing while the
    service has no index (no Redis URL, a single-backend frontend)."""

    def __init__(self, service: str, source: Callable[[], IndexConnection | None]) -> None:
        self.prefix = f"jev_{service}_index"
        self.source = source  # () -> jev_common.index.IndexConnection | None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        index = self.source()
        if index is None or not index.enabled:
            return
        up = GaugeMetricFamily(f"{self.prefix}_up", "1 while the cache index (Redis) answered its latest call, else 0")
        up.add_metric([], 1 if index.reachable else 0)
        errors = CounterMetricFamily(f"{self.prefix}_errors", "Cache index calls that could not reach Redis")
        errors.add_metric([], index.errors)
        yield up
        yield errors


class AsyncioTasks:
    """`jev_<service>_asyncio_tasks`: the tasks alive on the service's event loop at the scrape (read on that loop, as
    /metrics is served there): tasks that pile up are work or connections never let go of."""

    HELP = "Tasks alive on the event loop (not done), read at the scrape"

    def __init__(self, service: str) -> None:
        self.name = f"jev_{service}_asyncio_tasks"

    def describe(self) -> list[Metric]:
        return [GaugeMetricFamily(self.name, self.HELP)]

    def collect(self) -> Iterator[Metric]:
        try:
            tasks = asyncio.all_tasks(asyncio.get_running_loop())
        except RuntimeError:  # collected off the loop (a test's registry read): nothing to count
            return
        family = GaugeMetricFamily(self.name, self.HELP)
        family.add_metric([], len(tasks))
        yield family


class HttpMetrics:
    def __init__(
        self, service: str, registry: CollectorRegistry | None = None, labels: dict[str, str] | None = None
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.labels = dict(labels or {})  # on every series of this service's exposition
        prefix = f"jev_{service}_http"
        self.requests = Counter(
            f"{prefix}_requests_total",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = LoopHistogram(
            f"{prefix}_request_seconds", "HTTP request latency", ["route"], LATENCY_BUCKETS, self.registry
        )
        self.in_flight = Gauge(f"{prefix}_in_flight", "HTTP requests in flight", registry=self.registry)
        self._counted: dict[tuple[str, int], Any] = {}  # (route, status) -> its counter child
        self.registry.register(AsyncioTasks(service))
        self.registry.register(GcPauses(service))

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
        started = time.perf_counter()
        status = 500
        self.in_flight.inc()
        try:
            response = await handler(request)
            status = status_of(response)
            return response
        except BaseException as exc:
            status = status_of(exc)  # 499: the caller left before its answer (jev_common.outcome)
            raise
        finally:
            self.in_flight.dec()
            counter = self._counted.get((route, status))
            if counter is None:
                counter = self._counted[(route, status)] = self.requests.labels(route, str(status))
            counter.inc()
            self.latency.observe((route,), time.perf_counter() - started)

    def watch_index(self, service: str, source: Callable[[], IndexConnection | None]) -> None:
        """Export the cache index's reachability (IndexGauges) from `source()`, the service's index or None."""
        self.registry.register(IndexGauges(service, source))

    def exposition(self) -> bytes:
        return generate_latest(Labelled(self.registry, self.labels) if self.labels else self.registry)

    async def handle_metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})
