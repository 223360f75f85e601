"""jevcompat, the System One conformance suite, against the real services on the embedded SmolLM2:
the worker directly (keys off), a frontend with keys off, and a frontend started with an API key.
Every MUST and every applicable SHOULD must pass; any failed requirement fails the test.

Set JEV_CONFORMANCE_REPORT_DIR to keep the JSON reports (docs/conformance/ holds the committed ones).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from jevcompat import report, runner

from tools.local_stack import start_profile

from .. import scenarios
from ..fakes.net import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
KEY = "conformance-key"


def _frontend(port: int, backend: str, log: Path, token_file: Path) -> subprocess.Popen:
    """A second frontend with keys off, started by hand beside the stack: it reaches the worker with the stack's
    internal token (the file the stack generated)."""
    env = dict(
        os.environ,
        JEV_FRONTEND_HOST="127.0.0.1",
        JEV_FRONTEND_PORT=str(port),
        JEV_BACKEND_URL=backend,
        JEV_API_KEYS="",
        JEV_INTERNAL_TOKEN_FILE=str(token_file),
        JEV_FRONTEND_TIMEOUT_S="300",
        PYTHONPATH=f"{REPO / 'services'}:{REPO}",
    )
    return subprocess.Popen(
        [sys.executable, "-m", "jev_frontend"], env=env, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )


def _wait_healthy(base: str, process: subprocess.Popen) -> None:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, "frontend exited"
        try:
            if scenarios.http("GET", base + "/health", timeout=5)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{base} never became healthy")


def _check(url: str, name: str, key: str | None, should: int) -> dict:
    rep = runner.run(url, key=key, timeout=300)
    summary = rep.summary()
    out_dir = os.environ.get("JEV_CONFORMANCE_REPORT_DIR")
    if out_dir:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        (Path(out_dir) / f"{name}.json").write_text(report.to_json(rep) + "\n", encoding="utf-8")
    failed = [f"{r.id}: {[str(f.message) for f in r.findings][:2]}" for r in rep.results if r.status == "fail"]
    assert not failed, (name, failed)
    assert rep.verdict == "conformant", (name, rep.verdict, rep.aborted, rep.inconclusive, rep.case_errors)
    assert summary["MUST"]["passed"] == 32, (name, summary)
    assert summary["SHOULD"]["passed"] == should and summary["SHOULD"]["failed"] == 0, (name, summary)
    return summary


def test_jevcompat_conformant_on_worker_and_frontends(tmp_path, monkeypatch):
    """The keyed stack is configured as the README says (`JEV_API_KEYS=... make up`: the key in the environment
    of the whole stack); the worker behind it is reached with the internal token only."""
    worker_port, keyed_port, open_port = free_port(), free_port(), free_port()
    monkeypatch.setenv("JEV_API_KEYS", KEY)
    monkeypatch.delenv("JEV_INTERNAL_TOKENS", raising=False)
    # generous deadlines: conformance is about the API, and a loaded 2-core machine can take tens of
    # seconds for the 255-option question; a 504 there would be a timing fact, not a finding
    overrides = {
        "worker-cpu": {"JEV_WORKER_PORT": str(worker_port), "JEV_DEADLINE_S": "300"},
        "frontend-cpu": {"JEV_FRONTEND_PORT": str(keyed_port), "JEV_FRONTEND_TIMEOUT_S": "300"},
    }
    with start_profile("cpu", overrides, state_dir=tmp_path, log=lambda *_: None) as urls:
        worker = urls["worker-cpu"]
        token_file = tmp_path / "jev-secrets" / "internal-token"
        token = token_file.read_text().strip()
        assert scenarios.http("GET", worker + "/v1/models", timeout=30)[0] == 403  # no credential: refused
        open_front = f"http://127.0.0.1:{open_port}"
        process = _frontend(open_port, worker, tmp_path / "open-frontend.log", token_file)
        try:
            _wait_healthy(open_front, process)
            _check(worker, "worker", token, should=15)  # the internal token is the worker's one credential
            _check(open_front, "frontend", None, should=13)
            _check(urls["frontend-cpu"], "frontend-with-key", KEY, should=15)
        finally:
            process.terminate()
            process.wait(10)
