"""scalar-head (Open-Jev 27B / 9B) on a tiny export in its layout: each candidate its own row after the
shared prefix, the FP32 scalar head on its last token, the saved temperature over a question's candidates,
noul as logits [0, s]; every answer equal to a plain forward + head in the test."""
from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ..family_helpers import ask, assert_probs, family_recipe, last_hidden, prompt_ids, served

STATE = "The kettle is whistling and steam comes out of its spout."
CHECK = "Is this proposed answer correct? Answer Yes or No."


@pytest.fixture(scope="module")
def open_jev_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_open_jev

    return str(make_tiny_open_jev(tmp_path_factory.mktemp("open-jev"), seed=5))


@pytest.fixture
def open_jev_recipe(tiny_recipe):
    return family_recipe(tiny_recipe, "tiny-open-jev", family="open-jev", system=None,
                         state_block="Context:\n{state}\n\n")


def scalars(folder: str, contents: list[str]) -> torch.Tensor:
    """Calibrated head scalars s / T, one per candidate prompt, from a plain forward of each."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    head = torch.load(f"{folder}/head.pt", weights_only=True)
    temperature = json.load(open(f"{folder}/calibration.json"))["temperature"]
    out = [last_hidden(model.model, prompt_ids(tokenizer, None, c)) @ head["weight"][0] + head["bias"][0]
           for c in contents]
    return torch.stack(out) / temperature


async def test_open_jev_answers_equal_the_plain_reference(worker_settings, open_jev_recipe, open_jev_dir):
    head = f"Context:\n{STATE}\n\nQuestion: "
    async with served(worker_settings(recipe=open_jev_recipe, model_path=open_jev_dir)) as (front, worker, _):
        body = await ask(front, STATE, {
            "what": {"type": "choice", "instructions": "What is the kettle doing?",
                     "criteria": {"boiling": "water at 100 C", "cooling": None, "broken": None}},
            "level": {"type": "score", "instructions": "How hot is it?", "criteria": ["cold", "warm", "hot"]},
            "hot": {"type": "noul", "instructions": "Is the water hot?",
                    "criteria": {"true": "it is boiling", "false": "it is cold"}},
        })
        answers = body["answers"]
        want = torch.softmax(scalars(open_jev_dir, [
            f"{head}What is the kettle doing?\nProposed answer: {o}\n{CHECK}"
            for o in ("boiling: water at 100 C", "cooling", "broken")]), -1).tolist()
        assert_probs(answers["what"]["probabilities"], want, ["boiling", "cooling", "broken"])
        want = torch.softmax(scalars(open_jev_dir, [f"{head}How hot is it?\nProposed answer: {o}\n{CHECK}"
                                                    for o in ("cold", "warm", "hot")]), -1).tolist()
        assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2"])
        s = scalars(open_jev_dir, [f"{head}Is the water hot?\nYes means: it is boiling\nNo means: it is cold\n"
                                   "Is the answer to this question yes? Answer Yes or No."])[0]
        assert abs(answers["hot"]["noul"] - float(torch.sigmoid(s))) <= 1e-5
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["readout"] == "scalar-head" and serving["calibration"]["source"] == "calibration.json"
        assert serving["calibration"]["temperatures"]["choice"] == pytest.approx(1.6)


async def test_open_jev_candidates_share_the_state_prefix(worker_settings, open_jev_recipe, open_jev_dir):
    question = {"q": {"type": "choice", "instructions": "Which?", "criteria": {"a": None, "b": None}}}
    async with served(worker_settings(recipe=open_jev_recipe, model_path=open_jev_dir)) as (front, _, _):
        await ask(front, STATE, question)
        response = await front.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": {
            "other": {"type": "choice", "instructions": "Which one?", "criteria": {"a": None, "c": None}}}})
        assert "l3=hit" in response.headers["x-jev-cache"]
        assert (await response.json())["x_cached_input_tokens"] > 0


@pytest.mark.parametrize("question", [{"type": "set", "criteria": {"hot": None, "cold": None}},
                                      {"type": "span", "criteria": ["its spout", "The kettle"]}])
async def test_open_jev_refuses_types_it_has_no_head_for(worker_settings, open_jev_recipe, open_jev_dir, question):
    async with served(worker_settings(recipe=open_jev_recipe, model_path=open_jev_dir)) as (front, _, _):
        body = await ask(front, STATE, {"q": question}, status=422)
        assert body["detail"]["error_type"] == "unsupported_question_type"
        legacy = await front.post("/v1/systemone", json={"kind": "choice", "state": {"text": STATE},
                                                         "question": "Which?", "options": ["a", "b"]})
        assert legacy.status == 422 and (await legacy.json())["detail"]["error_type"] == "unsupported_request_form"
