"""The frontend's aiohttp application: validate at the edge, route to a replica of the request's model,
forward the original bytes, pass the answer through."""

from __future__ import annotations

import asyncio
import json
import logging
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest

from jev_common.errors import BackendUnavailable, DomainError, NotReady, RouteNotServed
from jev_common.health import health_response
from jev_common.http import (
    CLIENT_HEADER,
    DEADLINE_HEADER,
    PRIORITY_HEADER,
    REQUEST_ID,
    REQUEST_ID_HEADER,
    RETRY_HEADERS,
    auth_middleware,
    error_middleware,
    parse_model,
    read_systemone_body,
    request_deadline,
    request_id_middleware,
    request_priority,
    stream_body,
)
from jev_common.identity import CallerIdentity
from jev_common.index import IndexConnection
from jev_common.index.workers import WorkerDirectory
from jev_common.internal_auth import INTERNAL_TOKEN_HEADER
from jev_common.metrics import HttpMetrics
from jev_common.openapi import description as openapi_description
from jev_common.route_key import envelope_image_keys, legacy_image_keys, state_route_key
from jev_common.schema import DecisionRequest, SystemOneRequest, is_envelope
from jev_common.state_text import render_state
from jev_common.tracing import Tracing

from .buckets import Buckets
from .metrics_merge import merged_exposition
from .page import Page
from .pool import BackendPool
from .proxy import (
    DECISION_HEADER_PREFIX,
    Backend,
    BackendConnectError,
    BackendDisconnected,
    BackendMetrics,
    BackendUnreachable,
)
from .ratelimit import LIMITED_ROUTES, RateLimiter, documented_headers
from .router import Router
from .settings import Settings
from .tracing import FrontendSpans

log = logging.getLogger("jev_frontend")

DEADLINE_GRACE_S = 0.25
RETRIED_ELSEWHERE = (
    "unavailable",
    "not_ready",
)  # a worker's 503s that mean "not here": draining (ShuttingDown), loading
SET_HERE = (CLIENT_HEADER, INTERNAL_TOKEN_HEADER, PRIORITY_HEADER)  # headers a caller may not send on as it wrote them
SETTINGS = web.AppKey("settings", Settings)
BACKEND = web.AppKey("backend", Backend)
POOL = web.AppKey("pool", BackendPool)
ROUTER = web.AppKey("router", Router)
METRICS = web.AppKey("metrics", HttpMetrics)
IDENTITY = web.AppKey("identity", CallerIdentity)
LIMITER = web.AppKey("limiter", RateLimiter)

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
    """What the worker needs of the caller's headers: the body's type, x-jev-* (the deadline among them), the
    SDK's retry headers (a retry may join its first attempt's work) and the request id (so both services log
    and answer the same id); and who the caller is, for the worker's fairness (`x-jev-client`, set here
    whatever the caller sent: the key's HMAC identity, jev_common.identity, or the address), with its priority
    (`x-jev-priority: bulk` passed on as the one value that differs from the default: a caller may lower its own
    priority, never raise it). The API key stays here: the frontend checked it; the backend call carries the
    internal token instead (proxy.Backend), never one a caller sent."""
    headers = {REQUEST_ID_HEADER: request[REQUEST_ID]}
    if content_type:
        headers["Content-Type"] = content_type
    headers.update(
        {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in SET_HERE
            and (k.lower().startswith(DECISION_HEADER_PREFIX) or k.lower() in RETRY_HEADERS)
        }
    )
    headers[CLIENT_HEADER] = request.app[IDENTITY].of(request)  # the caller may not name its own fairness key
    if request_priority(request.headers) == "bulk":
        headers[PRIORITY_HEADER] = "bulk"
    return headers


def _call_timeout(settings: Settings, request: web.Request) -> tuple[float, str]:
    """How long a backend call may take: the caller's own deadline (`x-jev-deadline-s`) plus grace, else the
    frontend's timeout; and the note its 504 adds."""
    deadline_s = request_deadline(request.headers)
    if deadline_s is None:
        return settings.timeout_s, ""
    return deadline_s + DEADLINE_GRACE_S, f" (the request's {DEADLINE_HEADER} + grace)"


def _named(state) -> str:
    """A backend for the start-up log: the model it serves (its /v1/models, or JEV_BACKENDS' name) and its URL."""
    return f"{state.model} at {state.url}" if state.model else f"{state.url} (its model not known yet)"


