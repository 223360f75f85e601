"""label-tokens with the checkpoint's calibration (Decider / StartLux / JEMM `decision_config.json`):
per-type temperatures and the noul log-odds bias applied to the LM-head label rows, every answer equal to
a plain `model(input_ids).logits` reference; more than 26 options through two-letter codes. The family
`label-tokens` serves the embedded SmolLM2 recipe, whose decision prompt is this stack's own: no public source exists
for it (recipes/smollm2-135m-cpu/README.md says so), so the reference here is the plain forward. The releases that
ship such a calibration file are tested against their own upstream in test_decider.py, test_startlux.py and
test_jemm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..family_helpers import ask, assert_probs, family_recipe, prompt_ids, served

STATE = "The kettle is whistling and steam comes out of its spout."
LETTERS = "Answer with the letter of the correct option only."


@pytest.fixture(scope="module")
def calibrated_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_calibrated

    return str(make_tiny_calibrated(tmp_path_factory.mktemp("calibrated"), seed=6))


def reference(folder: str, system: str, content: str, labels: list[str], type_: str) -> list[float]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    config = json.loads(Path(folder, "decision_config.json").read_text())
    ids = [tokenizer.encode(label, add_special_tokens=False)[0] for label in labels]
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([prompt_ids(tokenizer, system, content)])).logits[0, -1, ids].float()
    bias = torch.zeros(len(ids))
    bias[0] = config["biases"].get(type_, 0.0)  # the yes (first label) log-odds bias
    logits = logits + bias
    return torch.softmax(logits / config["temperatures"][type_], dim=-1).tolist()


async def test_calibrated_label_tokens_equal_the_plain_reference(worker_settings, tiny_recipe, calibrated_dir):
    recipe = family_recipe(tiny_recipe, "tiny-decider", family="label-tokens", options={"calibration_required": True})
    system = recipe.prompt.system
    head = f"State:\n{STATE}\n\nQuestion: "
    async with served(worker_settings(recipe=recipe, model_path=calibrated_dir)) as (front, worker, service):
        body = await ask(
            front,
            STATE,
            {
                "hot": {"type": "noul", "instructions": "Is the water hot?", "criteria": {"true": "boiling"}},
                "what": {
                    "type": "choice",
                    "instructions": "What is it doing?",
                    "criteria": {"boiling": None, "cooling": "losing heat"},
                },
                "level": {"type": "score", "instructions": "How hot?", "criteria": ["cold", "warm", "hot"]},
            },
        )
        answers = body["answers"]
        want = reference(
            calibrated_dir,
            system,
            head + "Is the water hot?\nYes means: boiling\nAnswer Yes or No.",
            ["Yes", "No"],
            "noul",
        )
        assert abs(answers["hot"]["noul"] - want[0]) <= 1e-5
        want = reference(
            calibrated_dir,
            system,
            head + f"What is it doing?\nOptions:\nA. boiling\nB. cooling: losing heat\n{LETTERS}",
            ["A", "B"],
            "choice",
        )
        assert_probs(answers["what"]["probabilities"], want, ["boiling", "cooling"])
        want = reference(
            calibrated_dir,
            system,
            head + "How hot?\nLevels:\n0. cold\n1. warm\n2. hot\nAnswer with the number of the level only.",
            ["0", "1", "2"],
            "score",
        )
        assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2"])
        calibration = (await (await worker.get("/health")).json())["detail"]["serving"]["calibration"]
        assert calibration == {
            "source": "decision_config.json",
            "biases": {"noul": 0.35},
            "temperatures": {"choice": 1.164, "noul": 1.624, "score": 1.124},
        }
        assert service.model.builder.max_options == 255  # decider-style: A..Z, then single-token two-letter codes


async def test_uncalibrated_checkpoint_reports_no_calibration(worker_settings, tiny_recipe):
    async with served(worker_settings()) as (_, worker, _):
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["backend"] == "causal-lm" and serving["readout"] == "label-tokens"
        assert serving["family"] == "label-tokens"  # /health names the recipe's family too
        assert serving["calibration"] == {"source": None, "temperatures": {}, "biases": {}}
