"""Scenarios run against a whole stack through the frontend: by tests/stack (services as local
processes, the env the compose file gives them) and by tests/compose (the same under Docker)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from jev_common.schema import DecisionRequest, DecisionResponse, ErrorEnvelope, SystemOneResponse

REQUESTS = {
    "choice": {
        "kind": "choice",
        "state": "The sky is clear and it is noon.",
        "question": "What colour is the sky?",
        "options": ["blue", "green", "purple"],
    },
    "noul": {
        "kind": "noul",
        "state": "The parcel arrived intact and on time.",
        "question": "What went wrong?",
        "options": ["It arrived late", "It arrived broken"],
    },
    "score": {
        "kind": "score",
        "state": "The reply was polite and solved the problem.",
        "question": "How good was the reply, from 1 to 5?",
        "options": ["1", "2", "3", "4", "5"],
    },
    "span": {
        "kind": "span",
        "state": "Ship to Alice Smith at 12 Oak Road before Friday.",
        "question": "Which part is the recipient's name?",
        "options": ["Alice Smith", "12 Oak Road", "Friday"],
    },
    "set": {
        "kind": "set",
        "state": "The hotel has a pool and free breakfast but no parking.",
        "question": "Which amenities does the hotel have?",
        "options": ["pool", "breakfast", "parking"],
    },
}


def http(method: str, url: str, body: object | None = None, timeout: float = 120) -> tuple[int, dict, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def decide(base: str, body: dict) -> tuple[int, dict, dict]:
    status, headers, raw = http("POST", base + "/v1/systemone", body)
    return status, headers, json.loads(raw or b"{}")


def check_every_kind(base: str) -> dict[str, DecisionResponse]:
    answers = {}
    for kind, body in REQUESTS.items():
        body = DecisionRequest.model_validate(body).model_dump(exclude_none=True)
        status, headers, payload = decide(base, body)
        assert status == 200, (kind, payload)
        answer = DecisionResponse.model_validate(payload)
        assert answer.kind == kind and len(answer.probabilities) == len(body["options"])
        assert "x-jev-cache" in headers, headers
        answers[kind] = answer
    again = decide(base, REQUESTS["choice"])
    assert again[1]["x-jev-cache"].startswith("l1=hit"), again[1]
    assert again[2]["usage"]["cached_tokens"] > 0
    return answers


def check_jev_vl_kinds(base: str) -> dict[str, DecisionResponse]:
    """The JEV-VL worker's own single-question form (upstream's /v1/decide): choice over the options, noul over
    false/true and score over 0..5 whatever options are sent, on a text state (families/jev_vl)."""
    answers = {}
    state = "The kettle on the stove is whistling and steam rises from its spout."
    for kind, options, n in (("choice", ["a kettle", "a pan", "a pot"], 3), ("noul", None, 2), ("score", None, 6)):
        body = {
            "kind": kind,
            "state": state,
            "question": "What is on the stove?",
            **({"options": options} if options else {}),
        }
        status, headers, payload = decide(base, body)
        assert status == 200, (kind, payload)
        answer = DecisionResponse.model_validate(payload)
        assert answer.kind == kind and len(answer.probabilities) == n, payload
        assert "x-jev-cache" in headers, headers
        answers[kind] = answer
    return answers


SYSTEMONE = {
    "model": "jev-latest",
    "state": "Hi, I was charged twice for my March invoice and the refund still hasn't arrived.",
    "questions": {
        "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
        "team": {
            "type": "choice",
            "instructions": "Which team should handle this ticket?",
            "criteria": {"Billing": "Payments, invoices, refunds", "Technical": None, "Sales": None},
        },
        "anger": {
            "type": "score",
            "instructions": "How frustrated is the customer?",
            "criteria": ["Calm", "Frustrated", "Very angry"],
        },
    },
}


def check_systemone(base: str) -> SystemOneResponse:
    """The public System One envelope: one answer per question, of its type, summing to 1."""
    status, headers, payload = decide(base, SYSTEMONE)
    assert status == 200, payload
    assert headers.get("x-typesafe-request-id", "").startswith("req_"), headers
    response = SystemOneResponse.model_validate(payload)
    assert list(response.answers) == list(SYSTEMONE["questions"])
    assert 0 <= response.answers["refund"].noul <= 1
    team = response.answers["team"]
    assert set(team.probabilities) == {"Billing", "Technical", "Sales"}
    assert abs(sum(team.probabilities.values()) - 1) < 1e-4
    anger = response.answers["anger"]
    assert abs(anger.score - sum(int(k) * p for k, p in anger.probabilities.items())) < 1e-6
    status, _, raw = http("GET", base + "/v1/models")
    assert status == 200 and any(m["name"] == "jev-latest" for m in json.loads(raw)["models"]), raw
    return response


def check_errors(base: str) -> None:
    status, _, payload = decide(base, {"kind": "choice", "state": "x", "question": "q", "options": ["only one"]})
    assert status == 422 and ErrorEnvelope.model_validate(payload).type == "validation_error"
    status, _, raw = http("POST", base + "/v1/chat/completions", {"messages": []})
    assert status == 404 and ErrorEnvelope.model_validate(json.loads(raw)).type == "not_found"


def check_health_and_metrics(base: str) -> None:
    status, _, raw = http("GET", base + "/health")
    assert status == 200, raw
    assert json.loads(raw)["status"] in ("ok", "degraded")
    status, _, raw = http("GET", base + "/metrics")
    text = raw.decode()
    assert status == 200
    for name in (
        "jev_frontend_http_requests_total",
        "jev_frontend_backend_up 1.0",
        "jev_worker_decision_seconds_bucket",
        "jev_worker_cache_hits_total",
    ):
        assert name in text, name
