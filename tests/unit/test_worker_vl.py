"""The worker on a vision-language recipe (tiny Qwen2-VL): a request with state.image is served from
the preencoded asset and equals the model's own forward on the raw image; L2/L3 caching (keyed by the
image hash too) and JEV_VL_CACHE=0 change nothing but the work done."""

from __future__ import annotations

import pytest
import torch

from jev_common.assets import asset_key
from jev_common.recipe import load_recipe
from jev_common.schema import DecisionRequest
from jev_worker.request.legacy import prepare_legacy
from jev_worker.settings import CacheSettings, WorkerSettings

from .vl_helpers import pattern_image, png_uri, request_line, tiny_encoder, tiny_vl_checkpoint
from .worker_helpers import (
    assert_close,
    post_as_one_batch,
    prefixes_in_one_forward,
    record_forwards,
    reference_row_probs,
    served_row_probs,
    worker_client,
)

SEEDS = (81, 82)


@pytest.fixture(scope="module")
def vl_recipe():
    recipe = load_recipe()
    model = recipe.model.model_copy(
        update={
            "hub_repo": "test/tiny-qwen2-vl",
            "revision": "local",
            "source": "hub",
            "gguf_file": None,
            "architecture": "Qwen2VLForConditionalGeneration",
            "modality": "vision-language",
            "dtype": "float32",
        }
    )
    return recipe.model_copy(update={"name": "tiny-qwen2-vl", "model": model})


@pytest.fixture
async def asset_dir(tmp_path):
    folder = tmp_path / "assets"
    summary = await tiny_encoder().encode_lines([request_line(png_uri(s)) for s in SEEDS], str(folder), None)
    assert summary.done == len(SEEDS)
    return str(folder)


def _settings(vl_recipe, asset_dir, cache=CacheSettings(True, 1024, 64 << 20, 64 << 20), **overrides):
    base = dict(
        recipe=vl_recipe,
        model_path=tiny_vl_checkpoint(),
        device="cpu",
        dtype="float32",
        redis_url="redis://127.0.0.1:1/0",
        asset_dir=asset_dir,
        worker_id="test-vl",
        cache=cache,
    )
    base.update(overrides)
    return WorkerSettings(**base)


def _body(seed: int, kind: str = "choice", question: str = "Which shape is drawn?") -> dict:
    if kind == "set":
        return {
            "kind": "set",
            "state": {"image": png_uri(seed), "text": "A drawing."},
            "question": question,
            "options": ["it has stripes", "it is dark", "it is a photo"],
        }
    return {
        "kind": "choice",
        "state": {"image": png_uri(seed), "text": "A drawing."},
        "question": question,
        "options": ["a square", "a circle", "a triangle"],
    }


@torch.inference_mode()
def _reference(service, body: dict) -> list[list[float]]:
    """The model's own end-to-end forward on the raw image (its vision tower, its M-RoPE) for the
    served prompt ids: softmax over the label logits at the last position of every row."""
    request = DecisionRequest.model_validate(body)
    model, processor = service.model.loaded.model, service.model.loaded.processor
    image = pattern_image(next(s for s in SEEDS + (0,) if png_uri(s) == body["state"]["image"]))
    pixels = processor.image_processor(images=[image], return_tensors="pt")
    n_tokens = int(pixels["image_grid_thw"].prod()) // 4
    placeholder = "<|vision_start|>" + "<|image_pad|>" * n_tokens + "<|vision_end|>"
    prepared = prepare_legacy(service.model.builder, request, [placeholder], (asset_key(body["state"]["image"]),))
    out = []
    for row, labels in zip(prepared.rows, prepared.row_labels):
        ids = torch.tensor([prepared.prefix_ids + row])
        logits = (
            model(
                input_ids=ids,
                pixel_values=pixels["pixel_values"],
                image_grid_thw=pixels["image_grid_thw"],
                mm_token_type_ids=(ids == model.config.image_token_id).int(),
            )
            .logits[0, -1]
            .float()
        )
        out.append(torch.softmax(logits[list(labels)], dim=-1).tolist())
    return out


