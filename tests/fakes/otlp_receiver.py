"""A small OTLP/HTTP trace receiver for tests: `POST /v1/traces` with an ExportTraceServiceRequest (protobuf, as the
services' OTLP exporter sends it), decoded with opentelemetry-proto; every span kept as a `ReceivedSpan`.

    async with OtlpReceiver() as receiver:      # on a free loopback port
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
        ...
        spans = await receiver.wait_for(lambda spans: ..., timeout_s=10)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from .net import free_port

KINDS = {0: "unspecified", 1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict = field(default_factory=dict)
    error: bool = False


def _value(any_value):
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind) if kind else None


def decode(body: bytes) -> list[ReceivedSpan]:
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                out.append(
                    ReceivedSpan(
                        service=str(resource.get("service.name", "")),
                        name=span.name,
                        kind=KINDS.get(span.kind, str(span.kind)),
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        error=span.status.code == 2,
                    )
                )
    return out


class OtlpReceiver:
    def __init__(self):
        self.spans: list[ReceivedSpan] = []
        self.posts = 0
        self._runner: web.AppRunner | None = None
        self.url = ""
        self._changed = asyncio.Event()

    async def _traces(self, request: web.Request) -> web.Response:
        if request.content_type != "application/x-protobuf":
            return web.Response(status=415, text=f"expected application/x-protobuf, got {request.content_type}")
        self.spans.extend(decode(await request.read()))
        self.posts += 1
        self._changed.set()
        body = ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=body, content_type="application/x-protobuf")

    async def __aenter__(self) -> OtlpReceiver:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def wait_for(self, predicate, timeout_s: float = 15.0) -> list[ReceivedSpan]:
        """The spans received once `predicate(spans)` holds; AssertionError naming what came when it does not."""
        deadline = time.monotonic() + timeout_s
        while not predicate(self.spans):
            left = deadline - time.monotonic()
            if left <= 0:
                got = sorted({(s.service, s.name) for s in self.spans})
                raise AssertionError(f"spans not received within {timeout_s:g} s; got {got}")
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), min(left, 0.5))
        return list(self.spans)
