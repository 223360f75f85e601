"""The OpenAPI 3.1 description (jev_common.openapi) is a valid document generated from the one schema and the one error
table, served by the frontend at /openapi.json with the rate-limit module's own headers; the fake worker's answers of
every shape conform to it."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openapi_spec_validator import validate

from jev_common import errors as E
from jev_common.openapi import ROUTE_ERRORS, description
from jev_common.schema import SystemOneRequest
from jev_frontend.buckets import Levels
from jev_frontend.limits import Limit
from jev_frontend.ratelimit import LIMITED_ROUTES, documented_headers, limit_headers
from tests.fakes.fake_worker import FakeWorker

from .test_frontend import frontend

TICKET = {
    "model": "jev-latest",
    "state": "Hi, I was charged twice for my March invoice.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
        "team": {"type": "choice", "criteria": {"Billing": "Payments", "Technical": None}},
        "anger": {"type": "score", "criteria": ["Calm", "Frustrated", "Very angry"]},
    },
}


def doc() -> dict:
    return description(documented_headers(), LIMITED_ROUTES)


def conforms(document: dict, schema: dict, instance: object) -> bool:
    """Whether `instance` is valid under `schema`, a piece of `document` (its $refs resolved in the document)."""
    root = {"components": document["components"], **schema}
    return jsonschema.Draft202012Validator(root).is_valid(instance)


def body_schema(document: dict, path: str, method: str, media: str = "application/json") -> dict:
    return document["paths"][path][method]["requestBody"]["content"][media]["schema"]


def response_schema(document: dict, path: str, method: str, status: int) -> dict:
    return document["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]


def test_the_description_is_valid_openapi_3_1():
    document = doc()
    assert document["openapi"].startswith("3.1")
    validate(document)  # openapi-spec-validator: raises on any error
    assert set(document["paths"]) == {"/v1/systemone", "/v1/models", "/v1/preencode", "/health"}


def test_request_bodies_are_the_pydantic_schema():
    document = doc()
    systemone = body_schema(document, "/v1/systemone", "post")
    assert conforms(document, systemone, TICKET)
    single = {"kind": "choice", "state": "The light is red.", "question": "What now?", "options": ["stop", "go"]}
    assert conforms(document, systemone, single)
    assert not conforms(document, systemone, {"model": "m", "state": "s", "questions": {}})  # min 1 question
    assert not conforms(document, systemone, dict(TICKET, x_coherence="sideways"))
    # the pydantic model's own constraints, not copies: the schema of a question id is the model's
    generated = SystemOneRequest.model_json_schema()["properties"]["questions"]["propertyNames"]
    questions = document["components"]["schemas"]["SystemOneRequest"]["properties"]["questions"]
    assert questions["propertyNames"] == generated
    multipart = document["paths"]["/v1/systemone"]["post"]["requestBody"]["content"]["multipart/form-data"]
    assert multipart["schema"]["required"] == ["request"]
    assert multipart["encoding"]["request"]["contentType"] == "application/json"


def test_every_error_of_the_table_is_documented_in_its_shape():
    document = doc()
    documented: set[tuple[int, str]] = set()
    for (method, path), raises in ROUTE_ERRORS.items():
        for cls in raises:
            spec = E.ERRORS[cls]
            schema = response_schema(document, path, method, spec.status)
            assert conforms(document, schema, E.error_body(spec.type, "m")), (path, cls)
            assert not conforms(document, schema, E.error_body("no_such_type", "m")), (path, cls)
            if spec.retry_after is not None:
                assert "Retry-After" in document["paths"][path][method]["responses"][str(spec.status)]["headers"]
            documented.add((spec.status, spec.type))
    # every (status, error_type) of the table some public route answers; the worker's health's `stalled` reaches
    # callers in the health shape (its status field), documented as /health's 503
    assert {(s.status, s.type) for s in E.ERRORS.values()} - documented == {(503, "stalled")}
    validation = [{"loc": ["body", "questions"], "msg": "too short", "type": "too_short"}]
    assert conforms(document, response_schema(document, "/v1/systemone", "post", 422), {"detail": validation})
    assert not conforms(document, response_schema(document, "/v1/systemone", "post", 400), {"detail": validation})
    health_503 = response_schema(document, "/health", "get", 503)
    assert conforms(document, health_503, {"status": "stalled", "detail": E.error_body("stalled", "m")["detail"]})


def test_the_rate_limit_headers_are_the_modules_own():
    document = doc()
    sent = {
        **limit_headers(Limit(60, 1000), Levels(True, 3.0, 10.0)),
    }
    assert sent and set(sent) <= set(documented_headers())
    for path, item in document["paths"].items():
        for operation in item.values():
            for response in operation["responses"].values():
                names = set(response["headers"])
                assert "x-typesafe-request-id" in names
                assert (set(sent) <= names) == (path in LIMITED_ROUTES), (path, names)
    assert set(documented_headers()) <= set(document["components"]["headers"])


async def test_the_frontend_serves_it_and_the_answers_conform():
    document = json.loads(json.dumps(doc()))
    async with FakeWorker() as url, frontend(url) as client:
        served = await client.get("/openapi.json")
        assert served.status == 200 and served.content_type == "application/json"
        assert await served.json() == document
        answer = await client.post("/v1/systemone", json=TICKET)
        assert answer.status == 200
        assert conforms(document, response_schema(document, "/v1/systemone", "post", 200), await answer.json())
        refused = await client.post("/v1/systemone", json={"model": "m"})
        assert refused.status == 422
        assert conforms(document, response_schema(document, "/v1/systemone", "post", 422), await refused.json())
        models = await client.get("/v1/models")
        assert conforms(document, response_schema(document, "/v1/models", "get", 200), await models.json())
        health = await client.get("/health")
        assert conforms(document, response_schema(document, "/health", "get", health.status), await health.json())
        absent = await client.post("/v1/preencode", json=[{"image": "data:image/png;base64,AAAA"}])
        assert absent.status == 404
        assert conforms(document, response_schema(document, "/v1/preencode", "post", 404), await absent.json())


@pytest.mark.parametrize("media", ["application/json"])
def test_the_preencode_manifest_forms(media):
    document = doc()
    schema = body_schema(document, "/v1/preencode", "post", media)
    for manifest in ([{"image": "data:image/png;base64,AAAA"}], {"lines": [{"image": "x"}]}, {"image": "x"}):
        assert conforms(document, schema, manifest)
