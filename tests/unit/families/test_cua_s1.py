"""cua-s1-labels on causal-lm (Cua-S1 4B 0.2, text adapter) on a tiny checkpoint: every choice answer equal to
Cua-S1's text contract written out here after system1-omni `src/models/cua_s1/text/contract.py`
(`map_request`, `build_messages`) and `model.py` (`encode`: the chat template's generation prompt, then the
tokenizer; `score`: a float32 softmax over the option letters at the last position): ThinkFlowLab/system1-omni
`src/models/cua_s1/text/contract.py` @ 8f82d2d1a97ae4dd20fe515594f34daef71e31e2 (whose SYSTEM_PROMPT and user message
are copied from trycua/cua @ 0e75660c `libs/cua-s1/python/src/cua_s1/four_b.py`) and `model.py` @
b8357d431c431620e6e2c57f6c6ab530a606e3a6. SYSTEM_PROMPT and the user layout below are contract.py's, literally;
`UPSTREAM_USER` is `build_messages` for TREE and QUESTIONS["keep"], written out."""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jev_common.recipe import load_recipe

from ..family_helpers import ask, assert_probs, served

SYSTEM_PROMPT = (
    "You are a one-pass computer-use decision model. You are shown the current state of a screen and a fixed, "
    "closed list of candidate (element, action) options, each given a single letter. Choose exactly one option: "
    "the single best next action to take. Answer with ONLY that option's letter -- no words, no punctuation, no "
    "explanation."
)
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
TREE = 'window "Delete files?"\n  button "Delete"\n  button "Cancel"'


def cua_recipe():
    recipe = load_recipe("cua-s1-4b-0.2-text")
    model = recipe.model.model_copy(update={"hub_repo": "test/tiny-cua", "revision": "local", "dtype": "float32"})
    return recipe.model_copy(update={"name": "tiny-cua", "model": model})


def _text(value):
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@torch.inference_mode()
def reference(folder: str, state, question: dict) -> list[float]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    goal = "" if question.get("instructions") is None else _text(question["instructions"])
    labels = [
        json.dumps(k if v is None else _text(v), ensure_ascii=False)[1:-1] for k, v in question["criteria"].items()
    ]
    options = "\n".join(f'{letter}. Decision "{label}" -> select' for letter, label in zip(LETTERS, labels))
    user = (
        (f"Goal: {goal}\n\n" if goal else "")
        + "App: Cua Driver\nTask family: closed-candidate decision\n\n"
        + f"Accessibility tree:\n{_text(state)}\n\nOptions:\n{options}\n\nAnswer with a single letter."
    )
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    inputs = tokenizer(text, return_tensors="pt")
    letter_ids = tokenizer.convert_tokens_to_ids(list(LETTERS))
    logits = model(**inputs).logits[0, -1]
    return torch.softmax(logits[letter_ids[: len(labels)]].float(), dim=-1).tolist()


QUESTIONS = {
    "keep": {
        "type": "choice",
        "instructions": "Keep the files.",
        "criteria": {"delete": 'Click "Delete"', "cancel": None, "close": {"element": "window", "action": "close"}},
    },
    "any": {"type": "choice", "criteria": {"Click Delete": None, "Click Cancel": None}},
}


async def test_cua_s1_answers_equal_its_text_contract(worker_settings, tiny_text_dir):
    object_state = {"window": "Delete files?", "buttons": ["Delete", "Cancel"], "note": "très important"}
    async with served(worker_settings(recipe=cua_recipe(), model_path=tiny_text_dir)) as (front, worker, _):
        for state in (TREE, object_state):
            answers = (await ask(front, state, QUESTIONS))["answers"]
            want = reference(tiny_text_dir, state, QUESTIONS["keep"])
            assert_probs(answers["keep"]["probabilities"], want, ["delete", "cancel", "close"])
            assert max(want) - min(want) > 1e-3
            assert answers["keep"]["choice"] == ["delete", "cancel", "close"][max(range(3), key=want.__getitem__)]
            assert_probs(
                answers["any"]["probabilities"],
                reference(tiny_text_dir, state, QUESTIONS["any"]),
                ["Click Delete", "Click Cancel"],
            )
        serving = (await (await worker.get("/health")).json())["detail"]["serving"]
        assert serving["readout"] == "cua-s1-labels" and serving["question_types"] == ["choice"]
        # one option: upstream answers 1 to 26 (a softmax over one letter); so does the worker
        one = {"type": "choice", "instructions": "Close the dialog.", "criteria": {"close": "Click Close"}}
        assert (await ask(front, TREE, {"q": one}))["answers"]["q"]["probabilities"] == {"close": 1.0}

        for question in (
            {"type": "noul", "instructions": "Is it open?"},
            {"type": "score", "criteria": ["low", "high"]},
        ):
            body = await ask(front, TREE, {"q": question}, status=422)
            assert body["detail"]["error_type"] == "unsupported_question_type"
        many = {"type": "choice", "criteria": {f"o{i}": None for i in range(27)}}
        assert "at most 26 options" in json.dumps(await ask(front, TREE, {"q": many}, status=422))


# contract.py @8f82d2d1 `build_messages(*map_request(body))` for TREE and QUESTIONS["keep"], the user turn written out
# (option labels are `json.dumps(...)[1:-1]` of the description, or of the key when it is null):
UPSTREAM_USER = (
    "Goal: Keep the files.\n\nApp: Cua Driver\nTask family: closed-candidate decision\n\n"
    'Accessibility tree:\nwindow "Delete files?"\n  button "Delete"\n  button "Cancel"\n\n'
    'Options:\nA. Decision "Click \\"Delete\\"" -> select\nB. Decision "cancel" -> select\n'
    'C. Decision "{\\"element\\": \\"window\\", \\"action\\": \\"close\\"}" -> select\n\n'
    "Answer with a single letter."
)


async def test_cua_s1_prompt_is_upstreams_literal_text(worker_settings, tiny_text_dir):
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    tokenizer = AutoTokenizer.from_pretrained(tiny_text_dir)
    async with served(worker_settings(recipe=cua_recipe(), model_path=tiny_text_dir)) as (_, _, service):
        model = service.model
        request = SystemOneRequest.model_validate(
            {"model": "jev-latest", "state": TREE, "questions": {"keep": QUESTIONS["keep"]}}
        )
        rows, plan = rows_for(request.questions, request.state, model.builder, model.readout.kinds)
        prepared = model.builder.prepare(TREE, rows, (), plan)
    text = tokenizer.apply_chat_template(
        [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": UPSTREAM_USER}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert list(prepared.full_ids(0)) == tokenizer(text)["input_ids"]  # model.py `encode`: the tokenizer on that text