async def test_image_request_equals_end_to_end_forward_and_caches(vl_recipe, asset_dir):
    async with worker_client(_settings(vl_recipe, asset_dir)) as (client, service):
        assert service.identity == tiny_encoder().identity  # the preencoder and the worker agree
        body = _body(SEEDS[0])
        first = await client.post("/v1/systemone", json=body)
        assert first.status == 200, await first.text()
        assert first.headers["x-jev-cache"] == "l1=miss,l2=miss,l3=miss"
        answer = await first.json()
        reference = _reference(service, body)
        assert_close(served_row_probs(body, answer), reference)
        # same request: every level hits, same answer, the prefix (system + image + state) was cached
        again = await client.post("/v1/systemone", json=body)
        assert again.headers["x-jev-cache"] == "l1=hit,l2=hit,l3=hit"
        cached = await again.json()
        assert cached["usage"]["cached_tokens"] > 0
        assert_close(served_row_probs(body, cached), reference)
        # another question about the same image reuses the image prefix
        other_q = _body(SEEDS[0], question="What colour dominates?")
        response = await client.post("/v1/systemone", json=other_q)
        assert response.headers["x-jev-cache"] == "l1=miss,l2=hit,l3=hit"
        assert_close(served_row_probs(other_q, await response.json()), _reference(service, other_q))
        # another image with the same grid tokenises identically: the L3 key must still tell them apart
        other_image = _body(SEEDS[1])
        response = await client.post("/v1/systemone", json=other_image)
        assert response.headers["x-jev-cache"] == "l1=miss,l2=miss,l3=miss"
        other_answer = await response.json()
        assert_close(served_row_probs(other_image, other_answer), _reference(service, other_image))
        assert max(abs(a - b) for a, b in zip(other_answer["probabilities"], answer["probabilities"])) > 1e-4
        stats = await (await client.get("/v1/cache/stats")).json()
        assert stats["levels"]["l2"]["hits"] == 2 and stats["levels"]["l2"]["resident_entries"] == 2


async def test_multi_row_kind_with_image(vl_recipe, asset_dir):
    async with worker_client(_settings(vl_recipe, asset_dir)) as (client, service):
        body = _body(SEEDS[1], kind="set")
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        assert_close(served_row_probs(body, await response.json()), _reference(service, body))


async def test_cache_off_rereads_assets_and_gives_the_same_answer(vl_recipe, asset_dir):
    body = _body(SEEDS[0])
    async with worker_client(_settings(vl_recipe, asset_dir, cache=CacheSettings(False, 1024, 64 << 20, 64 << 20))) as (
        client,
        service,
    ):
        reference = _reference(service, body)
        for expected_reads in (1, 2):
            response = await client.post("/v1/systemone", json=body)
            assert response.status == 200
            assert response.headers["x-jev-cache"] == "l1=off,l2=off,l3=off"
            answer = await response.json()
            assert answer["usage"]["cached_tokens"] == 0
            assert_close(served_row_probs(body, answer), reference)
            assert service.model.assets.counters()["disk_reads"] == expected_reads


async def test_missing_asset_and_text_only_requests(vl_recipe, asset_dir):
    async with worker_client(_settings(vl_recipe, asset_dir)) as (client, _service):
        unknown = png_uri(99)
        response = await client.post("/v1/systemone", json=dict(_body(SEEDS[0]), state={"image": unknown}))
        assert response.status == 422
        error = (await response.json())["detail"]
        assert error["error_type"] == "asset_not_prepared" and asset_key(unknown) in error["message"]
        text_only = {
            "kind": "choice",
            "state": {"text": "The door is open."},
            "question": "Is the door open?",
            "options": ["yes", "no"],
        }
        response = await client.post("/v1/systemone", json=text_only)
        assert response.status == 200, await response.text()
        assert_close(served_row_probs(text_only, await response.json()), reference_row_probs(_service, text_only))
        health = await (await client.get("/health")).json()
        assert health["detail"]["index"]["status"] == "degraded"  # Redis at a closed port: files still serve


async def test_concurrent_image_requests_batch_across_cached_prefixes(vl_recipe, asset_dir):
    """Warm prefixes of two images (plus a text state of another length) decided concurrently share
    one masked forward with each row's own M-RoPE positions; answers equal the one-by-one ones."""

    bodies = [
        _body(SEEDS[0]),
        _body(SEEDS[1], kind="set"),
        {
            "kind": "choice",
            "state": {"text": "No image here, only a longer text state. " * 3},
            "question": "Is there an image?",
            "options": ["yes", "no"],
        },
    ]
    async with worker_client(_settings(vl_recipe, asset_dir, batching=False)) as (client, _):
        single = [await (await client.post("/v1/systemone", json=b)).json() for b in bodies]
    async with worker_client(_settings(vl_recipe, asset_dir, max_wait_ms=250.0)) as (client, service):
        for body in bodies:
            await client.post("/v1/systemone", json=dict(body, question=body["question"] + " Look again."))
        forwards = record_forwards(service.model.engine)
        pilot = {"kind": "choice", "state": {"text": "A pilot request."}, "question": "q?", "options": ["a", "b"]}
        responses = await post_as_one_batch(client, service, bodies, pilot)
        batched = [await r.json() for r in responses]
    assert all("l3=hit" in r.headers["x-jev-cache"] for r in responses)
    assert prefixes_in_one_forward(forwards) >= 3
    for body, a, b in zip(bodies, single, batched):
        assert_close(served_row_probs(body, a), served_row_probs(body, b))


