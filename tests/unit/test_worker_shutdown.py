"""Work stops when nobody waits for it, and SIGTERM is obeyed (issue: CPU speed and deadlines).

- A request past its deadline gets its 504, and its forward stops at the next layer instead of running on
  (jev_worker/scheduling/abandon.py); the stopped batch and the layers it did not run show in /metrics.
- SIGTERM with a long decision in flight: new requests get 503 `unavailable` with Retry-After at once, the
  running decision is answered 503 when the grace period ends, its forward stops at its next layer, and the
  process exits 0 within the grace period plus about one layer.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from jev_worker.scheduling.abandon import layer_stack
from tests.fakes.net import free_port

from .worker_helpers import sample_value, worker_client

ROOT = Path(__file__).resolve().parents[2]
LAYERS = 6


@pytest.fixture(scope="module")
def deep_tiny_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_text

    return str(make_tiny_text(tmp_path_factory.mktemp("tiny-deep"), layers=LAYERS))


def envelope(state: str) -> dict:
    return {
        "model": "jev-latest",
        "state": state,
        "questions": {"q": {"type": "choice", "criteria": {"north": None, "south": None}}},
    }


def metric(text: str, name: str, **labels: str) -> float:
    return sample_value(text, name, **labels) or 0.0


async def test_an_expired_forward_stops_within_one_layer(worker_settings, deep_tiny_dir):
    layer_s, deadline_s = 0.3, 0.6
    async with worker_client(worker_settings(model_path=deep_tiny_dir, deadline_s=deadline_s)) as (client, service):
        starts: list[float] = []
        blocks = list(layer_stack(service.model.loaded.model))
        assert len(blocks) == LAYERS
        for block in blocks:

            def slowed(*args, _forward=block.forward, **kwargs):
                starts.append(time.monotonic())
                time.sleep(layer_s)
                return _forward(*args, **kwargs)

            block.forward = slowed
        sent = time.monotonic()
        response = await client.post("/v1/systemone", json=envelope("Which way does the compass needle point?"))
        assert response.status == 504 and (await response.json())["detail"]["error_type"] == "deadline_exceeded"
        await asyncio.wait_for(service.model.scheduler.idle(), 5)
        # unstopped, the forward would run all LAYERS layers (1.8 s); it stops before the first layer that would
        # start after the deadline, so at most the layer running at the deadline finishes
        assert starts and len(starts) < LAYERS
        assert max(starts) <= sent + deadline_s + 0.1, [round(s - sent, 3) for s in starts]
        text = await (await client.get("/metrics")).text()
        assert metric(text, "jev_worker_abandoned_batches_total") == 1
        assert metric(text, "jev_worker_abandoned_layers_total") == LAYERS - len(starts)
        assert metric(text, "jev_worker_decisions_total", kind="systemone", outcome="deadline_exceeded") == 1
        for block in blocks:  # the worker serves on
            del block.forward
        assert (await client.post("/v1/systemone", json=envelope("Another state."))).status == 200


def _post(port: int, body: dict, out: dict) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/systemone",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            out.update(status=answer.status, body=json.loads(answer.read()), at=time.monotonic())
    except urllib.error.HTTPError as exc:
        out.update(status=exc.code, body=json.loads(exc.read()), headers=dict(exc.headers), at=time.monotonic())


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.slow
def test_sigterm_with_a_long_decision_in_flight_exits_0_within_the_grace_period(deep_tiny_dir, tmp_path):
    layer_s, grace_s = 1.5, 1.0
    port, flag = free_port(), tmp_path / "slow"
    env = {k: v for k, v in os.environ.items() if not k.startswith("JEV_")}
    env.update(
        PYTHONPATH=f"{ROOT / 'services'}:{ROOT}",
        JEV_RECIPE="smollm2-135m-cpu",
        JEV_MODEL_PATH=deep_tiny_dir,
        JEV_DEVICE="cpu",
        JEV_DTYPE="float32",
        JEV_WORKER_HOST="127.0.0.1",
        JEV_WORKER_PORT=str(port),
        JEV_REDIS_URL="redis://127.0.0.1:1/0",
        JEV_WORKER_REGISTER_TTL_S="0",
        JEV_SHUTDOWN_GRACE_S=str(grace_s),
        JEV_TEST_LAYER_S=str(layer_s),
        JEV_TEST_SLOW_FLAG=str(flag),
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.slow_layers_worker"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while not _healthy(port):
            assert worker.poll() is None and time.monotonic() < deadline, worker.stdout.read().decode()[-2000:]
            time.sleep(0.2)
        flag.touch()  # from now on every layer takes layer_s: one decision is LAYERS * layer_s = 9 s
        running: dict = {}
        thread = threading.Thread(target=_post, args=(port, envelope("A long decision."), running))
        thread.start()
        time.sleep(layer_s)  # its forward is under way
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        late: dict = {}
        _post(port, envelope("Too late."), late)
        assert late["status"] == 503 and late["body"]["detail"]["error_type"] == "unavailable", late
        assert "Retry-After" in late["headers"]
        code = worker.wait(timeout=30)
        exited = time.monotonic() - signalled
        thread.join(timeout=30)
        out = worker.stdout.read().decode()
        assert code == 0, out[-2000:]
        # grace, then at most the layer running at that moment (unstopped, the decision needs ~7.5 s more)
        assert exited < grace_s + layer_s + 2.0, (exited, out[-2000:])
        assert running["status"] == 503 and running["body"]["detail"]["error_type"] == "unavailable", running
        assert running["at"] - signalled < grace_s + 1.0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
