"""The `cpu` compose profile end to end: build, up, health, one decision per kind through :8080, /metrics, down.

Needs a Docker engine (`docker info` succeeds) and the compose plugin; skipped otherwise, with the reason.
The same services run without Docker through tools/local_stack.py (tests/stack covers that path).
"""
from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from .. import scenarios

pytestmark = [pytest.mark.compose, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
BASE = "http://127.0.0.1:8080"
UP_TIMEOUT_S = 1800  # first build downloads torch and builds the venv
HEALTH_TIMEOUT_S = 300

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


def test_health_and_metrics(cpu_stack):
    scenarios.check_health_and_metrics(BASE)


def test_decision_of_every_kind_through_the_frontend(cpu_stack):
    scenarios.check_every_kind(BASE)


def test_errors_are_envelopes(cpu_stack):
    scenarios.check_errors(BASE)
