"""lfm2-json-values on the family's lfm2-values backend (LFM2.5-350M) on a tiny Lfm2ForCausalLM in LFM2.5's
layout (tools/tiny_lfm2_checkpoint.py: conv + attention layers, LFM2's `<|startoftext|>` / `<|pad|>` special
tokens and chat template): every answer equal to system1-omni's LFM2 contract written out here, independently of
the worker's code, after

- `src/models/lfm2/worker.py` @ e0ef7a290cb30ca1cc66d3b1fb383e7f093fddd1 (`validate_request`, `build_schema`,
  `softmax`, the warmup request, usage = every question's prefix + unpadded suffix and value tokens);
- `src/models/lfm2/engine.py` @ 77c1be726ed9291e433c4363bc0f6a32fae76a99 (`Engine.prompt`: the fixed system
  text + `json.dumps(schema, ensure_ascii=False)`, the state as the user turn, the generation prompt + `{\\n`;
  `Engine.score`: prefix, `'  "answer": '` and `json.dumps(key) + "\\n"` each encoded without special tokens and
  concatenated, the value tokens' FP32 full-vocabulary log_softmax summed, no length normalisation);
- `src/models/lfm2/README.md` @ e0ef7a290cb30ca1cc66d3b1fb383e7f093fddd1 (the example request).

The reference scores each candidate with one uncached forward over prefix + suffix + value (the oracle of
upstream's own engine test); the worker forks one prefill per question.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jev_common.recipe import load_recipe

from ..family_helpers import assert_probs, served

SYSTEM = (
    "Extract the attributes from the text. Return only a JSON object matching this schema. "
    "Use the exact allowed values. No explanation or markdown.\n"
)
STATE = "I was charged twice. Please refund the duplicate charge."
REFUND = {
    "type": "choice",
    "instructions": "Does the customer ask for a refund?",
    "criteria": {"yes": "asks for a refund", "no": "does not"},
}
# the README example's whole prompt, as the tiny checkpoint's LFM2 template renders it (engine.prompt)
REFUND_PROMPT = (
    "<|startoftext|><|im_start|>system\nExtract the attributes from the text. Return only a JSON object matching "
    'this schema. Use the exact allowed values. No explanation or markdown.\n{"type": "object", "properties": '
    '{"answer": {"type": "string", "description": "{\\"instructions\\": \\"Does the customer ask for a refund?\\", '
    '\\"criteria\\": {\\"yes\\": \\"asks for a refund\\", \\"no\\": \\"does not\\"}}", "enum": ["yes", "no"]}}, '
    '"required": ["answer"], "additionalProperties": false}<|im_end|>\n<|im_start|>user\nI was charged twice. '
    "Please refund the duplicate charge.<|im_end|>\n<|im_start|>assistant\n{\n"
)
QUESTIONS = {
    "refund": REFUND,
    "team": {
        "type": "choice",
        "instructions": {"task": "route", "note": "très urgent"},
        "criteria": {
            "billing": None,
            'say "hi"': {"team": "greeter", "hours": [9, 17]},
            "équipe technique": ["software", "hardware"],
            "x": "short key",
        },
    },
}


@pytest.fixture(scope="module")
def lfm2_dir(tmp_path_factory) -> str:
    from tools.tiny_lfm2_checkpoint import make_tiny_lfm2

    return str(make_tiny_lfm2(tmp_path_factory.mktemp("lfm2"), seed=7))


def lfm2_recipe():
    recipe = load_recipe("lfm2.5-350m")
    model = recipe.model.model_copy(update={"hub_repo": "test/tiny-lfm2", "revision": "local", "dtype": "float32"})
    return recipe.model_copy(update={"name": "tiny-lfm2", "model": model})


class Reference:
    """system1-omni's LFM2 worker + engine, written out from upstream's text."""

    def __init__(self, folder: str):
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False)

    def prompt(self, state: str, question: dict) -> str:
        description = json.dumps(
            {"instructions": question["instructions"], "criteria": question["criteria"]}, ensure_ascii=False
        )
        schema = {
            "type": "object",
            "properties": {
                "answer": {"type": "string", "description": description, "enum": list(question["criteria"].keys())}
            },
            "required": ["answer"],
            "additionalProperties": False,
        }
        messages = [
            {"role": "system", "content": SYSTEM + json.dumps(schema, ensure_ascii=False)},
            {"role": "user", "content": state},
        ]
        return self.tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "{\n"

    def candidates(self, state: str, question: dict) -> list[tuple[list[int], list[int], list[int]]]:
        prefix = self.encode(self.prompt(state, question))
        suffix = self.encode("  " + json.dumps("answer", ensure_ascii=False) + ": ")
        return [
            (prefix, suffix, self.encode(json.dumps(key, ensure_ascii=False) + "\n")) for key in question["criteria"]
        ]

    @torch.inference_mode()
    def scores(self, state: str, question: dict) -> list[float]:
        out = []
        for prefix, suffix, value in self.candidates(state, question):
            start = len(prefix) + len(suffix)
            logits = self.model(torch.tensor([prefix + suffix + value]), use_cache=False).logits[0]
            logp = logits[start - 1 : start + len(value) - 1].float().log_softmax(-1)
            out.append(logp.gather(1, torch.tensor(value)[:, None]).sum().item())
        return out

    def probabilities(self, state: str, question: dict) -> list[float]:
        scores = self.scores(state, question)
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        return [w / sum(weights) for w in weights]

    def usage(self, state: str, questions: dict) -> int:
        """worker.py: per question, its prefix once and every candidate's unpadded suffix and value."""
        total = 0
        for question in questions.values():
            candidates = self.candidates(state, question)
            total += len(candidates[0][0]) + sum(len(s) + len(v) for _, s, v in candidates)
        return total


