"""Errors: typed domain errors, and the one table that gives each its HTTP status and API error type.

Code raises what went wrong (`Overloaded`, `DeadlineExceeded`, `ImageNotPrepared`, ...), where it is found,
without HTTP in mind. `ERRORS` below is the only place that maps each to a status, the API's `error_type`
and headers; `http_error` turns a raised error into the `ApiError` that the services' error middleware
(jev_common.http) answers in the System One API's shapes:

- validation failures: 422 `{"detail": [{"loc": ["body", ...], "msg", "type"}]}` (FastAPI's shape, which
  TypeSafe's API and its SDKs use);
- everything else: `{"detail": {"error_type": "...", "message": "..."}}`.

docs/CONTRACTS.md's error table is rendered from `ERRORS` (`python -m tools.env_tables --write`; checked by
tests/unit/test_errors.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web


class DomainError(Exception):
    """Something a request cannot get, named by its class; `ERRORS` gives its status and error type.

    `loc` locates a validation failure in the body; `details` are FastAPI-shaped validation details when a
    parser found several; `retry_after` (seconds) is a hint for errors a client may retry; `headers` are more
    headers its answer carries (the rate limits' `x-ratelimit-*`)."""

    def __init__(
        self,
        message: str,
        loc: tuple[str | int, ...] = (),
        *,
        kind: str = "value_error",
        details: list[dict[str, Any]] | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.kind = kind
        self.details = details
        self.retry_after = retry_after
        self.headers = dict(headers or {})

    # read from ERRORS (the one mapping), for logs, metrics and tests
    @property
    def status(self) -> int:
        return spec_of(self).status

    @property
    def type(self) -> str:
        return spec_of(self).type


# ----- the request ------------------------------------------------------------------------------
class InvalidRequest(DomainError):
    """The body is not a valid request: malformed JSON, wrong types, values out of range."""


class TooManyOptions(InvalidRequest):
    """A question has more options than the served model can tell apart."""


class UnreadableInput(InvalidRequest):
    """Text the served model cannot read as given: a control token of its tokenizer, a blank question, a
    state or sequence past what its layout holds."""


class PromptTooLong(UnreadableInput):
    """A prompt (or the state or instructions in it) past the served model's limit, counted in tokens, or in
    characters before any tokenising; decided before any forward."""


class DuplicateKey(InvalidRequest):
    """A JSON object in the body names the same key twice (a question id, an option name): JSON parsers keep
    one of them silently, so the request would lose a question or an option."""


class UnsupportedQuestionType(DomainError):
    """The served readout has no answer for this question type (e.g. noul on a code readout)."""


class UnsupportedRequestForm(DomainError):
    """A request form the served readout does not answer (e.g. the single-question form)."""


class ImagesNotSupported(DomainError):
    """An image in a request to a model that reads text states only."""


class ImageNotPrepared(DomainError):
    """An image whose asset the preencoder has not written (the worker never decodes pixels)."""


class ImageInvalid(DomainError):
    """An image asset that exists but cannot be used (corrupt, or made for another checkpoint)."""


class ModelNotServed(DomainError):
    """The request names a model this service does not serve."""


class MalformedBody(DomainError):
    """A body that cannot be read as what its content type says (e.g. multipart without a boundary)."""


class UndecodableBody(DomainError):
    """A compressed body that does not decompress as its Content-Encoding says."""


class NotJson(DomainError):
    """A body that is not UTF-8 JSON where the route reads JSON lines (the preencoder's manifest)."""


class UnsupportedMediaType(DomainError):
    """A body whose Content-Type the route does not read (JSON or multipart/form-data)."""


class UnsupportedEncoding(DomainError):
    """A Content-Encoding this service does not decode."""


class BodyTooLarge(DomainError):
    """A body (or an asset or part in it) past its size limit."""


class ApiKeyMissing(DomainError):
    """No API key on a protected route while keys are configured."""


class ApiKeyInvalid(DomainError):
    """An API key that is not one of the configured keys."""


class RouteNotServed(DomainError):
    """A route this stack deliberately does not serve (text generation)."""


# ----- the service ------------------------------------------------------------------------------
class Overloaded(DomainError):
    """The queue is full; retry shortly."""


class RateLimited(DomainError):
    """(frontend) The caller's API key (or address, with keys off) used up its requests or prompt tokens per
    minute (`JEV_RATE_LIMITS`); the answer says when to retry (Retry-After, retry-after-ms) and the limits
    (`x-ratelimit-*`)."""


class ClientOverloaded(Overloaded):
    """One client (API key, or address without keys) has as much work in flight as it may; the others are
    still served. Retry after the Retry-After seconds."""


class Stalled(DomainError):
    """The worker made no progress (no layer or chunk finished, or its event loop blocked) for longer than
    its stall limit while work was running: health answers 503 so that an orchestrator restarts it."""


class NotReady(DomainError):
    """The model is loading, failed to load, or nothing is in rotation to serve it."""


class ShuttingDown(DomainError):
    """The service is stopping and takes no more work; another replica may answer."""


class DeadlineExceeded(DomainError):
    """No decision within the request's deadline."""


class ForwardFailed(DomainError):
    """The model forward raised for a batch (a bug or a device fault, logged with its trace)."""


class ExternalServerFailed(DomainError):
    """The family's own server (external backend) refused, failed, or answered something malformed."""


class ExternalServerTimeout(DeadlineExceeded):
    """The family's own server gave no answer within the deadline."""


class BackendUnavailable(DomainError):
    """(frontend) No worker of the model could be reached, or it answered something unusable."""


class BackendTimeout(DomainError):
    """(frontend) The worker gave no answer within the frontend's timeout."""


@dataclass(frozen=True)
class ErrorSpec:
    status: int
    type: str
    retry_after: float | None = None  # default Retry-After seconds, when the error is worth retrying


ERRORS: dict[type[DomainError], ErrorSpec] = {
    InvalidRequest: ErrorSpec(422, "validation_error"),
    TooManyOptions: ErrorSpec(422, "validation_error"),
    UnreadableInput: ErrorSpec(422, "validation_error"),
    PromptTooLong: ErrorSpec(422, "validation_error"),
    DuplicateKey: ErrorSpec(422, "validation_error"),
    UnsupportedQuestionType: ErrorSpec(422, "unsupported_question_type"),
    UnsupportedRequestForm: ErrorSpec(422, "unsupported_request_form"),
    ImagesNotSupported: ErrorSpec(422, "image_not_supported"),
    ImageNotPrepared: ErrorSpec(422, "asset_not_prepared"),
    ImageInvalid: ErrorSpec(422, "asset_invalid"),
    ModelNotServed: ErrorSpec(400, "api_usage_error"),
    MalformedBody: ErrorSpec(400, "bad_request"),
    UndecodableBody: ErrorSpec(400, "invalid_encoding"),
    NotJson: ErrorSpec(400, "invalid_json"),
    UnsupportedEncoding: ErrorSpec(415, "unsupported_media_type"),
    UnsupportedMediaType: ErrorSpec(415, "unsupported_media_type"),
    BodyTooLarge: ErrorSpec(413, "body_too_large"),
    ApiKeyMissing: ErrorSpec(403, "authentication_error"),
    ApiKeyInvalid: ErrorSpec(401, "authentication_error"),
    RouteNotServed: ErrorSpec(404, "not_found"),
    Overloaded: ErrorSpec(429, "overloaded", retry_after=1),
    ClientOverloaded: ErrorSpec(429, "overloaded", retry_after=1),
    RateLimited: ErrorSpec(429, "rate_limit_error", retry_after=1),
    Stalled: ErrorSpec(503, "stalled"),
    NotReady: ErrorSpec(503, "not_ready"),
    ShuttingDown: ErrorSpec(503, "unavailable", retry_after=1),
    DeadlineExceeded: ErrorSpec(504, "deadline_exceeded"),
    ExternalServerTimeout: ErrorSpec(504, "deadline_exceeded"),
    ForwardFailed: ErrorSpec(500, "model_error"),
    ExternalServerFailed: ErrorSpec(502, "backend_unavailable"),
    BackendUnavailable: ErrorSpec(502, "backend_unavailable"),
    BackendTimeout: ErrorSpec(504, "backend_timeout"),
}
DOMAIN_ERRORS = ERRORS  # the name earlier code and tests use

# statuses aiohttp itself answers (unknown routes, methods, malformed HTTP), with the API's error type
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
    500: "internal_error",
    502: "backend_unavailable",
    503: "unavailable",
    504: "timeout",
}


def spec_of(exc: DomainError) -> ErrorSpec:
    """The table's entry for `exc`: its own class's, else its nearest mapped base class's."""
    for cls in type(exc).__mro__:
        if cls in ERRORS:
            return ERRORS[cls]
    raise TypeError(f"{type(exc).__name__} is not in jev_common.errors.ERRORS")


def domain_error_type(exc: DomainError) -> str:
    """The API error type a domain error is answered with (also the metrics' outcome label)."""
    return spec_of(exc).type


def validation_error(message: str, loc: tuple[str | int, ...] = (), type_: str = "value_error") -> InvalidRequest:
    return InvalidRequest(message, loc, kind=type_)


# ----- HTTP -------------------------------------------------------------------------------------
class ApiError(Exception):
    """An error as HTTP answers it: status, error type, message, headers, validation details. Built from a
    domain error by `http_error` (the services raise domain errors; test fakes may build these directly)."""

    def __init__(
        self,
        status: int,
        type_: str,
        message: str,
        headers: dict[str, str] | None = None,
        details: list[dict[str, Any]] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.headers = headers or {}
        self.details = details


def http_error(exc: DomainError) -> ApiError:
    spec = spec_of(exc)
    retry_after = exc.retry_after if exc.retry_after is not None else spec.retry_after
    headers = {"Retry-After": f"{max(1, round(retry_after))}"} if retry_after is not None else {}
    headers.update(exc.headers)
    details = exc.details
    if details is None and spec.type == "validation_error":
        details = [{"loc": ["body", *exc.loc], "msg": exc.message, "type": exc.kind}]
    return ApiError(spec.status, spec.type, exc.message, headers, details)


domain_api_error = http_error  # the name earlier code and tests use


def error_body(type_: str, message: str) -> dict[str, Any]:
    return {"detail": {"error_type": type_, "message": message}}


def error_payload(exc: ApiError) -> dict[str, Any]:
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


def api_error_response(exc: ApiError | DomainError) -> web.Response:
    if isinstance(exc, DomainError):
        exc = http_error(exc)
    return web.json_response(error_payload(exc), status=exc.status, headers=exc.headers)


def markdown_table() -> str:
    """The error table of docs/CONTRACTS.md, rendered from ERRORS and HTTP_ERROR_TYPES."""
    rows = ["| error_type | status | raised as | when |", "|---|---|---|---|"]
    for cls, spec in sorted(ERRORS.items(), key=lambda item: (item[1].status, item[1].type, item[0].__name__)):
        doc = " ".join((cls.__doc__ or "").split())
        retry = f" (Retry-After {spec.retry_after:g} s)" if spec.retry_after is not None else ""
        rows.append(f"| `{spec.type}` | {spec.status} | `{cls.__name__}` | {doc}{retry} |")
    mapped = {(spec.status, spec.type) for spec in ERRORS.values()}
    for status, type_ in sorted(HTTP_ERROR_TYPES.items()):
        if (status, type_) not in mapped:
            rows.append(
                f"| `{type_}` | {status} | (HTTP) | answered by the HTTP layer itself (unknown routes or methods, "
                "malformed HTTP, a failure no code anticipated) |"
            )
    return "\n".join(rows)
