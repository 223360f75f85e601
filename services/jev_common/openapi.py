"""The OpenAPI 3.1 description of the public API (what the frontend serves at `/openapi.json`), generated: every
body from the pydantic schema (jev_common.schema), every error status and `error_type` from the one error table
(jev_common.errors.ERRORS, HTTP_ERROR_TYPES), the request and answer headers from the constants the code sends and
reads them by. Nothing here restates a field, a status or an error type; what it adds is which errors each route can
answer (ROUTE_ERRORS), the one fact no other table holds.

`description(headers=...)` takes the headers a caller's service adds on top (the frontend's rate limits, from
jev_frontend.ratelimit): jev_common knows nothing of the frontend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from . import errors as E
from .http import (
    CODE_VERSION_HEADER,
    DEADLINE_HEADER,
    DECODED_ENCODINGS,
    MAX_DEADLINE_S,
    MAX_MULTIPART_PARTS,
    MULTIPART_REQUEST_PART,
    PRIORITIES,
    PRIORITY_HEADER,
    REQUEST_ID_HEADER,
    RETRY_COUNT_HEADER,
    REVISION_HEADER,
    SDK_HEADER,
    WORKER_HEADER,
)
from .schema import (
    DecisionRequest,
    DecisionResponse,
    ErrorDetail,
    HealthResponse,
    ModelList,
    PreencodeManifest,
    PreencodeResponse,
    SystemOneRequest,
    SystemOneResponse,
    ValidationItem,
)
from .version import source_version

OPENAPI_VERSION = "3.1.0"
COMPONENTS = "#/components/schemas/"
RETRY_AFTER_HEADER = "Retry-After"  # errors.http_error sets it from ERRORS' retry_after
CACHE_HEADER = "x-jev-cache"  # the worker's per-level cache outcome of a decision (jev_worker.pipeline)

# The HTTP layer's own answers on any route (jev_common.http: malformed HTTP, bodies or headers past their limits, a
# failure no code anticipated), beside each route's domain errors below.
HTTP_LAYER_STATUSES = (400, 413, 431, 500)
# API keys (JEV_API_KEYS, `Authorization: Bearer`) guard the /v1/ routes when they are on.
KEYED = (E.ApiKeyMissing, E.ApiKeyInvalid)
BODY = (
    E.InvalidRequest,
    E.MalformedBody,
    E.UndecodableBody,
    E.UnsupportedEncoding,
    E.UnsupportedMediaType,
    E.BodyTooLarge,
)
UPSTREAM = (E.BackendUnavailable, E.BackendTimeout)  # the frontend's own answers when a backend fails it
# Which domain errors each public route can answer (through the frontend); their statuses and types are ERRORS'.
ROUTE_ERRORS: dict[tuple[str, str], tuple[type[E.DomainError], ...]] = {
    ("post", "/v1/systemone"): KEYED
    + BODY
    + UPSTREAM
    + (
        E.ModelNotServed,
        E.UnsupportedQuestionType,
        E.UnsupportedRequestForm,
        E.ImagesNotSupported,
        E.ImageNotPrepared,
        E.ImageInvalid,
        E.Overloaded,
        E.RateLimited,
        E.NotReady,
        E.ShuttingDown,
        E.DeadlineExceeded,
        E.ForwardFailed,
    ),
    ("post", "/v1/preencode"): KEYED + BODY + UPSTREAM + (E.NotJson, E.RouteNotServed, E.RateLimited, E.NotReady),
    ("get", "/v1/models"): KEYED + UPSTREAM + (E.NotReady,),
    ("get", "/health"): UPSTREAM,
}
# Headers every answer of a route may carry, beyond the error's own (Retry-After).
WORKER_ANSWER_HEADERS = {
    CACHE_HEADER: "per cache level the decision used, its outcome: `l1=hit,l3=miss` (hit, miss, off or bypass)",
    WORKER_HEADER: "which worker answered (its JEV_WORKER_ID)",
    REVISION_HEADER: "the checkpoint that answered (its pinned revision or content digest)",
    CODE_VERSION_HEADER: "the code version that answered",
}


def description(headers: Mapping[str, str] | None = None, limited: tuple[str, ...] = ()) -> dict[str, Any]:
    """The OpenAPI 3.1 document. `headers` (name -> what it says) are optional headers the answers of the `limited`
    routes (paths) may carry besides those documented here (the frontend's rate-limit headers)."""
    schemas, names = _component_schemas()

    def ref(model) -> dict:
        return {"$ref": COMPONENTS + names[model]}

    extra = dict(headers or {})
    paths: dict[str, dict] = {}
    for (method, path), raises in ROUTE_ERRORS.items():
        operation = OPERATIONS[(method, path)](ref)
        operation["responses"].update(_error_responses(raises))
        for response in operation["responses"].values():
            response.setdefault("headers", {})[REQUEST_ID_HEADER] = {"$ref": "#/components/headers/request-id"}
            if path in limited:
                for name in extra:
                    response["headers"][name] = {"$ref": f"#/components/headers/{name}"}
        if any(issubclass(cls, KEYED) for cls in raises):
            operation["security"] = [{}, {"apiKey": []}]  # keys are optional: on only with JEV_API_KEYS
        paths.setdefault(path, {})[method] = operation
    components_headers = {
        "request-id": _header("every answer's request id (the caller's own, when a trusted proxy sent one)", True),
        "retry-after": _header("seconds after which the request may be retried", True, {"type": "string"}),
        **{name: _header(text) for name, text in WORKER_ANSWER_HEADERS.items()},
        **{name: _header(text) for name, text in extra.items()},
    }
    return {
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {
            "title": "jev: the System One API",
            "version": source_version(),
            "description": "One-forward-pass decisions from a language model (README.md, 'The API'). Generated from "
            "jev_common.schema and jev_common.errors; every error is one of the two shapes `ErrorBody` "
            "(`{detail: {error_type, message}}`) and `ValidationErrorBody` (422 `{detail: [{loc, msg, type}]}`).",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "headers": components_headers,
            "securitySchemes": {
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an API key of JEV_API_KEYS, on the /v1/ routes while keys are on",
                }
            },
        },
    }