async def handle_systemone(request: web.Request) -> web.Response:
    started = time.perf_counter()
    settings = request.app[SETTINGS]
    timeout_s, note = _call_timeout(settings, request)  # the caller's own deadline: the worker's and ours
    request_priority(request.headers)  # a value the worker would refuse is refused here, before any body is read
    body = await read_systemone_body(request, settings.max_body_bytes)  # decompressed, within the cap
    if is_envelope(body.payload):
        envelope = parse_model(SystemOneRequest, body.payload)  # junk never reaches the worker
        model: str | None = envelope.model
        images = envelope_image_keys(envelope.assets, body.parts)
        route_key = state_route_key(render_state(envelope.state), images)
    else:
        decision = parse_model(DecisionRequest, body.payload)
        if decision.deadline_s is not None and decision.deadline_s + DEADLINE_GRACE_S < timeout_s:
            # the worker enforces deadline_s itself; the grace lets its own 504 answer arrive first
            timeout_s, note = decision.deadline_s + DEADLINE_GRACE_S, " (the request's deadline_s + grace)"
        text, uris = decision.route_state()
        model, images = None, [key for uri in uris for key in legacy_image_keys(uri)]
        route_key = state_route_key(text, images)
    call = dict(
        endpoint="systemone",
        timeout_s=timeout_s,
        data=body.raw,
        headers=_backend_headers(request, body.content_type),
        timeout_note=note,
    )
    answer = await _routed(request.app, model, route_key, images, call)
    response = web.Response(status=answer.status, body=answer.body, headers=answer.passthrough_headers())
    request.app[BACKEND].metrics.overhead.observe(max(0.0, time.perf_counter() - started - answer.seconds))
    return response


async def _routed(app: web.Application, model: str | None, route_key: str, images: list[str], call: dict):
    """Send the decision to a replica of its model; a replica that refuses the connection, or answers 503
    because it is draining or not ready, is taken out and the next one tried (nothing was computed there).
    Other failures answer 502/504 in the error shape."""
    pool, router, client, metrics = app[POOL], app[ROUTER], app[BACKEND], app[BACKEND].metrics
    if app[SETTINGS].single_backend:  # JEV_BACKEND_URL alone: no model routing, the worker decides
        backend = next(iter(pool.backends.values()))
        with client.spans.routing(model) as routing:
            routing.chose("single", backend)
        return await _send(client, backend, "single", call)
    name = await pool.resolve(model)
    tried: set[str] = set()
    while True:
        with client.spans.routing(name) as routing:  # which replica, and why (tracing)
            route = await router.choose(name, route_key, images, exclude=tried)
            if route is not None:
                routing.chose(route.decision, route.backend, len(tried))
        if route is None:
            raise BackendUnavailable(
                f"no replica of model {name!r} could be reached (tried {', '.join(sorted(tried))})"
            )
        try:
            answer = await _send(client, route.backend, route.decision, call)
            refused = _not_serving(answer)
            if refused is None:
                return answer
            # draining (a rolling update) or not ready: nothing was computed, another replica may answer
            pool.mark_down(route.backend, f"answered 503 {refused}")
            tried.add(route.backend.url)
            if len(tried) >= len(pool.replicas(name)):
                return answer
        except (BackendConnectError, BackendUnreachable) as exc:
            pool.mark_down(route.backend, exc.message)
            tried.add(route.backend.url)
            if len(tried) >= len(pool.replicas(name)):
                raise
        except BackendDisconnected as exc:
            pool.mark_down(route.backend, exc.message)  # back in once its health answers 200
            raise
        finally:
            metrics.routed.labels(route.backend.url, name, route.decision).inc()


def _not_serving(answer) -> str | None:
    """The error type of a decision the worker refused without computing it because it does not serve now
    (`unavailable`: ShuttingDown while it drains; `not_ready` while it loads), else None. A decision is idempotent,
    so such a refusal is retried on another replica."""
    if answer.status != 503:
        return None
    try:
        detail = json.loads(answer.body).get("detail")
    except (ValueError, AttributeError):
        return None
    error_type = detail.get("error_type") if isinstance(detail, dict) else None
    return error_type if error_type in RETRIED_ELSEWHERE else None


async def _send(client: Backend, backend, decision: str, call: dict):
    """The decision's answer from `backend`; BackendUnreachable when its health probe finds it unreachable (a dead
    host or a cut link answers nothing) while the request waits, so that another replica answers it now instead of
    the caller waiting for the deadline. A decision is idempotent: at worst a partitioned worker computes it too."""
    backend.in_flight += 1
    client.metrics.in_flight.labels(backend.url).set(backend.in_flight)
    sent = asyncio.ensure_future(client.call("POST", "/v1/systemone", url=backend.url, **call))
    lost = asyncio.ensure_future(backend.unreachable.wait())
    try:
        await asyncio.wait({sent, lost}, return_when=asyncio.FIRST_COMPLETED)
        if sent.done():
            return sent.result()
        sent.cancel()
        raise BackendUnreachable(f"backend {backend.url} stopped answering (its health probe: {backend.error})")
    finally:
        for task in (sent, lost):
            task.cancel()
        backend.in_flight -= 1
        client.metrics.in_flight.labels(backend.url).set(backend.in_flight)


