"""jemm-labels on causal-lm (JEMM) on a tiny Qwen3.5 vision-language checkpoint with JEMM's
`decision_config.json`: every answer equal to JEMM's own System One contract written out here after
ypcypc/JEMM `jemm/systemone.py` (`candidates_for`, `single_requests`), `jemm/contract.py` (`single_messages`,
`mm_messages`, `encode_single`, `encode_mm`, `label_token_ids`) and `jemm/model.py` (softmax at `temperature`,
or `mm_temperature` with images), the network a plain forward."""

from __future__ import annotations

import json
import re
import string

import pytest
import torch
from transformers import AutoModelForImageTextToText

from jev_common.recipe import load_recipe
from jev_common.vl import load_vl_processor

from ..family_helpers import TOL, ask, assert_probs, served
from ..vl_helpers import pattern_image, png_uri, request_line

SYSTEM = (
    "Choose the best available candidate for the question using only the supplied state. "
    "Return exactly one candidate label."
)
LABELS = list(string.ascii_uppercase) + list("012345")
CONFIG = {"temperature": 1.7, "mm_temperature": 0.6, "threshold": 0.9}


@pytest.fixture(scope="module")
def jemm_dir(tmp_path_factory):
    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl

    folder = make_tiny_qwen3_5_vl(tmp_path_factory.mktemp("jemm"), seed=31)
    (folder / "decision_config.json").write_text(json.dumps(CONFIG))
    return folder


def jemm_recipe():
    recipe = load_recipe("jemm")
    model = recipe.model.model_copy(update={"hub_repo": "test/tiny-jemm", "revision": "local", "dtype": "float32"})
    return recipe.model_copy(update={"name": "tiny-jemm", "model": model})


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


def described(spec) -> str:
    return str(spec.get("description", "")) if isinstance(spec, dict) else ("" if spec is None else str(spec))


def candidates(question: dict) -> list[str]:
    criteria = question.get("criteria")
    if question["type"] == "noul":
        criteria = criteria or {}
        return [described(criteria.get("true")) or "yes", described(criteria.get("false")) or "no"]
    if question["type"] == "score":
        return [described(level) or f"level {i}" for i, level in enumerate(criteria)]
    return [described(spec) for spec in criteria.values()]


class Reference:
    def __init__(self, folder):
        self.processor = load_vl_processor(folder)
        self.tok = self.processor.tokenizer
        self.model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch.float32).eval()
        self.labels = [self.tok.encode(x, add_special_tokens=False)[0] for x in LABELS]

    def user(self, state, question: dict) -> str:
        state = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
        lines = [f"{LABELS[i]}) {flat(c)}" for i, c in enumerate(candidates(question))]
        return (
            "State:\n"
            + state.strip()
            + "\n\nQuestion: "
            + flat(str(question.get("instructions", "")))
            + "\n\nCandidates:\n"
            + "\n".join(lines)
            + "\n\nAnswer with exactly one candidate label."
        )

    @torch.inference_mode()
    def probabilities(self, state, question: dict, images=()) -> list[float]:
        kwargs = dict(add_generation_prompt=True, enable_thinking=False, preserve_thinking=False)
        if images:
            content = [{"type": "image"} for _ in images] + [{"type": "text", "text": self.user(state, question)}]
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": content}]
            text = self.processor.apply_chat_template(messages, tokenize=False, **kwargs)
            inputs = dict(self.processor(text=[text], images=list(images), return_tensors="pt"))
            inputs["mm_token_type_ids"] = (inputs["input_ids"] == self.model.config.image_token_id).int()
            inputs.pop("attention_mask", None)
            temperature = CONFIG["mm_temperature"]
        else:
            messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": self.user(state, question)}]
            text = self.tok.apply_chat_template(messages, tokenize=False, **kwargs)
            inputs = {"input_ids": torch.tensor([self.tok(text, add_special_tokens=False)["input_ids"]])}
            temperature = CONFIG["temperature"]
        logits = self.model(**inputs, use_cache=False).logits[0, -1].float()
        n = len(candidates(question))
        return torch.softmax(logits[self.labels[:n]] / temperature, -1).tolist()


@pytest.fixture(scope="module")
def reference(jemm_dir):
    return Reference(jemm_dir)