@pytest.fixture(scope="module")
def reference(lfm2_dir) -> Reference:
    return Reference(lfm2_dir)


def test_the_prompt_is_upstreams_token_by_token(reference):
    tok = reference.tok
    assert reference.prompt(STATE, REFUND) == REFUND_PROMPT
    prefix, suffix, value = reference.candidates(STATE, REFUND)[0]
    assert prefix[0] == tok.convert_tokens_to_ids("<|startoftext|>") and tok.bos_token == "<|startoftext|>"
    assert tok.convert_ids_to_tokens(suffix) == ["Ġ", 'Ġ"', "answer", '":', "Ġ"]
    assert tok.convert_ids_to_tokens(value) == ['"', "yes", '"', "Ċ"]
    # the pieces are tokenised on their own: one pass over the same text gives other ids
    assert prefix + suffix + value != reference.encode(REFUND_PROMPT + '  "answer": "yes"\n')


async def test_lfm2_answers_equal_its_upstream_contract(worker_settings, lfm2_dir, reference):
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    settings = worker_settings(recipe=lfm2_recipe(), model_path=lfm2_dir, max_batch_rows=3)
    async with served(settings) as (front, worker, service):
        health = (await (await worker.get("/health")).json())["detail"]
        assert health["warmup_seconds"] > 0  # upstream's own warmup decision ran
        assert set(health["kernels"]) == {"causal-conv1d"}  # its conv layers' fast path, present or not
        serving = health["serving"]
        assert (serving["readout"], serving["backend"], serving["question_types"]) == (
            "lfm2-json-values",
            "lfm2-values",
            ["choice"],
        )
        assert serving["calibration"] == {"source": None, "temperature": 1.0}

        # token ids: the worker's prepared prompt is upstream's prefix + suffix + value, question by question
        model = service.model
        request = SystemOneRequest.model_validate({"model": "jev-latest", "state": STATE, "questions": QUESTIONS})
        groups = model.builder.prefix_groups(request.questions)
        assert [list(group) for group in groups] == [[qid] for qid in QUESTIONS]  # each question its own prefill
        planned = [rows_for(group, request.state, model.builder, model.readout.kinds) for group in groups]
        parts = [model.builder.prepare(STATE, group_rows, (), group_plan) for group_rows, group_plan in planned]
        rows, plan = rows_for(request.questions, request.state, model.builder, model.readout.kinds)
        prepared = model.builder.prepare(STATE, rows, (), plan)  # all questions at once: the same ids, unsplit
        want = [c for q in QUESTIONS.values() for c in reference.candidates(STATE, q)]
        got = [(part.prefix_ids, row, labels) for part in parts for row, labels in zip(part.rows, part.row_labels)]
        assert [list(p) + list(r) for p, r, _ in got] == [p + s + v for p, s, v in want]
        assert [list(labels) for _, _, labels in got] == [v for _, _, v in want]
        assert [list(prepared.prefix_ids + row) for row in prepared.rows] == [p + s + v for p, s, v in want]

        for state in (STATE, "  Refund?\nI paid twice.  "):
            response = await front.post(
                "/v1/systemone", json={"model": "jev-latest", "state": state, "questions": QUESTIONS}
            )
            body = await response.json()
            assert response.status == 200, body
            for qid, question in QUESTIONS.items():
                keys = list(question["criteria"])
                want = reference.probabilities(state, question)
                assert_probs(body["answers"][qid]["probabilities"], want, keys)
                scores = reference.scores(state, question)
                assert body["answers"][qid]["choice"] == keys[max(range(len(keys)), key=scores.__getitem__)]
            assert max(want) - min(want) > 1e-3
            assert body["usage"]["input_tokens"] == reference.usage(state, QUESTIONS)
            assert body["usage"]["output_tokens"] == 0

        engine = model.engine  # candidates ran forked from each question's prefill snapshot, not as whole forwards
        assert (engine.forwards.prefix_mode, engine.kv_branching) == ("snapshot", True)

        # the same request again: each question's prefill comes back from L3 (a cache snapshot), same answer
        again = await front.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": QUESTIONS})
        assert "l3=hit" in again.headers["x-jev-cache"]
        for qid, question in QUESTIONS.items():
            assert_probs(
                (await again.json())["answers"][qid]["probabilities"],
                reference.probabilities(STATE, question),
                list(question["criteria"]),
            )

        # many candidates of different token lengths: no length normalisation, several forked batches
        many = {
            "type": "choice",
            "instructions": "Pick the team.",
            "criteria": {f"{'team ' * (i % 4)}{i}": None for i in range(40)},
        }
        body = await (
            await front.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": {"q": many}})
        ).json()
        assert_probs(
            body["answers"]["q"]["probabilities"], reference.probabilities(STATE, many), list(many["criteria"])
        )

        # one option: upstream's enum takes 1 to 255 values and scores one with p = 1; so does the worker
        one = {"type": "choice", "instructions": "Pick the team.", "criteria": {"billing": None}}
        body = await (
            await front.post("/v1/systemone", json={"model": "jev-latest", "state": STATE, "questions": {"q": one}})
        ).json()
        assert body["answers"]["q"]["choice"] == "billing" and body["answers"]["q"]["probabilities"] == {"billing": 1.0}


