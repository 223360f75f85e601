"""The real services on loopback, started from docker-compose.yml's own env by tools/local_stack:
the `cpu` profile on the embedded SmolLM2, and the `jev-vl` profile (preencoder + Redis + worker +
frontend) on a tiny random Qwen2-VL checkpoint."""

from __future__ import annotations

import json
import os

import pytest
import redis

from jev_common.assets import asset_key
from jev_common.schema import DecisionResponse, ErrorEnvelope
from tools.local_stack import start_profile

from .. import scenarios
from ..fakes.net import free_port
from ..unit.vl_helpers import png_uri, tiny_jev_vl_checkpoint

pytestmark = pytest.mark.slow
REDIS_URL = os.environ.get("JEV_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def test_cpu_profile_on_loopback(tmp_path):
    overrides = {
        "worker-cpu": {"JEV_WORKER_PORT": str(free_port())},
        "frontend-cpu": {"JEV_FRONTEND_PORT": str(free_port())},
    }
    with start_profile("cpu", overrides, state_dir=tmp_path, log=lambda *_: None) as urls:
        base = urls["frontend-cpu"]
        scenarios.check_health_and_metrics(base)
        scenarios.check_systemone(base)
        answers = scenarios.check_every_kind(base)
        assert answers["choice"].model == "smollm2-135m-cpu"
        scenarios.check_errors(base)


def test_jev_vl_profile_on_loopback(tmp_path):
    checkpoint = tiny_jev_vl_checkpoint()  # the jev-vl profile serves JEV-27B-VL's contract
    assets = tmp_path / "assets"
    common = {
        "JEV_MODEL_PATH": checkpoint,
        "JEV_DEVICE": "cpu",
        "JEV_DTYPE": "float32",
        "JEV_ASSET_DIR": str(assets),
        "JEV_REDIS_URL": REDIS_URL,
    }
    overrides = {
        "preencoder-jev-vl": dict(common, JEV_PREENCODER_PORT=str(free_port())),
        "worker-jev-vl": dict(common, JEV_WORKER_PORT=str(free_port())),
        "frontend-jev-vl": {"JEV_FRONTEND_PORT": str(free_port())},
    }
    image = png_uri(seed=7)
    unprepared = png_uri(seed=8)
    with start_profile("jev-vl", overrides, state_dir=tmp_path, log=lambda *_: None) as urls:
        base = urls["frontend-jev-vl"]
        # upstream's state form: text and the image as parts, the image inline where it stands
        line = {
            "kind": "choice",
            "state": ["A photo: ", {"image": image}],
            "question": "What is shown?",
            "options": ["a cat", "a dog", "a pattern"],
        }
        # images are prepared through the one public edge: the frontend passes POST /v1/preencode on with the
        # internal token, which the preencoder asks of every caller
        status, _, raw = scenarios.http("POST", urls["preencoder-jev-vl"] + "/v1/preencode", [{"image": image}])
        assert status == 403, raw
        status, _, raw = scenarios.http("POST", base + "/v1/preencode", [{"image": image}])
        assert status == 200, raw
        summary = json.loads(raw)["summary"]
        assert summary.get("done") == 1, summary
        key = asset_key(image)
        assert (assets / key / "emb.safetensors").is_file() and (assets / key / "grid.json").is_file()
        client = redis.Redis.from_url(REDIS_URL)
        assert any(client.scan_iter(match=f"jev:*:asset:{key}")), "asset not registered in the index"

        status, headers, payload = scenarios.decide(base, line)
        assert status == 200, payload
        first = DecisionResponse.model_validate(payload)
        assert "l2=" in headers["x-jev-cache"]
        status, headers, payload = scenarios.decide(base, line)
        assert status == 200 and headers["x-jev-cache"] == "l1=hit,l2=hit,l3=hit", headers
        assert payload["probabilities"] == pytest.approx(first.probabilities, abs=1e-5)

        status, _, payload = scenarios.decide(base, dict(line, state={"image": unprepared}))
        error = ErrorEnvelope.model_validate(payload)
        assert status == 422 and error.type == "asset_not_prepared" and asset_key(unprepared) in error.message
        scenarios.check_jev_vl_kinds(base)  # text decisions on the VL worker too
        scenarios.check_health_and_metrics(base)
