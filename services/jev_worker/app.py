"""The worker's HTTP surface."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web

from jev_common.errors import Stalled, api_error_response, validation_error
from jev_common.health import health_response
from jev_common.http import (
    caller_retries,
    client_key,
    error_middleware,
    parse_model,
    read_systemone_body,
    request_deadline,
    request_id_middleware,
    request_priority,
)
from jev_common.identity import CallerIdentity
from jev_common.internal_auth import backend_guard
from jev_common.schema import (
    LATEST_ALIAS,
    DecisionRequest,
    DecisionResponse,
    ModelInfo,
    ModelList,
    SystemOneRequest,
    is_envelope,
)
from jev_common.timeline import Timeline
from jev_common.tracing import Tracing

from .scheduling.scheduler import Caller
from .service import WorkerService
from .settings import WorkerSettings
from .telemetry.tracing import WorkerSpans

SERVICE = web.AppKey("service", WorkerService)


def response_json(response: DecisionResponse) -> dict:
    """Kind-specific fields only when they apply; choice_index/choice always (null when noul wins)."""
    body = response.model_dump(mode="json", exclude_none=True)
    body.setdefault("choice_index", None)
    body.setdefault("choice", None)
    return body


def model_list(
    recipe,
    revision: str | None = None,
    code_version: str | None = None,
    coherence: tuple[list[str] | None, dict | None] = (None, None),
    readout: str | None = None,
) -> ModelList:
    """The served recipe under its own name, and as the API's default alias, with the checkpoint revision, the
    code version and the readout that answer it."""
    description = " ".join(recipe.description.split()) or recipe.name
    made_by = {
        "x_revision": revision,
        "x_code_version": code_version,
        "x_modality": recipe.model.modality,
        "x_coherence": coherence[0],
        "x_coherence_types": coherence[1],
        "x_readout": readout,
    }
    return ModelList(
        models=[
            ModelInfo(name=recipe.name, description=description, release_date=recipe.release_date, **made_by),
            ModelInfo(
                name=LATEST_ALIAS, description=f"alias of {recipe.name}", release_date=recipe.release_date, **made_by
            ),
        ]
    )


def create_app(
    settings: WorkerSettings,
    *,
    wait_until_ready: bool = False,
    tracing: Tracing | None = None,
    on_ready: Callable[[], None] | None = None,
) -> web.Application:
    """`tracing`: the OTEL_* environment's (on only with an OTLP endpoint) unless given; `on_ready`: called once
    the model is loaded and warm, before the worker says ok (the process freezes its heap there: __main__)."""
    service = WorkerService(settings, on_ready=on_ready)
    spans = WorkerSpans(tracing or Tracing("jev-worker"))
    app = web.Application(
        middlewares=[
            request_id_middleware,
            *spans.middlewares(),  # a server span per API request, continued from the frontend's (tracing on only)
            service.metrics.middleware,
            error_middleware,
            backend_guard(settings.internal_tokens, settings.api_keys, internal_prefixes=("/v1/cache/",)),
        ],
        client_max_size=settings.max_body_bytes,
    )
    app[SERVICE] = service
    identity = CallerIdentity.for_tokens(settings.internal_tokens)  # direct callers, named as the frontend names them

    async def lifecycle(_app: web.Application):
        task = asyncio.create_task(service.start())
        if wait_until_ready:
            await task
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()
        await spans.shutdown()  # the spans still buffered, exported

    app.cleanup_ctx.append(lifecycle)

    async def health(_request: web.Request) -> web.Response:
        return health_response(*await service.health())

    async def live(_request: web.Request) -> web.Response:
        """Liveness (a Kubernetes livenessProbe): 200 while the worker makes progress, loading and draining
        included; 503 only when it is stalled (telemetry/watchdog.py), which a restart may cure. Readiness is
        /health."""
        stalled = service.stalled()
        if stalled:
            return api_error_response(Stalled(f"worker is stalled: {stalled}"))
        return web.json_response({"status": "alive", "state": service.state})

    async def systemone(request: web.Request) -> web.Response:
        timeline = Timeline()
        try:
            return await answer(request, timeline)
        finally:
            service.metrics.observe_stages(timeline)
            spans.record(timeline)  # the same stages as spans (tracing on only)

    async def answer(request: web.Request, timeline: Timeline) -> web.Response:
        deadline_s = request_deadline(request.headers, settings.max_deadline_s)
        caller = Caller(
            client_key(request, identity),
            caller_retries(request.headers),
            bulk=request_priority(request.headers) == "bulk",
        )
        body = await read_systemone_body(request, settings.max_body_bytes)
        if not is_envelope(body.payload):
            if body.parts:
                raise validation_error("multipart requests use the System One envelope (questions), not `kind`")
            decision = parse_model(DecisionRequest, body.payload)
            timeline.mark("parse")
            response, headers = await service.decide(decision, caller=caller, deadline_s=deadline_s, timeline=timeline)
            out = web.json_response(response_json(response), headers=headers)
        else:
            envelope = parse_model(SystemOneRequest, body.payload)
            timeline.mark("parse")
            answered, headers = await service.systemone(
                envelope, body.parts, caller=caller, deadline_s=deadline_s, timeline=timeline
            )
            out = web.json_response(text=answered.model_dump_json(), headers=headers)
        timeline.mark("respond")
        return out

    async def models(_request: web.Request) -> web.Response:
        return web.json_response(
            text=model_list(
                service.recipe, service.identity, service.code_version, service.coherence(), service.readout_name()
            ).model_dump_json(exclude_none=True)
        )

    async def cache_stats(_request: web.Request) -> web.Response:
        return web.json_response(text=service.cache_stats().model_dump_json())

    async def cache_reset(_request: web.Request) -> web.Response:
        service.reset_counters()
        return web.json_response(text=service.cache_stats().model_dump_json())

    app.router.add_get("/health", health)
    app.router.add_get("/livez", live)
    app.router.add_post("/v1/systemone", systemone)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", service.metrics.handle_metrics)
    app.router.add_get("/v1/cache/stats", cache_stats)
    app.router.add_post("/v1/cache/reset", cache_reset)
    return app