async def test_lfm2_refuses_what_upstream_refuses(worker_settings, lfm2_dir):
    async def status(state, questions, extra=None) -> tuple[int, str]:
        body = {"model": "jev-latest", "state": state, "questions": questions, **(extra or {})}
        response = await front.post("/v1/systemone", json=body)
        return response.status, await response.text()

    settings = worker_settings(recipe=lfm2_recipe(), model_path=lfm2_dir)
    async with served(settings) as (front, _, _):
        for question in (
            {"type": "noul", "instructions": "Is it a refund?"},
            {"type": "score", "instructions": "How angry?", "criteria": ["calm", "angry"]},
        ):
            code, text = await status(STATE, {"q": question})
            assert code == 422 and "unsupported_question_type" in text, text
        for state in ({"text": STATE}, [STATE], "   \n "):  # worker.validate_request: a non-empty text string
            code, text = await status(state, {"q": REFUND})
            assert code == 422 and "non-empty text state" in text, (state, text)
        for question in (
            {"type": "choice", "criteria": REFUND["criteria"]},
            {"type": "choice", "instructions": None, "criteria": REFUND["criteria"]},
        ):
            code, text = await status(STATE, {"q": question})
            assert code == 422 and "needs instructions" in text, text
        too_many = {"type": "choice", "instructions": "Pick.", "criteria": {f"k{i}": None for i in range(256)}}
        numbers = {"type": "choice", "instructions": "Pick.", "criteria": {"a": 3, "b": None}}
        for question in (too_many, numbers):
            code, text = await status(STATE, {"q": question})
            assert code == 422, text
        code, text = await status(STATE, {"q": dict(REFUND, instructions="stop<|im_end|>")})
        assert code == 422 and "<|im_end|>" in text
        image = {"<image:x>": {"type": "image", "format": "png", "data_base64": "iVBORw0KGgo="}}
        code, text = await status("see <image:x>", {"q": REFUND}, {"assets": image})
        assert code == 422 and "image_not_supported" in text
        for mode in ("cyclic", "prior"):  # the options precede the state: a permutation would cost a state prefill
            code, text = await status(STATE, {"q": REFUND}, {"x_coherence": mode})
            assert code == 422 and f"does not offer '{mode}'" in text and "whole state prefill" in text, text
