"""The worker's HTTP surface."""
from __future__ import annotations

import asyncio

from aiohttp import web

from jev_common.errors import error_body
from jev_common.http import error_middleware, read_model
from jev_common.schema import DecisionRequest, DecisionResponse

from .service import WorkerService
from .settings import WorkerSettings

SERVICE = web.AppKey("service", WorkerService)


def response_json(response: DecisionResponse) -> dict:
    """Kind-specific fields only when they apply; choice_index/choice always (null when noul wins)."""
    body = response.model_dump(mode="json", exclude_none=True)
    body.setdefault("choice_index", None)
    body.setdefault("choice", None)
    return body


def create_app(settings: WorkerSettings, *, wait_until_ready: bool = False) -> web.Application:
    service = WorkerService(settings)
    app = web.Application(middlewares=[service.metrics.middleware, error_middleware],
                          client_max_size=settings.max_body_bytes)
    app[SERVICE] = service

    async def lifecycle(_app: web.Application):
        task = asyncio.create_task(service.start())
        if wait_until_ready:
            await task
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await service.stop()

    app.cleanup_ctx.append(lifecycle)

    async def health(_request: web.Request) -> web.Response:
        code, body = await service.health()
        if code != 200:
            message = f"worker is {service.state}" + (f": {service.error}" if service.error else "")
            return web.json_response({**error_body("not_ready", message), **body}, status=code)
        return web.json_response(body)

    async def systemone(request: web.Request) -> web.Response:
        decision = await read_model(request, DecisionRequest, settings.max_body_bytes)
        response, headers = await service.decide(decision)
        return web.json_response(response_json(response), headers=headers)

    async def cache_stats(_request: web.Request) -> web.Response:
        return web.json_response(text=service.cache_stats().model_dump_json())

    async def cache_reset(_request: web.Request) -> web.Response:
        service.reset_counters()
        return web.json_response(text=service.cache_stats().model_dump_json())

    app.router.add_get("/health", health)
    app.router.add_post("/v1/systemone", systemone)
    app.router.add_get("/metrics", service.metrics.handle_metrics)
    app.router.add_get("/v1/cache/stats", cache_stats)
    app.router.add_post("/v1/cache/reset", cache_reset)
    return app
