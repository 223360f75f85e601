"""Served prompts are exact: the token ids are the one-pass tokenisation of the text the model's own
chat template renders, and the served probabilities equal a plain forward on those ids.

The reference here never uses the worker's prefix/row split: it renders the whole prompt with
`tokenizer.apply_chat_template` (or the plain layout), tokenises it once and runs `model(input_ids)`.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from jev_common.schema import SystemOneRequest
from jev_worker.prompt.builder import ChatPromptBuilder
from jev_worker.questions.plan import question_rows
from jev_worker.request.envelope import render_state
from jev_worker.settings import CacheSettings

from .worker_helpers import worker_client

STATE = "The kettle on the stove is whistling and steam is coming out of its spout.\n\n"
QUESTIONS = {
    "noul": {
        "type": "noul",
        "instructions": "Is the water boiling?",
        "criteria": {"true": "It boils", "false": {"not": ["boiling"]}},
    },
    "choice": {
        "type": "choice",
        "instructions": ["What", "is on the stove?"],
        "criteria": {"a pan": None, "a kettle": "metal, with a spout", "nothing": None},
    },
    "score": {"type": "score", "instructions": "How hot is the water?", "criteria": ["cold", "warm", "hot", {"x": 1}]},
    "span": {"type": "span", "instructions": "Which object whistles?", "criteria": ["kettle", "stove", "steam"]},
    "set": {"type": "set", "criteria": {"steam is visible": None, "the stove is off": "it is cold"}},
}
CACHE_OFF = CacheSettings(False, 1024, 64 << 20, 64 << 20)
CACHE_ON = CacheSettings(True, 1024, 64 << 20, 64 << 20)


def one_pass_ids(builder: ChatPromptBuilder, state_text: str, row_content: str) -> list[int]:
    """The model's own prompt: its chat template over [system, user], tokenised in one pass."""
    tokenizer, prompt = builder.tokenizer, builder.recipe.prompt
    content = prompt.state_block.format(state=state_text) + row_content
    if builder.use_chat:
        messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
        messages.append({"role": "user", "content": content})
        text = (
            tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + prompt.answer_prefix
        )
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    text = (prompt.system + "\n\n" if prompt.system else "") + content + "\n" + prompt.answer_prefix
    return tokenizer(text, add_special_tokens=True)["input_ids"]


def served_rows(answer: dict) -> list[list[float]]:
    if answer["type"] == "noul":
        return [[answer["noul"], 1 - answer["noul"]]]
    if answer["type"] == "set":
        return [[p, 1 - p] for p in answer["probabilities"].values()]
    return [list(answer["probabilities"].values())]


@torch.inference_mode()
def reference_rows(service, body: dict, qid: str) -> list[list[float]]:
    request = SystemOneRequest.model_validate({**body, "questions": {qid: body["questions"][qid]}})
    rows, _ = question_rows(request, service.model.builder)
    out = []
    for row in rows:
        ids = one_pass_ids(service.model.builder, render_state(request), row.content)
        prepared = service.model.builder.prepare(render_state(request), [row])
        assert list(prepared.full_ids(0)) == ids  # the ids the engine runs are the one-pass ids
        logits = service.model.loaded.model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        out.append(torch.softmax(logits[list(row.labels)], dim=-1).tolist())
    return out


@pytest.fixture(params=["chat", "plain"])
def layout_recipe(request, tiny_recipe):
    prompt = tiny_recipe.prompt.model_copy(update={"use_chat_template": request.param == "chat"})
    return tiny_recipe.model_copy(update={"prompt": prompt})


@pytest.mark.parametrize("cache", [CACHE_ON, CACHE_OFF], ids=["cache-on", "cache-off"])
async def test_every_question_type_equals_the_one_pass_reference(worker_settings, layout_recipe, cache):
    body = {"model": "jev-latest", "state": STATE, "questions": QUESTIONS}
    async with worker_client(worker_settings(recipe=layout_recipe, cache=cache)) as (client, service):
        assert service.model.builder.use_chat == layout_recipe.prompt.use_chat_template
        for _ in range(2):  # the second time the prefix comes from L3 (when on)
            response = await client.post("/v1/systemone", json=body)
            assert response.status == 200, await response.text()
            answers = (await response.json())["answers"]
            for qid in QUESTIONS:
                served, reference = served_rows(answers[qid]), reference_rows(service, body, qid)
                assert len(served) == len(reference)
                for a, b in zip(served, reference):
                    assert max(abs(x - y) for x, y in zip(a, b)) <= 1e-5, (qid, a, b)
        if cache is CACHE_ON:
            assert service.caches.l3.stats().hits >= 1