QUESTIONS = {
    "action": {
        "type": "choice",
        "instructions": "Choose   the next\naction.",
        "criteria": {"close": "Close the  dialog", "wait": None, "retry": {"description": "Retry the update"}},
    },
    "done": {"type": "noul", "instructions": "Is the update installed?", "criteria": {"true": "it is installed"}},
    "risk": {"type": "score", "instructions": "How risky is closing it?", "criteria": ["none", "some", "high"]},
}


async def test_jemm_answers_equal_its_own_contract(worker_settings, jemm_dir, reference):
    state = "  Update installed. A dialog asks to restart now or later.\n"
    object_state = {"screen": "settings", "dialog": {"title": "Restart?", "buttons": ["Now", "Later"]}}
    async with served(worker_settings(recipe=jemm_recipe(), model_path=str(jemm_dir))) as (front, worker, _):
        for sent in (state, object_state):
            answers = (await ask(front, sent, QUESTIONS))["answers"]
            want = reference.probabilities(sent, QUESTIONS["action"])
            assert_probs(answers["action"]["probabilities"], want, ["close", "wait", "retry"])
            assert max(want) - min(want) > 1e-3
            assert abs(answers["done"]["noul"] - reference.probabilities(sent, QUESTIONS["done"])[0]) <= TOL
            want = reference.probabilities(sent, QUESTIONS["risk"])
            assert_probs(answers["risk"]["probabilities"], want, ["0", "1", "2"])
            assert abs(answers["risk"]["score"] - sum(i * p for i, p in enumerate(want))) <= TOL
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["readout"] == "jemm-labels"
        assert serving["calibration"] == {"source": "decision_config.json", "temperature": 1.7, "mm_temperature": 0.6}

        many = {"type": "choice", "criteria": {f"o{i}": f"option {i}" for i in range(32)}}
        want = reference.probabilities(state, many)
        assert_probs(
            (await ask(front, state, {"q": many}))["answers"]["q"]["probabilities"], want, list(many["criteria"])
        )
        too_many = {"type": "choice", "criteria": {f"o{i}": None for i in range(33)}}
        assert "at most 32 options" in json.dumps(await ask(front, state, {"q": too_many}, status=422))
        for question in (
            {"type": "set", "criteria": {"a": None, "b": None}},
            {"type": "span", "criteria": ["Update", "dialog"]},
        ):
            body = await ask(front, state, {"q": question}, status=422)
            assert body["detail"]["error_type"] == "unsupported_question_type"


async def test_jemm_images_precede_the_text_at_the_image_temperature(worker_settings, jemm_dir, reference, tmp_path):
    from jev_preencoder.encode import Encoder
    from jev_preencoder.settings import PreencoderSettings

    seeds, size = (3, 4, 5, 6, 7), (64, 64)
    encoder = Encoder(PreencoderSettings(model_path=str(jemm_dir), device="cpu", dtype="float32", redis_url="none"))
    summary = await encoder.encode_lines([request_line(png_uri(s, size)) for s in seeds], str(tmp_path / "a"), None)
    assert summary.done == 5, summary.results
    state = "Before: <image:before> After: <image:after> Did the update finish?"
    asset = {s: {"type": "image", "format": "png", "data_base64": png_uri(s, size).split(",", 1)[1]} for s in seeds}
    assets = {"<image:before>": asset[3], "<image:after>": asset[4]}
    settings = worker_settings(recipe=jemm_recipe(), model_path=str(jemm_dir), asset_dir=str(tmp_path / "a"))
    async with served(settings) as (front, _, _):
        response = await front.post(
            "/v1/systemone", json={"model": "jev-latest", "state": state, "questions": QUESTIONS, "assets": assets}
        )
        body = await response.json()
        assert response.status == 200, body
        images = [pattern_image(s, size) for s in seeds[:2]]
        want = reference.probabilities(state, QUESTIONS["action"], images)
        assert_probs(body["answers"]["action"]["probabilities"], want, ["close", "wait", "retry"])
        assert (
            abs(body["answers"]["done"]["noul"] - reference.probabilities(state, QUESTIONS["done"], images)[0]) <= TOL
        )
        text_only = reference.probabilities(state, QUESTIONS["action"])
        assert max(abs(a - b) for a, b in zip(want, text_only)) > 1e-4  # the images and their temperature count

        five = {f"<image:{s}>": asset[s] for s in seeds}  # JEMM reads at most four images
        response = await front.post(
            "/v1/systemone",
            json={
                "model": "jev-latest",
                "state": " ".join(five),
                "questions": {"q": QUESTIONS["done"]},
                "assets": five,
            },
        )
        assert response.status == 422 and "at most 4" in await response.text()
        long_state = "Before: <image:before> " + "word " * 3100  # JEMM's prompt budget with images is 3072
        response = await front.post(
            "/v1/systemone",
            json={
                "model": "jev-latest",
                "state": long_state,
                "questions": {"q": QUESTIONS["done"]},
                "assets": {"<image:before>": asset[3]},
            },
        )
        assert response.status == 422 and "at most 3072" in await response.text()


