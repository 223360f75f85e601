"""The worker on the flagship's architecture (tiny random Qwen3.5 VL: Gated DeltaNet linear attention +
gated full attention, Qwen3-VL-style vision tower), served with the flagship recipe's prompt and
verbalizer: an image request served from the preencoded asset equals the model's own end-to-end
forward on the raw image (processor(text, images) -> model(**inputs)); the prefix state is a
whole-cache snapshot (recurrent + conv state beside the KV) that L3 keeps and branches per row."""
from __future__ import annotations

import pytest
import torch

from jev_common.assets import asset_key
from jev_common.recipe import load_recipe
from jev_common.schema import DecisionRequest
from jev_preencoder.encode import Encoder
from jev_preencoder.settings import PreencoderSettings
from jev_worker.settings import CacheSettings, WorkerSettings
from jev_worker.legacy import prepare_legacy

from .vl_helpers import pattern_image, png_uri, request_line
from .worker_helpers import record_forwards, assert_close, served_row_probs, worker_client

SEEDS = (91, 92)
WIDE = (93, (96, 64))  # a 96x64 image: a [1, 4, 6] grid, so M-RoPE height and width positions differ
IMAGES = {png_uri(s): (s, (56, 56)) for s in SEEDS} | {png_uri(*WIDE): WIDE}
LONG_STATE = "A drawing on white paper, made with a ruler and coloured pencils, pinned to a board. " * 3
CACHE_ON = CacheSettings(True, 1024, 64 << 20, 64 << 20)
CACHE_OFF = CacheSettings(False, 1024, 64 << 20, 64 << 20)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl

    return str(make_tiny_qwen3_5_vl(tmp_path_factory.mktemp("tiny-qwen3_5-vl")))


@pytest.fixture(scope="module")
def encoder(checkpoint):
    return Encoder(PreencoderSettings(model_path=checkpoint, device="cpu", dtype="float32", redis_url="none"))


@pytest.fixture(scope="module")
def recipe():
    """The flagship recipe (its prompt, verbalizer and batching), pointed at the tiny checkpoint in FP32."""
    flagship = load_recipe("jev-27b-vl")
    assert flagship.model.architecture == "Qwen3_5ForConditionalGeneration"
    model = flagship.model.model_copy(update={"hub_repo": "test/tiny-qwen3_5-vl", "revision": "local",
                                              "dtype": "float32"})
    return flagship.model_copy(update={"name": "tiny-qwen3_5-vl", "model": model})


@pytest.fixture
async def asset_dir(tmp_path, encoder):
    folder = tmp_path / "assets"
    summary = await encoder.encode_lines([request_line(uri) for uri in IMAGES], str(folder), None)
    assert summary.done == len(IMAGES), summary.results
    return str(folder)


def _settings(recipe, checkpoint, asset_dir, cache=CACHE_ON, **overrides) -> WorkerSettings:
    base = dict(recipe=recipe, model_path=checkpoint, device="cpu", dtype="float32",
                redis_url="redis://127.0.0.1:1/0", asset_dir=asset_dir, worker_id="test-qwen3_5-vl", cache=cache)
    base.update(overrides)
    return WorkerSettings(**base)


def _body(seed: int, kind: str = "choice", question: str = "Which shape is drawn?", size=(56, 56),
          text: str = "A drawing.") -> dict:
    state = {"image": png_uri(seed, size), "text": text}
    if kind == "set":
        return {"kind": "set", "state": state, "question": question,
                "options": ["it has stripes", "it is dark", "it is a photo"]}
    return {"kind": "choice", "state": state, "question": question, "options": ["a square", "a circle", "a triangle"]}


