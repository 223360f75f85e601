"""API errors and their single JSON envelope."""
from __future__ import annotations

from aiohttp import web

from .schema import ErrorBody, ErrorEnvelope


class ApiError(Exception):
    """An error with an HTTP status and a stable machine-readable type."""

    def __init__(self, status: int, type_: str, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers or {}


def error_body(type_: str, message: str) -> dict:
    return ErrorEnvelope(error=ErrorBody(type=type_, message=message)).model_dump()


def error_response(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(type_, message), status=status, headers=headers)


HTTP_ERROR_TYPES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    422: "validation_error",
    429: "overloaded",
    502: "backend_unavailable",
    503: "unavailable",
    504: "timeout",
}