# ypcypc/JEMM @0588a6975015a4f702b5c3a24b8fbbd4d824dd98: jemm/systemone.py `single_requests` takes the question as
# `str(question.get("instructions", ""))` and jemm/contract.py `single_messages` writes the user turn. For the state
# "Dialog open." and a choice between "close" ("Close it") and "wait" ("Wait"), what that code writes, copied out
# literally:
UPSTREAM_NULL_INSTRUCTIONS = (
    "State:\nDialog open.\n\nQuestion: None\n\nCandidates:\nA) Close it\nB) Wait\n\n"
    "Answer with exactly one candidate label."
)
UPSTREAM_ABSENT_INSTRUCTIONS = (
    "State:\nDialog open.\n\nQuestion: \n\nCandidates:\nA) Close it\nB) Wait\n\n"
    "Answer with exactly one candidate label."
)


async def test_jemm_writes_null_and_absent_instructions_as_upstream_does(worker_settings, jemm_dir, reference):
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    async with served(worker_settings(recipe=jemm_recipe(), model_path=str(jemm_dir))) as (front, _, service):
        model = service.model
        for sent, user in ((None, UPSTREAM_NULL_INSTRUCTIONS), ("absent", UPSTREAM_ABSENT_INSTRUCTIONS)):
            question = {"type": "choice", "criteria": {"close": "Close it", "wait": "Wait"}}
            if sent != "absent":
                question["instructions"] = None
            request = SystemOneRequest.model_validate(
                {"model": "jev-latest", "state": "Dialog open.", "questions": {"q": question}}
            )
            rows, plan = rows_for(request.questions, request.state, model.builder, model.readout.kinds)
            prepared = model.builder.prepare("Dialog open.", rows, (), plan)
            text = reference.tok.apply_chat_template(
                [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
                tokenize=False,
                add_generation_prompt=True,
                enable_thinking=False,
                preserve_thinking=False,
            )
            assert list(prepared.full_ids(0)) == reference.tok(text, add_special_tokens=False)["input_ids"]
            answered = (await ask(front, "Dialog open.", {"q": question}))["answers"]["q"]["probabilities"]
            assert_probs(answered, reference.probabilities("Dialog open.", question), ["close", "wait"])


async def test_jemm_refuses_a_null_score_level_as_the_public_schema_does(worker_settings, jemm_dir):
    """ypcypc/JEMM @0588a697 (`jemm/systemone.py` `candidates_for`) writes a null score level as `level i`, but the
    System One API's own schema has no null level: typesafe-sdk 0.7.5 `_schemas/models.py` `ScoreQuestion.criteria`
    is `list[str | dict | list]` (choice descriptions alone may be null) and jevcompat 0.1.1 (`checks.py`,
    `out-of-range` / `score-null-level`) lets a server answer it or refuse it with a 4xx. The shared schema refuses it
    (422 locating the level), before JEMM's prompt is built; the recipe README says so."""
    async with served(worker_settings(recipe=jemm_recipe(), model_path=str(jemm_dir))) as (front, _, _):
        body = await ask(front, "Dialog open.", {"q": {"type": "score", "criteria": ["low", None]}}, status=422)
    assert body["detail"] and all(
        e["loc"][:6] == ["body", "questions", "q", "score", "criteria", 1] for e in body["detail"]
    )