def test_split_tokenisation_would_differ(tiny_recipe):
    """The case that made the old path inexact: tokenising prefix and row apart merges "\\n\\n"."""
    from tools.tiny_checkpoints import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    builder = ChatPromptBuilder(tokenizer, tiny_recipe, "test")
    request = SystemOneRequest.model_validate({"model": "m", "state": "abc", "questions": {"q": QUESTIONS["noul"]}})
    rows, _ = question_rows(request, builder)
    text = builder.reference_text("abc", rows[0])
    head_len = len(builder.layout.head + tiny_recipe.prompt.state_block.format(state="abc"))
    glued = (
        tokenizer(text[:head_len], add_special_tokens=False)["input_ids"]
        + tokenizer(text[head_len:], add_special_tokens=False)["input_ids"]
    )
    prepared = builder.prepare("abc", rows)
    assert list(prepared.full_ids(0)) == one_pass_ids(builder, "abc", rows[0].content)
    assert glued != list(prepared.full_ids(0))


def test_chat_template_kwargs_reach_the_template(tiny_recipe):
    """A recipe's prompt.chat_template_kwargs (e.g. enable_thinking: false) are the template's variables, so the
    answer turn the rows end with is the one the model's own template renders with them."""
    from tools.tiny_checkpoints import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    tokenizer.chat_template = (
        "{%- for m in messages -%}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{%- endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
        "{%- if enable_thinking is defined and not enable_thinking -%}<think>\n\n</think>\n\n{%- endif -%}"
        "{%- endif -%}"
    )
    tails = {}
    for kwargs in ({}, {"enable_thinking": False}):
        prompt = tiny_recipe.prompt.model_copy(update={"chat_template_kwargs": kwargs})
        builder = ChatPromptBuilder(tokenizer, tiny_recipe.model_copy(update={"prompt": prompt}), "test")
        tails[bool(kwargs)] = builder.layout.tail
        want = tokenizer.apply_chat_template(
            [{"role": "system", "content": prompt.system}, {"role": "user", "content": "x"}],
            tokenize=False,
            add_generation_prompt=True,
            **kwargs,
        )
        assert builder.layout.head + "x" + builder.layout.tail == want
    assert tails[True].endswith("</think>") and "</think>" not in tails[False]


@pytest.fixture(scope="module")
def builders(tiny_recipe):
    from tools.tiny_checkpoints import smollm2_tokenizer

    tokenizer = smollm2_tokenizer()
    out = {}
    for layout in ("chat", "plain"):
        prompt = tiny_recipe.prompt.model_copy(update={"use_chat_template": layout == "chat"})
        out[layout] = ChatPromptBuilder(tokenizer, tiny_recipe.model_copy(update={"prompt": prompt}), "test")
    return out


_piece = st.sampled_from(
    list("ab Z\n\t\u00e9\u00fc\u4e2d\U0001f600\x00{}:.-") + ["\x00JEV-SPLIT\x00", "  ", "\n\n", "Question"]
)
_text = st.lists(_piece, min_size=1, max_size=20).map("".join).map(lambda s: s if s.strip() else s + "x")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    state=_text,
    question=_text,
    options=st.lists(_text, min_size=2, max_size=5, unique=True),
    layout=st.sampled_from(["chat", "plain"]),
)
def test_property_served_ids_are_one_pass_ids(builders, state, question, options, layout):
    builder = builders[layout]
    body = {
        "model": "m",
        "state": state,
        "questions": {
            "n": {"type": "noul", "instructions": question},
            "c": {"type": "choice", "instructions": question, "criteria": {o: None for o in options}},
            "s": {"type": "score", "criteria": options},
            "t": {"type": "set", "criteria": {o: question for o in options}},
        },
    }
    request = SystemOneRequest.model_validate(body)
    rows, _ = question_rows(request, builder)
    prepared = builder.prepare(render_state(request), rows)
    for i, row in enumerate(rows):
        assert list(prepared.full_ids(i)) == one_pass_ids(builder, render_state(request), row.content)
    assert state in builder.reference_text(render_state(request), rows[0])  # user text reaches the model as sent


def test_prefix_is_shared_by_different_questions_about_one_state(builders):
    builder = builders["chat"]
    keys = set()
    for questions in ({"a": QUESTIONS["noul"]}, {"b": QUESTIONS["choice"], "c": QUESTIONS["score"]}):
        request = SystemOneRequest.model_validate({"model": "m", "state": STATE, "questions": questions})
        rows, _ = question_rows(request, builder)
        prepared = builder.prepare(render_state(request), rows)
        assert not prepared.boundary_mismatch
        assert len(prepared.prefix_ids) > 20
        keys.add(prepared.prefix_key)
    assert len(keys) == 1


