"""The `cpu` compose profile end to end: build, up, health, one decision per kind through :8080, /metrics, down.

Needs a Docker engine (`docker info` succeeds) and the compose plugin; skipped otherwise, with the reason.
The same services run without Docker through tools/local_stack.py (tests/stack covers that path).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from jev_common.schema import DecisionRequest, DecisionResponse

pytestmark = [pytest.mark.compose, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:8080"
UP_TIMEOUT_S = 1800  # first build downloads torch and builds the venv
HEALTH_TIMEOUT_S = 300

REQUESTS = {
    "choice": {"kind": "choice", "state": "The sky is clear and it is noon.", "question": "What colour is the sky?",
               "options": ["blue", "green", "purple"]},
    "noul": {"kind": "noul", "state": "The parcel arrived intact and on time.", "question": "What went wrong?",
             "options": ["It arrived late", "It arrived broken"]},
    "score": {"kind": "score", "state": "The reply was polite and solved the problem.",
              "question": "How good was the reply, from 1 to 5?", "options": ["1", "2", "3", "4", "5"]},
    "span": {"kind": "span", "state": "Ship to Alice Smith at 12 Oak Road before Friday.",
             "question": "Which part is the recipient's name?", "options": ["Alice Smith", "12 Oak Road", "Friday"]},
    "set": {"kind": "set", "state": "The hotel has a pool and free breakfast but no parking.",
            "question": "Which amenities does the hotel have?", "options": ["pool", "breakfast", "parking"]},
}


def _engine_reason() -> str | None:
    docker = shutil.which("docker")
    if docker is None:
        return "no docker CLI on PATH"
    info = subprocess.run([docker, "info"], capture_output=True, text=True, timeout=60)
    if info.returncode != 0:
        return f"no Docker engine reachable (`docker info` failed: {(info.stderr or info.stdout).strip()[:200]})"
    compose = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, timeout=60)
    if compose.returncode != 0:
        return "the docker compose plugin is not installed"
    return None


@pytest.fixture(scope="module")
def cpu_stack():
    reason = _engine_reason()
    if reason:
        pytest.skip(f"compose stack test skipped: {reason}")
    project = f"jevtest{uuid.uuid4().hex[:8]}"
    base = ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "-p", project, "--profile", "cpu"]
    try:
        up = subprocess.run(base + ["up", "-d", "--build", "--wait", "--wait-timeout", str(HEALTH_TIMEOUT_S)],
                            cwd=ROOT, capture_output=True, text=True, timeout=UP_TIMEOUT_S)
        if up.returncode != 0:
            logs = subprocess.run(base + ["logs", "--tail", "80"], cwd=ROOT, capture_output=True, text=True, timeout=120)
            pytest.fail(f"compose up failed:\n{up.stderr[-3000:]}\n{logs.stdout[-4000:]}")
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(BASE + "/health", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                pytest.fail("frontend on :8080 never became healthy")
            time.sleep(2)
        yield base
    finally:
        subprocess.run(base + ["down", "-v", "--remove-orphans"], cwd=ROOT, capture_output=True, text=True, timeout=300)


def _post(body: dict) -> tuple[int, dict, dict]:
    request = urllib.request.Request(BASE + "/v1/systemone", data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"{}")


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_decision_of_every_kind_through_the_frontend(cpu_stack, kind):
    body = DecisionRequest.model_validate(REQUESTS[kind]).model_dump(exclude_none=True)
    status, headers, payload = _post(body)
    assert status == 200, payload
    response = DecisionResponse.model_validate(payload)
    assert response.kind == kind
    assert len(response.probabilities) == len(body["options"])
    assert any(k.lower().startswith("x-jev-") for k in headers), headers


def test_errors_are_envelopes(cpu_stack):
    status, _, payload = _post({"kind": "choice", "state": "x", "question": "q", "options": ["only one"]})
    assert status == 422 and payload["error"]["type"] == "validation_error"


def test_metrics_are_scraped(cpu_stack):
    with urllib.request.urlopen(BASE + "/metrics", timeout=10) as response:
        text = response.read().decode()
    assert "jev_frontend_http_requests_total" in text
