"""code-readout (pplx-decider, D3 / Decider-style code-readout v1) on tiny checkpoints in that layout:
every answer equals a plain backbone forward + readout rows / temperature, causal and noncausal. The readout is
upstream's: `h_last @ W.T` over the question's codes, softmax of logits / temperature, as vllm-project/semantic-router
`src/model-runtime/vllm_srun/families/decision3/family.py` @ b744aa1f6a18873339848c6367362d2e7b92fc42 (`_pass`) and
sgl-project/sglang `python/sglang/srt/entrypoints/systemone/serving.py` @ 18396cfb51aeee87250be6e4241648c25479b902
read it; each family's own prompt is tested against upstream in test_pplx_decider.py and test_d3.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from ..family_helpers import ask, assert_probs, family_recipe, last_hidden, prompt_ids, served

STATE = "The kettle is whistling and steam comes out of its spout."
OPTIONS = "Answer with the letter of the correct option only."


@pytest.fixture(scope="module")
def causal_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_code_readout

    return str(make_tiny_code_readout(tmp_path_factory.mktemp("code-causal"), seed=3))


@pytest.fixture(scope="module")
def noncausal_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_code_readout

    return str(
        make_tiny_code_readout(
            tmp_path_factory.mktemp("code-noncausal"),
            seed=4,
            codes=30,
            attention_mode="noncausal_full_attention",
            temperature=0.8,
        )
    )


def reference(folder: str, system: str, content: str, n: int, *, noncausal: bool = False) -> list[float]:
    """softmax(h_last @ W[:n].T / T) with a plain AutoModel forward (noncausal: its attention layers
    made non-causal by their own flag, no mask passed)."""
    import json

    tokenizer = AutoTokenizer.from_pretrained(folder)
    backbone = AutoModel.from_pretrained(folder, dtype=torch.float32).eval()
    if noncausal:
        for layer in backbone.layers:
            layer.self_attn.is_causal = False
    config = json.loads(Path(folder, "decision_config.json").read_text())
    weight = load_file(f"{folder}/readout.safetensors")["weight"].float()
    hidden = last_hidden(backbone, prompt_ids(tokenizer, system, content))
    return torch.softmax((hidden @ weight[:n].T) / config["temperature"], dim=-1).tolist()


def listing(names: list[str], codes: list[str]) -> str:
    return "\n".join(f"{c}. {n}" for c, n in zip(codes, names))


def codes_of(folder: str) -> list[str]:
    import json

    return json.loads(Path(folder, "decision_config.json").read_text())["codes"]


async def test_causal_code_readout_answers_equal_the_plain_reference(worker_settings, tiny_recipe, causal_dir):
    recipe = family_recipe(tiny_recipe, "tiny-d3", family="code-readout")
    codes = codes_of(causal_dir)
    many = [f"option {i}" for i in range(40)]  # past Z: two-letter codes from decision_config.json
    async with served(worker_settings(recipe=recipe, model_path=causal_dir)) as (front, worker, service):
        body = await ask(
            front,
            STATE,
            {
                "what": {
                    "type": "choice",
                    "instructions": "What is the kettle doing?",
                    "criteria": {"boiling": "water at 100 C", "cooling": None, "broken": None},
                },
                "many": {"type": "choice", "instructions": "Pick one.", "criteria": dict.fromkeys(many)},
                "level": {
                    "type": "score",
                    "instructions": "How hot is it?",
                    "criteria": ["cold", "warm", "hot", "boiling"],
                },
                "where": {
                    "type": "span",
                    "instructions": "Where does steam come out?",
                    "criteria": ["its spout", "The kettle"],
                },
            },
        )
        system = recipe.prompt.system
        head = f"State:\n{STATE}\n\n"
        want = reference(
            causal_dir,
            system,
            head + "Question: What is the kettle doing?\nOptions:\n"
            "A. boiling: water at 100 C\nB. cooling\nC. broken\n" + OPTIONS,
            3,
        )
        assert_probs(body["answers"]["what"]["probabilities"], want, ["boiling", "cooling", "broken"])
        want = reference(
            causal_dir, system, head + f"Question: Pick one.\nOptions:\n{listing(many, codes)}\n{OPTIONS}", 40
        )
        assert_probs(body["answers"]["many"]["probabilities"], want, many)
        want = reference(
            causal_dir,
            system,
            head
            + "Question: How hot is it?\nOptions:\n"
            + listing(["cold", "warm", "hot", "boiling"], codes)
            + "\n"
            + OPTIONS,
            4,
        )
        assert_probs(body["answers"]["level"]["probabilities"], want, ["0", "1", "2", "3"])
        assert abs(body["answers"]["level"]["score"] - sum(i * p for i, p in enumerate(want))) <= 1e-5
        want = reference(
            causal_dir,
            system,
            head + "Question: Where does steam come out?\nOptions:\nA. its spout\nB. The kettle\n" + OPTIONS,
            2,
        )
        assert_probs(body["answers"]["where"]["probabilities"], want, ["its spout", "The kettle"])
        health = await (await worker.get("/health")).json()
        assert health["detail"]["serving"]["readout"] == "code-readout"
        assert health["detail"]["serving"]["calibration"]["temperatures"]["choice"] == pytest.approx(1.37)


@pytest.mark.parametrize(
    "question",
    [{"type": "noul", "instructions": "Is it hot?"}, {"type": "set", "criteria": {"hot": None, "cold": None}}],
)
async def test_code_readout_refuses_yes_no_questions_with_a_clear_4xx(
    worker_settings, tiny_recipe, causal_dir, question
):
    recipe = family_recipe(tiny_recipe, "tiny-d3", family="code-readout")
    async with served(worker_settings(recipe=recipe, model_path=causal_dir)) as (front, worker, _):
        for client in (front, worker):
            body = await ask(client, STATE, {"q": question}, status=422)
            assert body["detail"]["error_type"] == "unsupported_question_type"
            assert question["type"] in body["detail"]["message"] and "code-readout" in body["detail"]["message"]


async def test_noncausal_pplx_layout_sees_the_whole_prompt_and_refuses_prefix_reuse(
    worker_settings, tiny_recipe, noncausal_dir
):
    recipe = family_recipe(tiny_recipe, "tiny-pplx", family="code-readout")
    async with served(worker_settings(recipe=recipe, model_path=noncausal_dir)) as (front, worker, service):
        questions = {
            "what": {
                "type": "choice",
                "instructions": "What is the kettle doing?",
                "criteria": {"boiling": None, "cooling": None},
            },
            "level": {"type": "score", "instructions": "How hot?", "criteria": ["cold", "warm", "hot"]},
        }
        first = await front.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": questions})
        body = await first.json()
        assert "l3=off" in first.headers["x-jev-cache"]
        content = f"State:\n{STATE}\n\nQuestion: What is the kettle doing?\nOptions:\nA. boiling\nB. cooling\n{OPTIONS}"
        want = reference(noncausal_dir, recipe.prompt.system, content, 2, noncausal=True)
        assert_probs(body["answers"]["what"]["probabilities"], want, ["boiling", "cooling"])
        causal = reference(noncausal_dir, recipe.prompt.system, content, 2)
        assert max(abs(a - b) for a, b in zip(want, causal)) > 1e-4  # the attention really is noncausal
        want = reference(
            noncausal_dir,
            recipe.prompt.system,
            f"State:\n{STATE}\n\nQuestion: How hot?\nOptions:\nA. cold\nB. warm\nC. hot\n{OPTIONS}",
            3,
            noncausal=True,
        )
        assert_probs(body["answers"]["level"]["probabilities"], want, ["0", "1", "2"])
        again = await ask(front, STATE, questions)
        assert again["x_cached_input_tokens"] == 0
        stats = await (await worker.get("/v1/cache/stats")).json()
        assert stats["prefix_reuse"].startswith("refused: noncausal") and not stats["levels"]["l3"]["enabled"]
        assert (await front.get("/health")).status == 200  # degraded only: no Redis in unit tests
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["backend"] == "noncausal-lm" and serving["attention_mode"] == "noncausal_full_attention"
        too_many = {"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(31)}}}
        body = await ask(front, STATE, too_many, status=422)
        assert "at most 30 options" in str(body["detail"])


async def test_noncausal_batch_of_rows_equals_one_by_one(worker_settings, tiny_recipe, noncausal_dir):
    """Rows of different lengths padded into one forward: padding is masked, nothing else is."""
    recipe = family_recipe(tiny_recipe, "tiny-pplx", family="code-readout")
    questions = {
        f"q{i}": {
            "type": "choice",
            "instructions": "Which? " + "really " * i,
            "criteria": {"a": None, "b": None, "c": None},
        }
        for i in range(4)
    }
    async with served(worker_settings(recipe=recipe, model_path=noncausal_dir)) as (front, _, _):
        together = (await ask(front, STATE, questions))["answers"]
        for qid, question in questions.items():
            alone = (await ask(front, STATE, {qid: question}))["answers"][qid]
            for name, p in alone["probabilities"].items():
                assert abs(together[qid]["probabilities"][name] - p) <= 1e-5