@torch.inference_mode()
def _reference(service, body: dict) -> list[list[float]]:
    """The model's own end-to-end forward on the raw image, through its processor: each served row's
    text with the image as the processor's one-token placeholder -> processor(text, images) ->
    model(**inputs) (its vision tower, its get_rope_index, its own hybrid cache-less forward); softmax
    over the label logits at the last position. The processor's ids must be the served ids."""
    request = DecisionRequest.model_validate(body)
    model, processor = service.loaded.model, service.loaded.processor
    tokenizer = processor.tokenizer
    image = pattern_image(*IMAGES[body["state"]["image"]])
    grid = processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"]
    n_tokens = int(grid.prod()) // processor.image_processor.merge_size ** 2
    expanded = processor.image_token * n_tokens
    placeholder = processor.vision_start_token + expanded + processor.vision_end_token
    prepared = prepare_legacy(service.builder, request, [placeholder], (asset_key(body["state"]["image"]),))
    out = []
    for row, labels in zip(prepared.rows, prepared.row_labels):
        served = list(prepared.prefix_ids + row)
        text = tokenizer.decode(served, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        assert text.count(expanded) == 1
        inputs = processor(text=[text.replace(expanded, processor.image_token)], images=[image], return_tensors="pt")
        assert inputs["input_ids"][0].tolist() == served  # the worker's prompt is the processor's prompt
        logits = model(**inputs).logits[0, -1].float()
        out.append(torch.softmax(logits[list(labels)], dim=-1).tolist())
    return out


async def test_image_request_equals_end_to_end_forward(recipe, checkpoint, asset_dir, encoder):
    body = _body(SEEDS[0])
    async with worker_client(_settings(recipe, checkpoint, asset_dir, cache=CACHE_OFF)) as (client, service):
        assert type(service.loaded.model).__name__ == "Qwen3_5ForConditionalGeneration"
        assert service.identity == encoder.identity  # the preencoder and the worker agree
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        assert response.headers["x-jev-cache"] == "l1=off,l2=off,l3=off"
        answer = await response.json()
        reference = _reference(service, body)
        assert_close(served_row_probs(body, answer), reference)
        # the image matters: another image (same grid, same prompt ids) gives another answer
        other = _body(SEEDS[1])
        other_answer = await (await client.post("/v1/systemone", json=other)).json()
        assert_close(served_row_probs(other, other_answer), _reference(service, other))
        assert max(abs(a - b) for a, b in zip(other_answer["probabilities"], answer["probabilities"])) > 1e-4
        wide = _body(WIDE[0], size=WIDE[1])
        response = await client.post("/v1/systemone", json=wide)
        assert response.status == 200, await response.text()
        assert_close(served_row_probs(wide, await response.json()), _reference(service, wide))


async def test_l3_snapshot_hit_equals_uncached(recipe, checkpoint, asset_dir):
    # a prefix longer than the pure-torch gated-delta rule's 64-token chunk
    first_q = _body(SEEDS[0], text=LONG_STATE)
    second_q = _body(SEEDS[0], text=LONG_STATE, question="What colour dominates?")
    async with worker_client(_settings(recipe, checkpoint, asset_dir, cache=CACHE_OFF)) as (client, _):
        uncached = [await (await client.post("/v1/systemone", json=b)).json() for b in (first_q, second_q)]
    async with worker_client(_settings(recipe, checkpoint, asset_dir)) as (client, service):
        first = await client.post("/v1/systemone", json=first_q)
        assert first.status == 200, await first.text()
        assert first.headers["x-jev-cache"] == "l1=miss,l2=miss,l3=miss"
        engine = service.engine
        assert engine.prefix_mode == "snapshot" and engine.kv_branching is True
        second = await client.post("/v1/systemone", json=second_q)  # same image and state, new question
        assert second.headers["x-jev-cache"] == "l1=miss,l2=hit,l3=hit"
        hit = await second.json()
        assert hit["usage"]["cached_tokens"] > 0
        assert_close(served_row_probs(first_q, await first.json()), served_row_probs(first_q, uncached[0]))
        assert_close(served_row_probs(second_q, hit), served_row_probs(second_q, uncached[1]))
        assert_close(served_row_probs(second_q, hit), _reference(service, second_q))
        # every L3 entry is a whole-cache snapshot: linear-attention (conv + recurrent) layers beside KV layers
        states = [engine.l3.get(key) for key in engine.l3.keys()]
        assert states and all(s.snapshot is not None and not s.kv for s in states)
        layer_kinds = [type(layer).__name__ for layer in states[0].snapshot.layers]
        assert len(layer_kinds) == 4 and len(set(layer_kinds)) == 2, layer_kinds


async def test_set_kind_rows_branch_from_one_snapshot(recipe, checkpoint, asset_dir):
    body = _body(SEEDS[1], kind="set")
    async with worker_client(_settings(recipe, checkpoint, asset_dir)) as (client, service):
        engine = service.engine
        forwards = record_forwards(engine)
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        assert engine.prefix_mode == "snapshot" and engine.kv_branching is True
        answer = await response.json()
        reference = _reference(service, body)
    assert_close(served_row_probs(body, answer), reference)
    # all three rows ran in one forward after copies of the image prefix's snapshot
    cache_kw = engine._cache_kwarg
    branched = [kw for kw in forwards if kw.get("input_ids") is not None and kw.get(cache_kw) is not None
                and kw["input_ids"].shape[0] == len(body["options"])]
    assert branched, [(tuple(kw.get("input_ids", kw.get("inputs_embeds")).shape)) for kw in forwards]