def _component_schemas() -> tuple[dict[str, Any], dict[type, str]]:
    """The components' schemas (pydantic's, request models as validated, answers as serialized), and each
    model's name among them."""
    models: list[tuple[type[BaseModel], JsonSchemaMode]] = [
        (SystemOneRequest, "validation"),
        (DecisionRequest, "validation"),
        (PreencodeManifest, "validation"),
        (SystemOneResponse, "serialization"),
        (DecisionResponse, "serialization"),
        (ModelList, "serialization"),
        (HealthResponse, "serialization"),
        (PreencodeResponse, "serialization"),
        (ErrorDetail, "serialization"),
        (ValidationItem, "serialization"),
    ]
    refs, top = models_json_schema(models, ref_template=COMPONENTS + "{model}")
    schemas = dict(top.get("$defs", {}))
    names = {model: ref["$ref"].removeprefix(COMPONENTS) for (model, _mode), ref in refs.items()}
    schemas["ErrorBody"] = {
        "type": "object",
        "description": "every error but validation failures: `{detail: {error_type, message}}`",
        "required": ["detail"],
        "properties": {"detail": {"$ref": COMPONENTS + names[ErrorDetail]}},
    }
    schemas["ValidationErrorBody"] = {
        "type": "object",
        "description": "a validation failure (422 validation_error), in FastAPI's shape",
        "required": ["detail"],
        "properties": {
            "detail": {"type": "array", "minItems": 1, "items": {"$ref": COMPONENTS + names[ValidationItem]}}
        },
    }
    return schemas, names


def _header(text: str, required: bool = False, schema: dict | None = None) -> dict:
    return {"description": text, "required": required, "schema": schema or {"type": "string"}}