async def handle_preencode(request: web.Request) -> web.Response:
    """`POST /v1/preencode`, passed on to the preencoder: the caller's key was checked here, the body streams
    through (decompressed, within its cap, never held whole) with the internal token, and the answer passes back."""
    settings = request.app[SETTINGS]
    if not settings.preencoder_url:
        raise RouteNotServed(
            "POST /v1/preencode is not served here: this stack runs no preencoder (the frontend's "
            "JEV_PREENCODER_URL is not set; only vision-language recipes need one)"
        )
    timeout_s, note = _call_timeout(settings, request)
    body = stream_body(request, settings.max_preencode_bytes)
    answer = await request.app[BACKEND].call(
        "POST",
        "/v1/preencode",
        endpoint="preencode",
        url=settings.preencoder_url,
        timeout_s=timeout_s,
        data=body,
        headers=_backend_headers(request, request.headers.get("Content-Type") or "application/json"),
        timeout_note=note,
    )
    return web.Response(status=answer.status, body=answer.body, headers=answer.passthrough_headers())


async def handle_models(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    if not settings.single_backend:
        pool = request.app[POOL]
        if not pool.served_models():
            await pool.refresh()
        models = pool.model_infos()
        if not models:
            raise NotReady("no backend is in rotation, so no model is served right now")
        return web.json_response({"models": models})
    answer = await request.app[BACKEND].call(
        "GET", "/v1/models", endpoint="models", timeout_s=settings.timeout_s, headers=_backend_headers(request)
    )
    return web.Response(status=answer.status, body=answer.body, headers=answer.passthrough_headers())


async def handle_health(request: web.Request) -> web.Response:
    """One backend: its health passes through (status and body, unchanged). Several: every
    backend probed now; 200 while at least one is in rotation ("degraded" when any is out), else 503."""
    settings = request.app[SETTINGS]
    pool = request.app[POOL]
    if settings.single_backend:
        return await _single_health(request, settings, pool)
    await pool.refresh()
    backends = [b.describe() for b in pool.backends.values()]
    models: dict[str, dict[str, int]] = {}
    for b in pool.backends.values():
        entry = models.setdefault(b.model or "?", {"up": 0, "total": 0})
        entry["total"] += 1
        entry["up"] += int(b.up)
    detail = {
        "backends": backends,
        "models": models,
        "default_model": pool.default_model() or None,
        "routing": settings.routing,
    }
    if request.app[LIMITER].enabled:
        detail["rate_limits"] = request.app[LIMITER].health()
    if not any(b.up for b in pool.backends.values()):
        message = "no backend is in rotation" if backends else "no backend is configured or registered yet"
        return health_response("unavailable", detail, NotReady(message))
    degraded = any(not b.up for b in pool.backends.values())
    return health_response("degraded" if degraded else "ok", detail)


async def _single_health(request: web.Request, settings: Settings, pool: BackendPool) -> web.Response:
    """The worker's own health, status and body unchanged (the upstream contract compares them); with rate limits
    on, its `detail` also says where they are kept."""
    backend = next(iter(pool.backends.values()))
    answer = await request.app[BACKEND].call("GET", "/health", endpoint="health", timeout_s=settings.timeout_s)
    if answer.status != 200 and answer.status < 400:
        raise BackendUnavailable(
            f"backend {settings.backend_url} answered GET /health with unexpected status {answer.status}",
        )
    backend.up = answer.status == 200
    body = answer.body
    if request.app[LIMITER].enabled:
        body = _with_detail(body, "rate_limits", request.app[LIMITER].health())
    return web.Response(status=answer.status, body=body, headers=answer.passthrough_headers())


def _with_detail(body: bytes, name: str, value: object) -> bytes:
    """A JSON health body with `detail[name] = value` added (a body that is not such JSON is left as it is)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return body
    if not isinstance(payload, dict) or not isinstance(payload.setdefault("detail", {}), dict):
        return body
    payload["detail"][name] = value
    return json.dumps(payload).encode()


async def handle_metrics(request: web.Request) -> web.Response:
    """The frontend's own exposition, then its workers' (best effort): one worker's appended as is;
    several merged, each sample labelled with its backend."""
    settings = request.app[SETTINGS]
    pool = request.app[POOL]
    targets = (
        [next(iter(pool.backends.values()))] if settings.single_backend else [b for b in pool.backends.values() if b.up]
    )
    texts = {}
    for backend in targets:
        try:
            answer = await request.app[BACKEND].call(
                "GET", "/metrics", endpoint="metrics", url=backend.url, timeout_s=settings.timeout_s
            )
        except DomainError as exc:
            log.info("worker metrics not appended: %s", exc.message)
            continue
        if answer.status == 200:
            texts[backend.url] = answer.body
        else:
            log.info("worker metrics of %s not appended: GET /metrics answered %s", backend.url, answer.status)
    # Rendered after the worker calls, so jev_frontend_backend_up reflects this very scrape.
    body = generate_latest(request.app[METRICS].registry)
    worker_text = next(iter(texts.values()), b"") if settings.single_backend else merged_exposition(texts)
    if worker_text:
        if not body.endswith(b"\n"):
            body += b"\n"
        body += worker_text if worker_text.endswith(b"\n") else worker_text + b"\n"
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def openapi_handler():
    """`GET /openapi.json`: the public API's OpenAPI 3.1 description (jev_common.openapi), with this frontend's
    rate-limit headers; rendered once."""
    body = json.dumps(openapi_description(documented_headers(), LIMITED_ROUTES)).encode()

    async def handle_openapi(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return handle_openapi


async def handle_generation(request: web.Request) -> web.Response:
    raise RouteNotServed(
        f"{request.path} is not served: this stack serves only POST /v1/systemone decisions "
        "(no text generation or OpenAI-compatible API)",
    )


def create_app(settings: Settings, tracing: Tracing | None = None) -> web.Application:
    """`tracing`: the OTEL_* environment's (on only with an OTLP endpoint) unless given."""
    metrics = HttpMetrics("frontend")
    spans = FrontendSpans(tracing or Tracing("jev-frontend"))
    backend = Backend(settings, BackendMetrics(metrics.registry), spans)
    index = None
    if not settings.single_backend and settings.index_url:
        index = IndexConnection(settings.index_url)
    pool = BackendPool(settings, backend, backend.metrics, WorkerDirectory(index) if index is not None else None)
    metrics.watch_index("frontend", lambda: index)
    identity = CallerIdentity.for_tokens(settings.internal_tokens, by_key=bool(settings.api_keys))
    buckets = Buckets(settings.index_url if settings.rate_limits else None, identity.namespace)
    limiter = RateLimiter(settings.rate_limits, settings.api_keys, identity, buckets, metrics.registry)
    app = web.Application(
        middlewares=[
            request_id_middleware,
            *spans.middlewares(),  # a server span per API request (tracing on only)
            metrics.middleware,
            error_middleware,
            auth_middleware(settings.api_keys),
            limiter.middleware(),  # after the key is checked: a wrong key takes nothing from anyone's bucket
        ],
        client_max_size=settings.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[BACKEND] = backend
    app[POOL] = pool
    app[ROUTER] = router = Router(settings, pool, index)
    Gauge(
        "jev_frontend_route_affinity_entries",
        "States the router remembers a replica for (a bounded LRU: it grows to its bound, then stays)",
        registry=metrics.registry,
    ).set_function(lambda: router.remembered)
    app[METRICS] = metrics
    app[IDENTITY] = identity
    app[LIMITER] = limiter

    async def backend_client(_app: web.Application):
        await backend.start()
        if not settings.single_backend:
            await pool.start()
        else:
            await pool.name_backends()  # for the log below only: requests pass through without routing
        log.info(
            "frontend proxying to %s (routing %s, timeout %gs, %d connections)",
            ", ".join(_named(state) for state in pool.backends.values())
            + (" + workers in the index" if settings.discovery else ""),
            settings.routing,
            settings.timeout_s,
            settings.max_connections,
        )
        yield
        await pool.close()
        if index is not None:
            await index.close()
        await buckets.close()
        await backend.close()
        await spans.shutdown()  # the spans still buffered, exported

    app.cleanup_ctx.append(backend_client)
    app.router.add_get("/health", handle_health)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_post("/v1/systemone", handle_systemone)
    app.router.add_get("/v1/models", handle_models)
    app.router.add_post("/v1/preencode", handle_preencode)
    app.router.add_get("/openapi.json", openapi_handler())
    for path in GENERATION_ROUTES:
        app.router.add_route("*", path, handle_generation)
    app.add_routes(Page(settings, pool, backend).routes())  # GET /: the playground and status view
    return app
