"""jev_common.tracing: on only with an OTLP endpoint (and not OTEL_SDK_DISABLED), nothing of OpenTelemetry imported
or installed when off; the worker's timeline as spans; the preencoder continuing the caller's trace on
/v1/preencode with the asset keys it made. Across real processes: tests/stack/test_observability.py."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from jev_common.assets import asset_key
from jev_common.timeline import Timeline
from jev_common.tracing import Tracing, tracing_wanted
from jev_preencoder.service import build_app
from jev_preencoder.settings import PreencoderSettings
from jev_worker.telemetry.tracing import WorkerSpans

from .vl_helpers import png_uri, request_line, tiny_encoder, tiny_vl_checkpoint

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "env, on",
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_on_only_with_an_endpoint_and_not_disabled(env, on):
    assert tracing_wanted(env) is on
    tracing = Tracing("jev-test", env=env)
    assert tracing.enabled is on and bool(tracing.middlewares()) is on


def test_off_imports_nothing_of_opentelemetry():
    """The services built with tracing off: no middleware, and OpenTelemetry never imported (it costs nothing)."""
    program = (
        "import sys\n"
        "from jev_frontend.app import create_app\n"
        "from jev_frontend.settings import Settings\n"
        "from jev_preencoder.service import build_app\n"
        "from jev_preencoder.settings import PreencoderSettings\n"
        "import jev_worker.app\n"
        "app = create_app(Settings(backend_url='http://127.0.0.1:9'))\n"
        "build_app(PreencoderSettings(model_path='/nowhere', device='cpu', asset_dir='/tmp', redis_url='none'))\n"
        "names = [m.__name__ for m in app.middlewares]\n"
        "print(sorted(n for n in sys.modules if n.startswith('opentelemetry')), 'tracing_middleware' in names)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{ROOT / 'services'}:{ROOT}", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[] False"


def test_the_worker_timeline_becomes_spans_at_its_own_points():
    exporter = InMemorySpanExporter()
    tracing = Tracing("jev-worker", env={}, exporter=exporter)
    timeline = Timeline(start=100.0)
    timeline.add("parse", 100.0, 100.001)
    timeline.add("asset", 100.001, 100.003, key="abc", l2="miss")
    timeline.add("prepare", 100.003, 100.010)
    timeline.add("queue", 100.010, 100.050)
    timeline.add("batch", 100.050, 100.060)
    timeline.add("device", 100.060, 100.160, rows=3, requests=2, l3="hit")
    timeline.add("readout", 100.160, 100.170)
    timeline.add("respond", 100.170, 100.171)
    with tracing.span("POST /v1/systemone", kind="server") as root:
        WorkerSpans(tracing).record(timeline)
    tracing._provider.force_flush()
    spans = {s.name: s for s in exporter.get_finished_spans()}
    assert set(spans) == {
        "POST /v1/systemone",
        "admission",
        "asset lookup",
        "queue wait",
        "batch",
        "device forward",
        "readout",
        "respond",
    }

    def seconds(name):
        return (spans[name].end_time - spans[name].start_time) / 1e9

    assert seconds("admission") == pytest.approx(0.010, abs=2e-6)  # parse + asset + prepare
    assert seconds("queue wait") == pytest.approx(0.040, abs=2e-6)
    assert seconds("batch") == pytest.approx(0.110, abs=2e-6)  # the host's part and the device's
    assert seconds("device forward") == pytest.approx(0.100, abs=2e-6)
    root_id = root.get_span_context().span_id
    assert spans["asset lookup"].parent.span_id == spans["admission"].context.span_id
    assert spans["asset lookup"].attributes["jev.asset.key"] == "abc"
    assert spans["device forward"].parent.span_id == spans["batch"].context.span_id
    assert dict(spans["batch"].attributes) == {"jev.batch.rows": 3, "jev.batch.requests": 2, "jev.cache.l3": "hit"}
    for name in ("admission", "queue wait", "batch", "readout", "respond"):
        assert spans[name].parent.span_id == root_id, name
    assert spans["queue wait"].start_time == spans["admission"].end_time  # back to back, as the stages


async def test_the_preencoder_continues_the_callers_trace_and_names_its_assets(tmp_path):
    exporter = InMemorySpanExporter()
    tracing = Tracing("jev-preencoder", env={}, exporter=exporter)
    settings = PreencoderSettings(
        model_path=tiny_vl_checkpoint(), device="cpu", dtype="float32", asset_dir=str(tmp_path), redis_url="none"
    )
    trace_id, caller = secrets.token_hex(16), secrets.token_hex(8)
    uri = png_uri(61)
    async with TestClient(TestServer(build_app(settings, encoder=tiny_encoder(), tracing=tracing))) as client:
        for _ in range(100):
            if (await client.get("/health")).status == 200:
                break
        response = await client.post(
            "/v1/preencode", data=json.dumps([request_line(uri)]), headers={"traceparent": f"00-{trace_id}-{caller}-01"}
        )
        assert response.status == 200
        request_id = response.headers["x-typesafe-request-id"]
    spans = {s.name: s for s in exporter.get_finished_spans()}  # the app's cleanup flushed them
    assert set(spans) == {"POST /v1/preencode", "encode"}  # /health is not traced
    server, encode = spans["POST /v1/preencode"], spans["encode"]
    assert f"{server.context.trace_id:032x}" == trace_id and f"{server.parent.span_id:016x}" == caller
    assert encode.parent.span_id == server.context.span_id
    assert server.attributes["jev.request_id"] == request_id
    assert (
        list(encode.attributes["jev.asset.keys"]) == [asset_key(uri)] and encode.attributes["jev.preencode.done"] == 1
    )


async def test_a_caller_that_left_is_499_in_the_span_as_in_the_metrics_and_no_error():
    """One status for both observers (jev_common.outcome): a caller that left is no server error in the trace either;
    a handler that fails is 500 and an error, its exception recorded."""
    import asyncio
    import contextlib

    import aiohttp
    from aiohttp import web
    from opentelemetry.trace import StatusCode

    from jev_common.metrics import HttpMetrics

    exporter = InMemorySpanExporter()
    tracing = Tracing("jev-test", env={}, exporter=exporter)
    metrics = HttpMetrics("svc")

    async def handler(request: web.Request) -> web.Response:
        if request.match_info["what"] == "left":
            raise asyncio.CancelledError()  # what aiohttp raises in a handler whose caller disconnected
        raise RuntimeError("boom")

    app = web.Application(middlewares=[*tracing.middlewares(), metrics.middleware])
    app.router.add_post("/v1/{what}", handler)
    async with TestClient(TestServer(app)) as client:
        for what in ("left", "failed"):
            with contextlib.suppress(aiohttp.ClientError):
                await client.post(f"/v1/{what}")
    await tracing.shutdown()
    spans = {s.attributes["url.path"]: s for s in exporter.get_finished_spans()}
    left, failed = spans["/v1/left"], spans["/v1/failed"]
    assert left.attributes["http.response.status_code"] == 499 and left.status.status_code != StatusCode.ERROR
    assert not left.events  # no exception recorded for a caller that left
    assert failed.attributes["http.response.status_code"] == 500 and failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    text = metrics.exposition().decode()
    assert 'route="/v1/{what}",status="499"' in text and 'route="/v1/{what}",status="500"' in text
