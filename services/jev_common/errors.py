"""API errors and the one place that turns them into the System One API's error bodies.

- validation failures: 422 `{"detail": [{"loc": ["body", ...], "msg", "type"}]}` (FastAPI's shape, which
  TypeSafe's API and its SDKs use);
- everything else: `{"detail": {"error_type": "...", "message": "..."}}`.
"""
from __future__ import annotations

from aiohttp import web


class ApiError(Exception):
    """An error with an HTTP status and a stable machine-readable type."""

    def __init__(self, status: int, type_: str, message: str, headers: dict[str, str] | None = None,
                 details: list[dict] | None = None):
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers or {}
        self.details = details  # validation errors, FastAPI-shaped


class DomainError(Exception):
    """A request the served model cannot answer, raised where it is found, without HTTP in mind.

    `DOMAIN_ERRORS` below is the one place that gives each its status and error type; the services'
    error middleware (jev_common.http) answers them in the API's error shape."""

    def __init__(self, message: str, loc: tuple = ()):
        super().__init__(message)
        self.message = message
        self.loc = loc


class UnsupportedQuestionType(DomainError):
    """The served readout has no answer for this question type (e.g. noul on a code readout)."""


class TooManyOptions(DomainError):
    """A question has more options than the served model can tell apart."""


class UnsupportedRequestForm(DomainError):
    """A request form the served readout does not answer (e.g. the single-question form)."""


class UnreadableInput(DomainError):
    """Text the served model cannot read as given: a control token of its tokenizer, a blank question, a
    state or sequence past what its layout holds."""


class ImagesNotSupported(DomainError):
    """An image in a request to a readout that answers text states only."""


class ExternalServerFailed(DomainError):
    """The family's own server (external backend) refused, failed, or answered something malformed."""


class ExternalServerTimeout(DomainError):
    """The family's own server gave no answer within the deadline."""


DOMAIN_ERRORS: dict[type[DomainError], tuple[int, str]] = {
    UnsupportedQuestionType: (422, "unsupported_question_type"),
    TooManyOptions: (422, "validation_error"),
    UnsupportedRequestForm: (422, "unsupported_request_form"),
    UnreadableInput: (422, "validation_error"),
    ImagesNotSupported: (422, "image_not_supported"),
    ExternalServerFailed: (502, "backend_unavailable"),
    ExternalServerTimeout: (504, "deadline_exceeded"),
}


def domain_error_type(exc: DomainError) -> str:
    """The API error type a domain error is answered with (also the metrics' outcome label)."""
    return next(v for cls, v in DOMAIN_ERRORS.items() if isinstance(exc, cls))[1]


def domain_api_error(exc: DomainError) -> "ApiError":
    status, type_ = next(v for cls, v in DOMAIN_ERRORS.items() if isinstance(exc, cls))
    if type_ == "validation_error":
        return validation_error(exc.message, exc.loc)
    return ApiError(status, type_, exc.message)


def validation_error(message: str, loc: tuple = (), type_: str = "value_error") -> ApiError:
    return ApiError(422, "validation_error", message,
                    details=[{"loc": ["body", *loc], "msg": message, "type": type_}])


def error_body(type_: str, message: str) -> dict:
    return {"detail": {"error_type": type_, "message": message}}


def error_payload(exc: ApiError) -> dict:
    if exc.details is not None:
        return {"detail": exc.details}
    if exc.status == 422 and exc.type == "validation_error":
        return {"detail": [{"loc": ["body"], "msg": exc.message, "type": "value_error"}]}
    return error_body(exc.type, exc.message)


def error_type_of(body: object) -> str | None:
    """The error type of an error body of either shape (validation errors read as 'validation_error')."""
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):
        return "validation_error"
    if isinstance(detail, dict):
        return detail.get("error_type")
    return None


def error_response(status: int, type_: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(error_body(type_, message), status=status, headers=headers)


def api_error_response(exc: ApiError) -> web.Response:
    return web.json_response(error_payload(exc), status=exc.status, headers=exc.headers)


HTTP_ERROR_TYPES = {
    400: "bad_request",
    401: "authentication_error",
    403: "authentication_error",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    413: "body_too_large",
    414: "uri_too_long",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "overloaded",
    431: "headers_too_large",
    502: "backend_unavailable",
    503: "unavailable",
    504: "timeout",
}
