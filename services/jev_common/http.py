"""aiohttp plumbing shared by the services: error middleware, bounded JSON body parsing, app runner."""
from __future__ import annotations

import asyncio
import json
import logging

from aiohttp import web
from pydantic import BaseModel, ValidationError

from .errors import HTTP_ERROR_TYPES, ApiError, error_response

log = logging.getLogger("jev.http")


def format_validation_error(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        parts.append(f"{where}: {err.get('msg')}")
    return "; ".join(parts)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Every failure leaves as the JSON error envelope; never a stack trace."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.type, exc.message, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        type_ = HTTP_ERROR_TYPES.get(exc.status, "http_error")
        message = exc.reason if exc.status != 404 else f"no route {request.method} {request.path}"
        kept = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return error_response(exc.status, type_, message, kept)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - last line of defence: log it, answer the envelope
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal_error", "internal error; see the service log")


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The raw request body, refused with 413 past max_bytes."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, "body_too_large", f"body is {request.content_length} bytes; the limit is {max_bytes}")
    body = bytearray()
    async for chunk in request.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > max_bytes:
            raise ApiError(413, "body_too_large", f"body exceeds the limit of {max_bytes} bytes")
    return bytes(body)


def decode_json(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {exc}") from None


async def read_json(request: web.Request, max_bytes: int) -> object:
    return decode_json(await read_body(request, max_bytes))


def parse_model(model: type[BaseModel], payload: object):
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise ApiError(422, "validation_error", format_validation_error(exc)) from None


async def read_model(request: web.Request, model: type[BaseModel], max_bytes: int):
    return parse_model(model, await read_json(request, max_bytes))


def run_app(app: web.Application, host: str, port: int) -> None:
    """Serve on uvloop when it is there; aiohttp handles SIGTERM/SIGINT for a clean stop."""
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a pinned dependency
        pass
    web.run_app(app, host=host, port=port, access_log=None, print=None, handle_signals=True)
