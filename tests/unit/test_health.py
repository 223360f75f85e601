"""Health answers come from the ERRORS table (jev_common.health): the status code and error type of the domain
error that says why a service is not ready."""

from __future__ import annotations

import json

from jev_common.errors import ERRORS, NotReady, Stalled
from jev_common.health import health_body, health_response


def test_a_ready_service_answers_200_with_its_detail_unchanged():
    assert health_body("degraded", {"index": {"status": "degraded"}}) == (
        200,
        {"status": "degraded", "detail": {"index": {"status": "degraded"}}},
    )


def test_a_service_not_ready_answers_with_the_table_s_status_and_type():
    for problem in (NotReady("model is loading"), Stalled("worker is stalled: no layer for 30 s")):
        code, body = health_body("loading", {"queue_depth": 0}, problem)
        spec = ERRORS[type(problem)]
        assert code == spec.status
        assert body == {
            "status": "loading",
            "detail": {"queue_depth": 0, "error_type": spec.type, "message": problem.message},
        }


def test_health_response_carries_the_body_and_status():
    response = health_response("unavailable", {"error": "x"}, NotReady("model failed to load: x"))
    assert response.status == 503
    assert json.loads(response.text)["detail"] == {
        "error": "x",
        "error_type": "not_ready",
        "message": "model failed to load: x",
    }