@pytest.mark.parametrize("where", ["state", "instructions", "option"])
async def test_control_tokens_in_user_text_are_refused(worker_settings, where):
    text = "before <|im_end|> after"
    body = {
        "model": "jev-latest",
        "state": STATE,
        "questions": {"q": {"type": "choice", "criteria": {"a": None, "b": None}}},
    }
    if where == "state":
        body["state"] = text
    elif where == "instructions":
        body["questions"]["q"]["instructions"] = text
    else:
        body["questions"]["q"]["criteria"] = {text: None, "b": None}
    async with worker_client(worker_settings()) as (client, _):
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 422
        detail = (await response.json())["detail"]
        assert "<|im_end|>" in detail[0]["msg"]


def test_nul_bytes_and_the_old_marker_reach_the_model(builders):
    builder = builders["chat"]
    state = "a\x00JEV-SPLIT\x00b \x00 end"
    request = SystemOneRequest.model_validate({"model": "m", "state": state, "questions": {"q": QUESTIONS["noul"]}})
    rows, _ = question_rows(request, builder)
    prepared = builder.prepare(render_state(request), rows)
    decoded = builder.tokenizer.decode(prepared.full_ids(0))
    assert state in decoded


@pytest.mark.parametrize("kind", ["choice", "noul", "score", "span", "set"])
@pytest.mark.parametrize("layout", ["chat", "plain"])
def test_single_question_form_is_one_pass_too(builders, kind, layout):
    from jev_common.schema import DecisionRequest
    from jev_worker.request.legacy import legacy_rows, legacy_state_text
    from tools.example_requests import REQUESTS

    builder = builders[layout]
    request = DecisionRequest.model_validate(REQUESTS[kind])
    rows, _ = legacy_rows(request, builder)
    state_text = legacy_state_text(request, [])
    prepared = builder.prepare(state_text, rows)
    for i, row in enumerate(rows):
        assert list(prepared.full_ids(i)) == one_pass_ids(builder, state_text, row.content)


def test_image_placeholders_are_tokenised_in_the_same_pass(tiny_recipe):
    """A vision-language prompt: the placeholder (vision start, image pads, vision end) is part of the
    one-pass text; the served ids equal the processor tokenizer's ids of the whole prompt."""
    from transformers import AutoTokenizer

    from .vl_helpers import tiny_vl_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_checkpoint())
    builder = ChatPromptBuilder(tokenizer, tiny_recipe, "test")
    placeholder = "<|vision_start|>" + "<|image_pad|>" * 4 + "<|vision_end|>"
    state = f'["A drawing:", "{placeholder}"]'
    request = SystemOneRequest.model_validate(
        {"model": "m", "state": "x", "questions": {"q": QUESTIONS["choice"], "n": QUESTIONS["noul"]}}
    )
    rows, _ = question_rows(request, builder)
    prepared = builder.prepare(state, rows)
    pad = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert list(prepared.prefix_ids).count(pad) == 4  # the image lies in the shared prefix
    for i, row in enumerate(rows):
        assert list(prepared.full_ids(i)) == one_pass_ids(builder, state, row.content)


def test_indexed_json_numbers_the_items_of_long_arrays():
    """jev_common.state_text.indexed_json is upstream's `json.dumps(annotate_indices(state), ensure_ascii=False)`
    (Mapika/decider systemone.py, StartLux-Decision jevfmt.py): literal outputs from system1-omni
    tests/decider/data/cpu.json@42d1f04e (fixtures score_2 and structured_mixed)."""
    from jev_common.state_text import indexed_json

    item = {"_index": 77, "text": "保留"}
    assert indexed_json({"items": [1, item] * 4}) == (
        '{"items": [{"_index": 0, "value": 1}, {"_index": 77, "text": "保留"}, {"_index": 2, "value": 1}, '
        '{"_index": 77, "text": "保留"}, {"_index": 4, "value": 1}, {"_index": 77, "text": "保留"}, '
        '{"_index": 6, "value": 1}, {"_index": 77, "text": "保留"}]}'
    )
    assert indexed_json({"b": "é", "a": [-0.0, 1e-05, 1e16, None]}) == '{"b": "é", "a": [-0.0, 1e-05, 1e+16, null]}'
    assert indexed_json([[1] * 7, {"k": [True] * 8}]) == (
        '[[1, 1, 1, 1, 1, 1, 1], {"k": [' + ", ".join(f'{{"_index": {i}, "value": true}}' for i in range(8)) + "]}]"
    )
