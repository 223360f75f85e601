"""The frontend's aiohttp application: validate at the edge, forward the original bytes, pass the answer through."""
from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from jev_common.errors import ApiError
from jev_common.http import (
    REQUEST_ID, REQUEST_ID_HEADER, auth_middleware, error_middleware, parse_model, read_systemone_body, request_id_middleware,
)
from jev_common.metrics import HttpMetrics
from jev_common.schema import DecisionRequest, SystemOneRequest, is_envelope

from .proxy import DECISION_HEADER_PREFIX, Backend, BackendMetrics
from .settings import Settings

log = logging.getLogger("jev_frontend")

DEADLINE_GRACE_S = 0.25
SETTINGS = web.AppKey("settings", Settings)
BACKEND = web.AppKey("backend", Backend)
METRICS = web.AppKey("metrics", HttpMetrics)

# Text-generation APIs other stacks expose. This stack is decisions only, so they get a pointed 404
# instead of being forwarded.
GENERATION_ROUTES = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/embeddings",
    "/generate",
    "/generate_stream",
)


def _backend_headers(request: web.Request, content_type: str | None = None) -> dict[str, str]:
    """What the worker needs of the caller's headers: the body's type, x-jev-* and the request id
    (so both services log and answer the same id). The API key stays here: the frontend checked it."""
    headers = {REQUEST_ID_HEADER: request[REQUEST_ID]}
    if content_type:
        headers["Content-Type"] = content_type
    headers.update({k: v for k, v in request.headers.items() if k.lower().startswith(DECISION_HEADER_PREFIX)})
    return headers


async def handle_systemone(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    body = await read_systemone_body(request, settings.max_body_bytes)  # decompressed, within the cap
    timeout_s, note = settings.timeout_s, ""
    if is_envelope(body.payload):
        parse_model(SystemOneRequest, body.payload)  # junk never reaches the worker
    else:
        decision = parse_model(DecisionRequest, body.payload)
        if decision.deadline_s is not None and decision.deadline_s + DEADLINE_GRACE_S < timeout_s:
            # the worker enforces deadline_s itself; the grace lets its own 504 answer arrive first
            timeout_s, note = decision.deadline_s + DEADLINE_GRACE_S, " (the request's deadline_s + grace)"
    answer = await request.app[BACKEND].call(
        "POST", "/v1/systemone", endpoint="systemone", timeout_s=timeout_s,
        data=body.raw, headers=_backend_headers(request, body.content_type), timeout_note=note,
    )
    return web.Response(status=answer.status, body=answer.body, headers=answer.passthrough_headers())


async def handle_models(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    answer = await request.app[BACKEND].call("GET", "/v1/models", endpoint="models", timeout_s=settings.timeout_s,
                                             headers=_backend_headers(request))
    return web.Response(status=answer.status, body=answer.body, headers=answer.passthrough_headers())


async def handle_health(request: web.Request) -> web.Response:
    """Healthy only when the worker is: its status and body pass through."""
    settings = request.app[SETTINGS]
    answer = await request.app[BACKEND].call("GET", "/health", endpoint="health", timeout_s=settings.timeout_s)
    if answer.status != 200 and answer.status < 400:
        raise ApiError(
            502, "backend_unavailable",
            f"backend {settings.backend_url} answered GET /health with unexpected status {answer.status}",
        )
    return web.Response(status=answer.status, body=answer.body, headers=answer.passthrough_headers())


async def handle_metrics(request: web.Request) -> web.Response:
    """The frontend's own exposition, then the worker's appended (best effort)."""
    settings = request.app[SETTINGS]
    worker_text = b""
    try:
        answer = await request.app[BACKEND].call("GET", "/metrics", endpoint="metrics", timeout_s=settings.timeout_s)
    except ApiError as exc:
        log.info("worker metrics not appended: %s", exc.message)
    else:
        if answer.status == 200:
            worker_text = answer.body
        else:
            log.info("worker metrics not appended: GET /metrics answered %s", answer.status)
    # Rendered after the worker call, so jev_frontend_backend_up reflects this very scrape.
    body = generate_latest(request.app[METRICS].registry)
    if worker_text:
        if not body.endswith(b"\n"):
            body += b"\n"
        body += worker_text if worker_text.endswith(b"\n") else worker_text + b"\n"
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def handle_generation(request: web.Request) -> web.Response:
    raise ApiError(
        404, "not_found",
        f"{request.path} is not served: this stack serves only POST /v1/systemone decisions "
        "(no text generation or OpenAI-compatible API)",
    )


def create_app(settings: Settings) -> web.Application:
    metrics = HttpMetrics("frontend")
    backend = Backend(settings, BackendMetrics(metrics.registry))
    app = web.Application(
        middlewares=[request_id_middleware, metrics.middleware, error_middleware, auth_middleware(settings.api_keys)],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[BACKEND] = backend
    app[METRICS] = metrics

    async def backend_client(_app: web.Application):
        await backend.start()
        log.info("frontend proxying to %s (timeout %gs, %d connections)",
                 settings.backend_url, settings.timeout_s, settings.max_connections)
        yield
        await backend.close()

    app.cleanup_ctx.append(backend_client)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/v1/systemone", handle_systemone)
    app.router.add_get("/v1/models", handle_models)
    for path in GENERATION_ROUTES:
        app.router.add_route("*", path, handle_generation)
    return app
