"""The jev-vl profile's image path for real, on CPU (tests/compose/jev-vl-cpu.yml: the CPU image and the
tiny Qwen2-VL checkpoint): the one-shot `preencode-jev-vl` encodes a manifest into the assets volume and
exits 0, only then does the worker start (`service_completed_successfully`), and an image question
through the frontend answers from the prepared asset; an image that was never prepared gets 422.

Needs a Docker engine (skipped otherwise, with the reason) and the CPU image, which the cpu test builds
(tests/compose/test_compose_stack.py runs first) or tools/container_ci.sh setup does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from datetime import datetime
from pathlib import Path

import pytest

from jev_common.assets import asset_key
from jev_common.schema import DecisionResponse, ErrorEnvelope, SystemOneResponse

from .. import scenarios
from ..unit.vl_helpers import png_uri, tiny_jev_vl_checkpoint
from .engine import Project, engine_reason

pytestmark = [pytest.mark.compose, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
IMAGE, UNPREPARED, LATER = png_uri(seed=7), png_uri(seed=8), png_uri(seed=9)
LINE = {
    "kind": "choice",
    "state": ["A photo: ", {"image": IMAGE}],
    "question": "What is shown?",
    "options": ["a cat", "a dog", "a pattern"],
}  # JEV-27B-VL's state form: parts, the image inline


def _readable(path: Path) -> None:
    for item in [path, *path.rglob("*")]:
        item.chmod(0o755 if item.is_dir() else 0o644)


def _image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], capture_output=True, timeout=60).returncode == 0


# the CPU image (jev-vl-cpu.yml), and the CUDA image the profile names (jev-vl-cuda-image.yml, its torch on CPU):
# the second runs where `bash tools/container_ci.sh cuda-image` built it
@pytest.fixture(scope="module", params=["cpu-image", "cuda-image"])
def vl_stack(request, tmp_path_factory):
    reason = engine_reason()
    if reason:
        pytest.skip(f"compose VL test skipped: {reason}")
    overrides = HERE / ("jev-vl-cpu.yml" if request.param == "cpu-image" else "jev-vl-cuda-image.yml")
    if request.param == "cuda-image":
        image = os.environ.get("JEV_IMAGE_CUDA", "jev-cuda:local")
        if not _image_exists(image):
            pytest.skip(f"no CUDA image {image} here (build it: bash tools/container_ci.sh cuda-image)")
    tmp = tmp_path_factory.mktemp("compose-vl")
    shutil.copytree(tiny_jev_vl_checkpoint(), tmp / "models" / "tiny-vl")
    (tmp / "preencode").mkdir()
    (tmp / "preencode" / "manifest.jsonl").write_text(json.dumps({"image": IMAGE}) + "\n")
    _readable(tmp)
    project = Project(
        "jev-vl",
        tmp,
        extra_files=[overrides],
        env={"JEV_PREENCODE_DIR": str(tmp / "preencode"), "JEV_PREENCODE_MANIFEST": "/preencode/manifest.jsonl"},
    )
    try:
        project.up()
        yield project
    finally:
        project.down()


def _time(value: str) -> datetime:
    """An engine's RFC 3339 timestamp (nanoseconds, Z or an offset) as an aware datetime."""
    match = re.fullmatch(r"(\S+T\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?", value.strip())
    assert match, value
    zone = match.group(3) or "Z"
    return datetime.fromisoformat(
        f"{match.group(1)}.{(match.group(2) or '0')[:6]:0<6}{'+00:00' if zone == 'Z' else zone}"
    )


def test_the_worker_started_after_the_preencode_finished(vl_stack):
    job = vl_stack.container("preencode-jev-vl")["State"]
    worker = vl_stack.container("worker-jev-vl")["State"]
    assert job["Status"] == "exited" and job["ExitCode"] == 0, job
    assert _time(job["FinishedAt"]) <= _time(worker["StartedAt"]), (job["FinishedAt"], worker["StartedAt"])
    logs = vl_stack.run("logs", "--no-color", "preencode-jev-vl").stdout
    # one image encoded, and registered in the index (Redis with its password: no index error)
    assert "preencode: 1 done, 0 skipped, 0 failed" in logs and "cache index" not in logs, logs[-2000:]
    listing = vl_stack.exec("worker-jev-vl", "ls", f"/var/lib/jev/assets/{asset_key(IMAGE)}")
    assert "emb.safetensors" in listing.stdout, listing


def test_an_image_question_answers_from_the_prepared_asset(vl_stack):
    status, headers, payload = scenarios.decide(vl_stack.base_url, LINE)
    assert status == 200, payload
    answer = DecisionResponse.model_validate(payload)
    assert len(answer.probabilities) == 3
    assert "l2=" in headers["x-jev-cache"], headers
    status, _, payload = scenarios.decide(vl_stack.base_url, dict(LINE, state={"image": UNPREPARED}))
    error = ErrorEnvelope.model_validate(payload)
    assert status == 422 and error.type == "asset_not_prepared", payload
    assert asset_key(UNPREPARED) in error.message


def test_an_image_prepared_through_the_frontend_is_answered(vl_stack):
    """The preencoder is not published: callers prepare an image through the frontend's POST /v1/preencode, which
    passes it on with the internal token."""
    status, _, raw = scenarios.http("POST", vl_stack.base_url + "/v1/preencode", [{"image": LATER}])
    assert status == 200, raw
    assert json.loads(raw)["summary"].get("done") == 1, raw
    status, _, payload = scenarios.decide(vl_stack.base_url, dict(LINE, state={"image": LATER}))
    assert status == 200, payload


def test_a_system_one_request_is_answered(vl_stack):
    """The public envelope through the frontend, on whichever image the stack runs (the CUDA image on CPU too)."""
    body = {
        "model": "jev-27b-vl",
        "state": "A ticket: I was charged twice for March.",
        "questions": {
            "refund": {"type": "noul", "instructions": "Is the customer asking for money back?"},
            "team": {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": None, "Technical": None}},
        },
    }
    status, headers, payload = scenarios.decide(vl_stack.base_url, body)
    assert status == 200, payload
    response = SystemOneResponse.model_validate(payload)
    assert 0 <= response.answers["refund"].noul <= 1
    assert abs(sum(response.answers["team"].probabilities.values()) - 1) < 1e-4
    assert headers.get("x-jev-code-version"), headers
