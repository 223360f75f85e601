"""The jev-vl profile's image path for real, on CPU (tests/compose/jev-vl-cpu.yml: the CPU image and the
tiny Qwen2-VL checkpoint): the one-shot `preencode-jev-vl` encodes a manifest into the assets volume and
exits 0, only then does the worker start (`service_completed_successfully`), and an image question
through the frontend answers from the prepared asset; an image that was never prepared gets 422.

Needs a Docker engine (skipped otherwise, with the reason) and the CPU image, which the cpu test builds
(tests/compose/test_compose_stack.py runs first) or tools/container_ci.sh setup does.
"""
from __future__ import annotations

import json
import re
import shutil
from datetime import datetime
from pathlib import Path

import pytest

from jev_common.assets import asset_key
from jev_common.schema import DecisionResponse, ErrorEnvelope

from .. import scenarios
from ..unit.vl_helpers import png_uri, tiny_jev_vl_checkpoint
from .engine import Project, engine_reason

pytestmark = [pytest.mark.compose, pytest.mark.slow]
HERE = Path(__file__).resolve().parent
IMAGE, UNPREPARED = png_uri(seed=7), png_uri(seed=8)
LINE = {"kind": "choice", "state": ["A photo: ", {"image": IMAGE}], "question": "What is shown?",
        "options": ["a cat", "a dog", "a pattern"]}  # JEV-27B-VL's state form: parts, the image inline


def _readable(path: Path) -> None:
    for item in [path, *path.rglob("*")]:
        item.chmod(0o755 if item.is_dir() else 0o644)


@pytest.fixture(scope="module")
def vl_stack(tmp_path_factory):
    reason = engine_reason()
    if reason:
        pytest.skip(f"compose VL test skipped: {reason}")
    tmp = tmp_path_factory.mktemp("compose-vl")
    shutil.copytree(tiny_jev_vl_checkpoint(), tmp / "models" / "tiny-vl")
    (tmp / "preencode").mkdir()
    (tmp / "preencode" / "manifest.jsonl").write_text(json.dumps({"image": IMAGE}) + "\n")
    _readable(tmp)
    project = Project("jev-vl", tmp, extra_files=[HERE / "jev-vl-cpu.yml"],
                      env={"JEV_PREENCODE_DIR": str(tmp / "preencode"),
                           "JEV_PREENCODE_MANIFEST": "/preencode/manifest.jsonl"})
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
    return datetime.fromisoformat(f"{match.group(1)}.{(match.group(2) or '0')[:6]:0<6}"
                                  f"{'+00:00' if zone == 'Z' else zone}")


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
