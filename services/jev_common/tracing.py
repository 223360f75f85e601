"""OpenTelemetry tracing for every service: a span per request, continued from the caller's W3C `traceparent` and
passed on to the services it calls, exported over OTLP/HTTP (protobuf) in batches.

On only when `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT` is set (and `OTEL_SDK_DISABLED` is
not `true`); the SDK's other variables apply as documented upstream (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`,
`OTEL_BSP_SCHEDULE_DELAY`, `OTEL_EXPORTER_OTLP_HEADERS`, ...). Off, nothing of OpenTelemetry is imported, no
middleware is installed and every hook is one attribute test: tracing costs nothing (benchmarks/tracing.py measures
it). Spans are flushed by `shutdown()`, which each service awaits when it stops, and every
`OTEL_BSP_SCHEDULE_DELAY` ms meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .http import REQUEST_ID
from .outcome import is_error, status_of

log = logging.getLogger("jev.tracing")

ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
REQUEST_ID_ATTRIBUTE = "jev.request_id"
TRACED_PREFIX = "/v1/"  # API calls; health probes and scrapes are not traced


def tracing_wanted(env: Mapping[str, str] = os.environ) -> bool:
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


class Tracing:
    """One service's tracer. `enabled` False: every method is a no-op and OpenTelemetry is never imported.

    `exporter` (tests) replaces the OTLP exporter and turns tracing on whatever the environment says."""

    def __init__(self, service_name: str, env: Mapping[str, str] = os.environ, exporter: Any = None) -> None:
        self.enabled = exporter is not None or tracing_wanted(env)
        self.tracer: Any = None  # set below when tracing is on (an opentelemetry Tracer)
        self._provider: Any = None
        self._propagator: Any = None
        if not self.enabled:
            return
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        resource = Resource.create()  # OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES, when set
        if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
            resource = resource.merge(Resource({SERVICE_NAME: service_name}))
        self._provider = TracerProvider(resource=resource)
        self._provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter()))
        self.tracer = self._provider.get_tracer("jev")
        self._propagator = TraceContextTextMapPropagator()
        log.info("tracing on: spans of %s exported over OTLP/HTTP", resource.attributes.get(SERVICE_NAME))

    def inject(self, headers: dict[str, str]) -> None:
        """The current span's `traceparent` (and `tracestate`) into `headers`, for the service called next."""
        if self.enabled:
            self._propagator.inject(headers)

    @contextlib.contextmanager
    def span(self, name: str, kind: str = "internal", **attributes: Any) -> Iterator[Any]:
        """A child of the current span (yields None when tracing is off)."""
        if not self.enabled:
            yield None
            return
        from opentelemetry.trace import SpanKind

        with self.tracer.start_as_current_span(name, kind=getattr(SpanKind, kind.upper()), attributes=attributes) as s:
            yield s

    @staticmethod
    def clock_offset_ns() -> int:
        """What turns a time.perf_counter() point into wall-clock nanoseconds (read once for spans that must meet)."""
        return time.time_ns() - time.perf_counter_ns()

    def record(
        self,
        name: str,
        start: float,
        end: float,
        parent: Any = None,
        offset_ns: int | None = None,
        **attributes: Any,
    ) -> Any:
        """A finished span from two time.perf_counter() points (work timed before it could be traced, such as a
        request's timeline of stages), a child of `parent` (a span) or of the current span; `offset_ns`: one
        clock_offset_ns() for spans that share points. Returns the span."""
        if not self.enabled:
            return None
        from opentelemetry import trace

        offset_ns = self.clock_offset_ns() if offset_ns is None else offset_ns
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(
            name, context=context, attributes=attributes, start_time=offset_ns + int(start * 1e9)
        )
        span.end(end_time=offset_ns + int(max(start, end) * 1e9))
        return span

    def middleware(self) -> Middleware:
        """An aiohttp middleware: each API request (under /v1/) in a server span continued from the caller's
        traceparent, named by its route, with the request id and the status as the metrics count it
        (jev_common.outcome); a 5xx marks it an error, a caller that left (499) does not. Place it after
        request_id_middleware (it reads the id) and before error_middleware (it sees the answer's status)."""
        from opentelemetry.trace import SpanKind, Status, StatusCode

        tracer, propagator = self.tracer, self._propagator

        @web.middleware
        async def tracing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.path.startswith(TRACED_PREFIX):
                return await handler(request)
            resource = request.match_info.route.resource
            route = resource.canonical if resource is not None else request.path
            attributes = {
                "http.request.method": request.method,
                "http.route": route,
                "url.path": request.path,
                REQUEST_ID_ATTRIBUTE: request.get(REQUEST_ID, ""),
            }
            parent = propagator.extract(request.headers)
            with tracer.start_as_current_span(
                f"{request.method} {route}",
                context=parent,
                kind=SpanKind.SERVER,
                attributes=attributes,
                record_exception=False,  # recorded below, where the outcome is an error
                set_status_on_exception=False,
            ) as span:
                status = 500
                try:
                    response = await handler(request)
                    status = status_of(response)
                    return response
                except BaseException as exc:
                    status = status_of(exc)
                    if is_error(status):
                        span.record_exception(exc)
                    raise
                finally:
                    span.set_attribute("http.response.status_code", status)
                    if is_error(status):
                        span.set_status(Status(StatusCode.ERROR))

        return tracing_middleware

    def middlewares(self) -> list[Middleware]:
        """[the middleware] when tracing is on, else nothing to install."""
        return [self.middleware()] if self.enabled else []

    async def shutdown(self) -> None:
        """Export what is buffered and stop (the service is stopping)."""
        if self._provider is not None:
            await asyncio.to_thread(self._provider.shutdown)
            self._provider = None
