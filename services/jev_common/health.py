"""`GET /health` answers, one shape in every service: `{"status": word, "detail": {...}}`, 200 while the service
is ready; otherwise the status and error type of the domain error that says why (jev_common.errors.ERRORS), its
`error_type` and `message` added to `detail`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from .errors import DomainError, spec_of


def health_body(status: str, detail: dict[str, Any], problem: DomainError | None = None) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of a health answer; `problem` is why the service is not ready (None: it is)."""
    if problem is None:
        return 200, {"status": status, "detail": detail}
    spec = spec_of(problem)
    return spec.status, {"status": status, "detail": {**detail, "error_type": spec.type, "message": problem.message}}


def health_response(status: str, detail: dict[str, Any], problem: DomainError | None = None) -> web.Response:
    code, body = health_body(status, detail, problem)
    return web.json_response(body, status=code)