async def test_envelope_images_are_placed_where_the_state_names_them(vl_recipe, asset_dir):
    """An inline asset is found in a text state and, JSON-escaped, in an object state; an asset the
    state never names, or one named in a question, is refused instead of answered without the image."""
    b64 = png_uri(SEEDS[0]).split(",", 1)[1]
    asset = {"type": "image", "format": "png", "data_base64": b64}
    question = {"q": {"type": "choice", "instructions": "Which shape?", "criteria": {"square": None, "circle": None}}}
    ref = 'img "one"'
    async with worker_client(_settings(vl_recipe, asset_dir)) as (client, service):
        text_state = await client.post(
            "/v1/systemone",
            json={"model": "jev-latest", "state": f"A drawing: {ref}", "questions": question, "assets": {ref: asset}},
        )
        assert text_state.status == 200, await text_state.text()
        object_state = await client.post(
            "/v1/systemone",
            json={
                "model": "jev-latest",
                "state": {"caption": "A drawing", "image": ref},
                "questions": question,
                "assets": {ref: asset},
            },
        )
        assert object_state.status == 200, await object_state.text()
        assert service.model.assets.stats().hits >= 1  # the second request found the same asset in L2
        unused = await client.post(
            "/v1/systemone",
            json={"model": "jev-latest", "state": "A drawing.", "questions": question, "assets": {ref: asset}},
        )
        assert unused.status == 422 and "not placed in the state" in (await unused.json())["detail"][0]["msg"]
        in_question = await client.post(
            "/v1/systemone",
            json={
                "model": "jev-latest",
                "state": f"A drawing: {ref}",
                "assets": {ref: asset},
                "questions": {"q": {"type": "noul", "instructions": f"Is {ref} striped?"}},
            },
        )
        assert in_question.status == 422 and "state only" in (await in_question.json())["detail"][0]["msg"]


async def test_several_images_in_one_state_equal_the_models_own_forward(vl_recipe, asset_dir):
    """JEMM-style states with several images: each reference becomes its image's placeholder in place,
    the prefix carries all of them, and every answer equals the model's own end-to-end forward on the
    raw images (its vision tower, its M-RoPE over both images)."""
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import question_rows

    images = {
        f"<img{i}>": {"type": "image", "format": "png", "data_base64": png_uri(seed).split(",", 1)[1]}
        for i, seed in enumerate(SEEDS)
    }
    body = {
        "model": "jev-latest",
        "state": ["Before:", "<img0>", "After:", "<img1>"],
        "assets": images,
        "questions": {
            "same": {"type": "noul", "instructions": "Do the two pictures show the same pattern?"},
            "which": {
                "type": "choice",
                "instructions": "Which picture is darker?",
                "criteria": {"the first": None, "the second": None},
            },
        },
    }
    async with worker_client(_settings(vl_recipe, asset_dir)) as (client, service):
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        answers = (await response.json())["answers"]
        model, processor = service.model.loaded.model, service.model.loaded.processor
        pixels = processor.image_processor(images=[pattern_image(s) for s in SEEDS], return_tensors="pt")
        counts = [int(g.prod()) // 4 for g in pixels["image_grid_thw"]]
        state = '["Before:", "P0", "After:", "P1"]'
        for i, n in enumerate(counts):
            state = state.replace(f"P{i}", "<|vision_start|>" + "<|image_pad|>" * n + "<|vision_end|>")
        rows, _ = question_rows(SystemOneRequest.model_validate(body), service.model.builder)
        prepared = service.model.builder.prepare(state, rows)
        for qid, row_index in (("same", 0), ("which", 1)):
            ids = torch.tensor([prepared.full_ids(row_index)])
            with torch.inference_mode():
                logits = (
                    model(
                        input_ids=ids,
                        pixel_values=pixels["pixel_values"],
                        image_grid_thw=pixels["image_grid_thw"],
                        mm_token_type_ids=(ids == model.config.image_token_id).int(),
                    )
                    .logits[0, -1]
                    .float()
                )
            reference = torch.softmax(logits[list(rows[row_index].labels)], dim=-1).tolist()
            answer = answers[qid]
            served = [answer["noul"], 1 - answer["noul"]] if qid == "same" else list(answer["probabilities"].values())
            assert max(abs(a - b) for a, b in zip(served, reference)) < 1e-5, (qid, served, reference)
