"""The upstream JEV-VL recipe's launch commands, run as written (the native binaries replaced by
`python -m jev_worker` / `python -m jev_frontend`) against the tiny Qwen3.5 VL checkpoint: the
worker comes up on 127.0.0.1:8001 and the frontend on 127.0.0.1:8080 from the upstream names alone,
and the upstream curl lines answer. Needs ports 8001 and 8080 free (skips, saying so, otherwise)."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import stack_run

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]

# upstream: recipe/jev_vl/README.md (ThinkFlowLab/system1-omni), "Build and launch"
WORKER = (
    "JEV_VL_MODEL=weights/jev-vl-merged \\\n"
    "  JEV_VL_CUDA_LIB=$PWD/target/release/libqwen3_5_cuda.so \\\n"
    "  JEV_VL_CACHE=0 {python} -m jev_worker"
)
FRONTEND = "OMNI_JEV_BIND=127.0.0.1:8080 OMNI_JEV_BACKEND_URL=http://127.0.0.1:8001 \\\n  {python} -m jev_frontend"
CURLS = """\
curl --fail-with-body http://127.0.0.1:8001/health
curl --fail-with-body http://127.0.0.1:8080/health
curl --fail-with-body http://127.0.0.1:8001/v1/systemone \\
  -H 'Content-Type: application/json' --data-binary @recipe/jev_vl/example-request.json
curl --fail-with-body http://127.0.0.1:8080/v1/systemone \\
  -H 'Content-Type: application/json' --data-binary @recipe/jev_vl/example-request.json
"""
# upstream recipe/jev_vl/example-request.json, text only
EXAMPLE = {
    "kind": "choice",
    "model": "jev-27b-vl",
    "state": "The customer received a package with a broken screen and asks for help.",
    "question": "What should support do next?",
    "options": ["Offer a replacement", "Close the ticket without a reply"],
}


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JEV_", "OMNI_JEV_"))}
    env.update(PYTHONPATH=f"{ROOT / 'services'}{os.pathsep}{ROOT}", HF_HUB_OFFLINE="1")
    return env


def _shell(line: str, cwd: Path, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["bash", "-c", line.replace("\\\n", " ")],
            cwd=cwd,
            env=_clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _wait(url: str, proc: subprocess.Popen, log: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while stack_run.probe(url)[0] != 200:
        assert proc.poll() is None, f"exited with {proc.returncode}:\n{stack_run.tail(log)}"
        assert time.monotonic() < deadline, f"{url} not healthy:\n{stack_run.tail(log)}"
        time.sleep(0.25)


def test_upstream_jev_vl_commands_as_written(tmp_path):
    busy = [port for port in (8001, 8080) if stack_run.port_in_use(port)]
    if busy:
        pytest.skip(f"ports {busy} are in use here; the upstream commands bind 8001 and 8080")
    from tools.tiny_jev_vl_checkpoint import make_tiny_jev_vl

    cwd = tmp_path / "checkout"
    make_tiny_jev_vl(cwd / "weights" / "jev-vl-merged")
    (cwd / "recipe" / "jev_vl").mkdir(parents=True)
    (cwd / "recipe" / "jev_vl" / "example-request.json").write_text(json.dumps(EXAMPLE, indent=2))
    python = shlex.quote(sys.executable)
    logs = {"worker": tmp_path / "worker.log", "frontend": tmp_path / "frontend.log"}
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_shell(WORKER.format(python=python), cwd, logs["worker"]))
        _wait("http://127.0.0.1:8001/health", procs[0], logs["worker"])
        procs.append(_shell(FRONTEND.format(python=python), cwd, logs["frontend"]))
        _wait("http://127.0.0.1:8080/health", procs[1], logs["frontend"])

        answers = []
        for command in CURLS.replace("\\\n", " ").splitlines():
            done = subprocess.run(
                ["bash", "-c", command + " --silent --show-error"], cwd=cwd, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            answers.append(json.loads(done.stdout))
        direct_health, front_health, direct, front = answers
        assert direct_health["status"] in ("ok", "degraded") and front_health == direct_health
        assert direct_health["detail"]["recipe"] == "jev-27b-vl"  # the upstream names' default recipe
        for answer in (direct, front):
            probabilities = answer["probabilities"]
            assert len(probabilities) == 2 and all(math.isfinite(p) for p in probabilities)
            assert sum(probabilities) == pytest.approx(1.0, abs=1e-4)
            assert 0 <= answer["choice_index"] < 2
            assert answer["choice"] == EXAMPLE["options"][answer["choice_index"]]
        assert front["probabilities"] == pytest.approx(direct["probabilities"], abs=1e-6)
        assert front["usage"] == direct["usage"]
        assert direct["usage"]["cached_tokens"] == 0  # JEV_VL_CACHE=0: no prefix cache
    finally:
        for proc in reversed(procs):
            stack_run.stop_all([stack_run.Proc("upstream", proc, Path(os.devnull))], log=lambda *_: None)
    for name, log in logs.items():  # and every line either service logged is JSON
        for line in log.read_text().splitlines():
            assert isinstance(json.loads(line), dict), (name, line)
