"""Service mode: POST /v1/preencode (manifest lines as a JSON array, one object, or JSONL),
GET /health (200 once the model is loaded), GET /metrics.

A backend of the frontend: callers reach `POST /v1/preencode` through the frontend (which checks their API keys
and sends the internal token); with a token configured (`JEV_INTERNAL_TOKENS`) a caller without it is refused
(403, a wrong one 401). `/health` and `/metrics` stay open for probes and Prometheus."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web
from prometheus_client import Counter, Histogram

from jev_common.errors import DomainError, NotJson, NotReady, validation_error
from jev_common.health import health_response
from jev_common.http import error_middleware, read_body, request_id_middleware, run_app
from jev_common.index import IndexConnection
from jev_common.index.assets import AssetIndex
from jev_common.internal_auth import backend_guard
from jev_common.metrics import HttpMetrics
from jev_common.tracing import Tracing

from .settings import PreencoderSettings

log = logging.getLogger("jev.preencoder.service")

STATE = web.AppKey("preencoder", dict)


def parse_manifest_body(body: bytes) -> list:
    """A JSON array of lines, a single JSON object, or JSONL (one object per line; a bad line stays a
    string so its own result says invalid_json)."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotJson(f"body is not UTF-8: {exc}") from None
    if not text.strip():
        raise validation_error("no manifest lines in the body")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError:
        return text.splitlines()  # JSONL
    if isinstance(payload, list):
        return payload
    if isinstance(payload, dict) and isinstance(payload.get("lines"), list):
        return payload["lines"]
    return [payload]


def build_app(settings: PreencoderSettings, encoder=None, tracing: Tracing | None = None) -> web.Application:
    """`tracing`: the OTEL_* environment's (on only with an OTLP endpoint) unless given."""
    tracing = tracing or Tracing("jev-preencoder")
    metrics = HttpMetrics("preencoder")
    images = Counter("jev_preencoder_images_total", "manifest lines by outcome", ["status"], registry=metrics.registry)
    seconds = Histogram(
        "jev_preencoder_request_encode_seconds", "time to encode one POST /v1/preencode", registry=metrics.registry
    )
    app = web.Application(
        middlewares=[
            request_id_middleware,
            *tracing.middlewares(),
            metrics.middleware,
            error_middleware,
            backend_guard(settings.internal_tokens),
        ]
    )
    state = {"encoder": encoder, "index": None, "error": None, "task": None, "lock": asyncio.Lock()}
    app[STATE] = state
    metrics.watch_index("preencoder", lambda: state["index"].connection if state["index"] is not None else None)

    async def load():
        try:
            if state["encoder"] is None:
                from .encode import Encoder

                state["encoder"] = await asyncio.to_thread(Encoder, settings)
            state["encoder"].offload = True
            if settings.redis_url and settings.redis_url.lower() != "none":
                state["index"] = AssetIndex(IndexConnection(settings.redis_url), state["encoder"].identity)
            log.info("preencoder ready (identity %s)", state["encoder"].identity)
        except Exception as exc:  # noqa: BLE001 - reported by /health, the service stays up to say so
            log.exception("model load failed")
            state["error"] = f"{type(exc).__name__}: {exc}"

    async def on_startup(_app):
        state["task"] = asyncio.create_task(load())

    async def on_cleanup(_app):
        if state["task"] is not None and not state["task"].done():
            state["task"].cancel()
        if state["index"] is not None:
            await state["index"].connection.close()
        await tracing.shutdown()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)

    def ready_encoder():
        if state["encoder"] is None or (state["task"] is not None and not state["task"].done()):
            if state["error"]:
                raise NotReady(f"model failed to load: {state['error']}")
            raise NotReady("model is loading")
        return state["encoder"]

    async def health(_request):
        if state["error"]:
            return health_response(
                "unavailable", {"error": state["error"]}, NotReady(f"model failed to load: {state['error']}")
            )
        try:
            encoder_ = ready_encoder()
        except DomainError as exc:
            return health_response("loading", {}, exc)
        detail = {
            "identity": encoder_.identity,
            "processor_identity": encoder_.processor_identity,
            "asset_dir": settings.asset_dir,
            "device": str(encoder_.device),
            "dtype": str(encoder_.dtype),
        }
        if state["index"] is not None:
            detail["index"] = await state["index"].connection.health(state["index"].ns)
        else:
            detail["index"] = {"status": "degraded", "reason": "no Redis URL configured"}
        return health_response("ok", detail)

    async def preencode(request: web.Request):
        encoder_ = ready_encoder()
        lines = parse_manifest_body(await read_body(request, settings.max_body_bytes))
        started = time.perf_counter()
        async with state["lock"]:  # one manifest at a time: the vision tower is the bottleneck anyway
            with tracing.span("encode", **{"jev.preencode.lines": len(lines)}) as span:  # type: ignore[arg-type]
                summary = await encoder_.encode_lines(lines, settings.asset_dir, state["index"])
                if span is not None:  # the assets made, by key: a VL request's trace names the one it used
                    span.set_attributes(
                        {
                            "jev.asset.keys": [r.key for r in summary.results if r.key],
                            **{f"jev.preencode.{k}": v for k, v in summary.counts().items()},
                        }
                    )
        seconds.observe(time.perf_counter() - started)
        for result in summary.results:
            images.labels(result.status).inc()
        return web.json_response(
            {
                "results": [r.answered() for r in summary.results],
                "summary": summary.counts(),
                "identity": encoder_.identity,
            }
        )

    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics.handle_metrics)
    app.router.add_post("/v1/preencode", preencode)
    return app


def serve(settings: PreencoderSettings) -> None:
    run_app(build_app(settings), settings.host, settings.port)