def _error_responses(raises: tuple[type[E.DomainError], ...]) -> dict[str, dict]:
    """Per status, the error types the route answers with it (ERRORS' own, and the HTTP layer's), in the shape of
    each: `ErrorBody` with error_type one of them; `ValidationErrorBody` where validation_error is one."""
    by_status: dict[int, set[str]] = {}
    retried: set[int] = set()
    for cls in raises:
        spec = E.ERRORS[cls]
        by_status.setdefault(spec.status, set()).add(spec.type)
        if spec.retry_after is not None:
            retried.add(spec.status)
    for status in HTTP_LAYER_STATUSES:
        by_status.setdefault(status, set()).add(E.HTTP_ERROR_TYPES[status])
    out = {}
    for status, types in sorted(by_status.items()):
        body = {
            "allOf": [
                {"$ref": COMPONENTS + "ErrorBody"},
                {"properties": {"detail": {"properties": {"error_type": {"enum": sorted(types)}}}}},
            ]
        }
        shapes = [body] + ([{"$ref": COMPONENTS + "ValidationErrorBody"}] if "validation_error" in types else [])
        response: dict[str, Any] = {
            "description": ", ".join(sorted(types)),
            "content": {"application/json": {"schema": shapes[0] if len(shapes) == 1 else {"anyOf": shapes}}},
        }
        if status in retried:
            response["headers"] = {RETRY_AFTER_HEADER: {"$ref": "#/components/headers/retry-after"}}
        out[str(status)] = response
    return out


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _systemone(ref) -> dict:
    request = {"anyOf": [ref(SystemOneRequest), ref(DecisionRequest)]}
    return {
        "operationId": "systemone",
        "summary": "A decision: the System One envelope, or the single-question form (told apart by `kind`)",
        "parameters": _carry_headers(),
        "requestBody": {
            "required": True,
            "description": "JSON (Content-Encoding "
            + ", ".join(DECODED_ENCODINGS)
            + " decoded), or multipart/form-data as typesafe-sdk sends images: the JSON in the part "
            f"`{MULTIPART_REQUEST_PART}`, each image a part named by its asset's `part` (at most "
            f"{MAX_MULTIPART_PARTS} parts)",
            "content": {
                "application/json": {"schema": request},
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": [MULTIPART_REQUEST_PART],
                        "properties": {MULTIPART_REQUEST_PART: ref(SystemOneRequest)},
                        "additionalProperties": {"type": "string", "format": "binary"},
                        "propertyNames": {"minLength": 1},  # a part without a name is refused (400)
                        "maxProperties": MAX_MULTIPART_PARTS,
                    },
                    "encoding": {MULTIPART_REQUEST_PART: {"contentType": "application/json"}},
                },
            },
        },
        "responses": {
            "200": {
                "description": "the answers, in the form asked",
                "headers": {name: {"$ref": f"#/components/headers/{name}"} for name in WORKER_ANSWER_HEADERS},
                "content": _json({"anyOf": [ref(SystemOneResponse), ref(DecisionResponse)]}),
            }
        },
    }


def _carry_headers() -> list[dict]:
    """How a request is carried (jev_common.http): its deadline, its priority, the SDK's retry headers."""
    return [
        {
            "name": DEADLINE_HEADER,
            "in": "header",
            "required": False,
            "description": "seconds this caller waits for the answer; past it a 504",
            "schema": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DEADLINE_S},
        },
        {
            "name": PRIORITY_HEADER,
            "in": "header",
            "required": False,
            "description": "`bulk` lowers the caller's own priority",
            "schema": {"type": "string", "enum": list(PRIORITIES)},
        },
        {"name": SDK_HEADER, "in": "header", "required": False, "schema": {"type": "string"}},
        {"name": RETRY_COUNT_HEADER, "in": "header", "required": False, "schema": {"type": "string"}},
        {
            "name": "Content-Encoding",
            "in": "header",
            "required": False,
            "description": "the body's compression; anything else is a 415",
            "schema": {"type": "string", "enum": [*DECODED_ENCODINGS, "identity"]},
        },
    ]


def _preencode(ref) -> dict:
    return {
        "operationId": "preencode",
        "summary": "Prepare images (the vision tower, once per image), passed on to the preencoder; 404 where the "
        "stack runs none",
        "parameters": _carry_headers(),
        "requestBody": {
            "required": True,
            "description": "manifest lines: a JSON array, `{lines: [...]}`, one line, or JSON Lines",
            "content": {
                "application/json": {"schema": ref(PreencodeManifest)},
                "application/x-ndjson": {"schema": {"type": "string"}},
            },
        },
        "responses": {"200": {"description": "one result per line", "content": _json(ref(PreencodeResponse))}},
    }


def _models(ref) -> dict:
    return {
        "operationId": "models",
        "summary": "The models served: each recipe and `jev-latest`",
        "responses": {"200": {"description": "the models", "content": _json(ref(ModelList))}},
    }


def _health(ref) -> dict:
    health = ref(HealthResponse)
    return {
        "operationId": "health",
        "summary": "Readiness: 200 once a backend answers (`degraded` while one is out), else 503",
        "responses": {
            "200": {"description": "serving", "content": _json(health)},
            "503": {
                "description": "not serving (yet): the status, and in `detail` its error_type and message",
                "content": _json({"anyOf": [health, {"$ref": COMPONENTS + "ErrorBody"}]}),
            },
        },
    }


OPERATIONS = {
    ("post", "/v1/systemone"): _systemone,
    ("post", "/v1/preencode"): _preencode,
    ("get", "/v1/models"): _models,
    ("get", "/health"): _health,
}
