"""The worker on the flagship's architecture (tiny random Qwen3.5 VL: Gated DeltaNet linear attention +
gated full attention, Qwen3-VL-style vision tower) as the flagship recipe serves it (family jev-vl, the
checkpoint in the release's layout: tools/tiny_jev_vl_checkpoint.py): an image request served from the
preencoded asset equals upstream's System 1 on the raw image (serve_decide.py's prompt written out in
tests/unit/families/test_jev_vl.py -> processor(text, images) -> the model's own forward -> s1_pass's
formula); the prefix state is a whole-cache snapshot (recurrent + conv state beside the KV) that L3 keeps
and branches per row."""

from __future__ import annotations

import pytest

from jev_preencoder.encode import Encoder
from jev_preencoder.settings import PreencoderSettings
from jev_worker.settings import CacheSettings, WorkerSettings

from .families.test_jev_vl import Upstream, as_decide, jev_recipe
from .vl_helpers import pattern_image, png_uri, request_line
from .worker_helpers import assert_close, record_forwards, worker_client

SEEDS = (91, 92)
WIDE = (93, (96, 64))  # a 96x64 image: a [1, 4, 6] grid, so M-RoPE height and width positions differ
IMAGES = {png_uri(s, (56, 56)): (s, (56, 56)) for s in SEEDS} | {png_uri(*WIDE): WIDE}
LONG_STATE = "A drawing on white paper, made with a ruler and coloured pencils, pinned to a board. " * 3
CACHE_ON = CacheSettings(True, 1024, 64 << 20, 64 << 20)
CACHE_OFF = CacheSettings(False, 1024, 64 << 20, 64 << 20)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    from tools.tiny_jev_vl_checkpoint import make_tiny_jev_vl

    return str(make_tiny_jev_vl(tmp_path_factory.mktemp("tiny-qwen3_5-vl") / "model", seed=9))


@pytest.fixture(scope="module")
def upstream(checkpoint) -> Upstream:
    return Upstream(checkpoint, {uri: pattern_image(*spec) for uri, spec in IMAGES.items()})


@pytest.fixture(scope="module")
def encoder(checkpoint):
    return Encoder(PreencoderSettings(model_path=checkpoint, device="cpu", dtype="float32", redis_url="none"))


@pytest.fixture
async def asset_dir(tmp_path, encoder):
    folder = tmp_path / "assets"
    summary = await encoder.encode_lines([request_line(uri) for uri in IMAGES], str(folder), None)
    assert summary.done == len(IMAGES), summary.results
    return str(folder)


def _settings(checkpoint, asset_dir, cache=CACHE_ON, **overrides) -> WorkerSettings:
    """The flagship recipe (its family, batching and caches), pointed at the tiny checkpoint in FP32."""
    assert jev_recipe().model.architecture == "Qwen3_5ForConditionalGeneration"
    base = dict(
        recipe=jev_recipe(),
        model_path=checkpoint,
        device="cpu",
        dtype="float32",
        redis_url="redis://127.0.0.1:1/0",
        asset_dir=asset_dir,
        worker_id="test-qwen3_5-vl",
        cache=cache,
    )
    base.update(overrides)
    return WorkerSettings(**base)


def _body(uri: str, question: str = "Which shape is drawn?", text: str = "A drawing: ") -> dict:
    """Upstream's own request: the image inline after the text."""
    return {
        "kind": "choice",
        "state": [text, {"image": uri}],
        "question": question,
        "options": ["a square", "a circle", "a triangle"],
    }


async def _answer(client, body: dict) -> list[float]:
    response = await client.post("/v1/systemone", json=body)
    assert response.status == 200, await response.text()
    return (await response.json())["probabilities"]


async def test_image_request_equals_end_to_end_forward(checkpoint, asset_dir, encoder, upstream):
    uri = png_uri(SEEDS[0], (56, 56))
    body = _body(uri)
    async with worker_client(_settings(checkpoint, asset_dir, cache=CACHE_OFF)) as (client, service):
        assert type(service.model.loaded.model).__name__ == "Qwen3_5ForConditionalGeneration"
        assert service.identity == encoder.identity  # the preencoder and the worker agree
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        assert response.headers["x-jev-cache"] == "l1=off,l2=off,l3=off"
        answer = (await response.json())["probabilities"]
        assert_close([answer], [upstream.decide(body)[1]])
        # the image matters: another image (same grid, same prompt ids) gives another answer
        other = _body(png_uri(SEEDS[1], (56, 56)))
        other_answer = await _answer(client, other)
        assert_close([other_answer], [upstream.decide(other)[1]])
        assert max(abs(a - b) for a, b in zip(other_answer, answer)) > 1e-4
        wide = _body(png_uri(*WIDE))
        assert_close([await _answer(client, wide)], [upstream.decide(wide)[1]])


async def test_l3_snapshot_hit_equals_uncached(checkpoint, asset_dir, upstream):
    # a prefix longer than the pure-torch gated-delta rule's 64-token chunk
    uri = png_uri(SEEDS[0], (56, 56))
    first_q = _body(uri, text=LONG_STATE)
    second_q = _body(uri, text=LONG_STATE, question="What colour dominates?")
    async with worker_client(_settings(checkpoint, asset_dir, cache=CACHE_OFF)) as (client, _):
        uncached = [await _answer(client, b) for b in (first_q, second_q)]
    async with worker_client(_settings(checkpoint, asset_dir)) as (client, service):
        first = await client.post("/v1/systemone", json=first_q)
        assert first.status == 200, await first.text()
        assert first.headers["x-jev-cache"] == "l1=miss,l2=miss,l3=miss"
        engine = service.model.engine
        assert engine.forwards.prefix_mode == "snapshot" and engine.kv_branching is True
        second = await client.post("/v1/systemone", json=second_q)  # same image and state, new question
        assert second.headers["x-jev-cache"] == "l1=miss,l2=hit,l3=hit"
        hit = await second.json()
        assert hit["usage"]["cached_tokens"] > 0
        assert_close([(await first.json())["probabilities"]], [uncached[0]])
        assert_close([hit["probabilities"]], [uncached[1]])
        assert_close([hit["probabilities"]], [upstream.decide(second_q)[1]])
        # every L3 entry is a whole-cache snapshot: linear-attention (conv + recurrent) layers beside KV layers
        states = [service.caches.l3.get(key) for key in service.caches.l3.keys()]
        assert states and all(s.snapshot is not None and not s.kv for s in states)
        layer_kinds = [type(layer).__name__ for layer in states[0].snapshot.layers]
        assert len(layer_kinds) == 4 and len(set(layer_kinds)) == 2, layer_kinds


async def test_rows_of_one_kind_branch_from_one_snapshot(checkpoint, asset_dir, upstream):
    """Three choice questions about one image state: one prefix (`[kind] choice` + the state with its image),
    three rows after copies of its snapshot in one forward."""
    uri = png_uri(SEEDS[1], (56, 56))
    asset = {"type": "image", "format": "png", "data_base64": uri.split(",", 1)[1]}
    questions = {
        q: {"type": "choice", "instructions": q, "criteria": {"yes": None, "no": None, "unsure": None}}
        for q in ("Is it striped?", "Is it dark?", "Is it a photo?")
    }
    body = {
        "model": "jev-latest",
        "state": ["A drawing: ", "<image:a>"],
        "questions": questions,
        "assets": {"<image:a>": asset},
    }
    async with worker_client(_settings(checkpoint, asset_dir)) as (client, service):
        engine = service.model.engine
        forwards = record_forwards(engine)
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        assert engine.forwards.prefix_mode == "snapshot" and engine.kv_branching is True
        answers = (await response.json())["answers"]
    for qid, question in questions.items():
        want = upstream.decide(as_decide(question, ["A drawing: ", {"image": uri}]))[1]
        assert_close([list(answers[qid]["probabilities"].values())], [want])
    cache_kw = engine.forwards.cache_kwarg
    branched = [
        kw
        for kw in forwards
        if kw.get("input_ids") is not None
        and kw.get(cache_kw) is not None
        and kw["input_ids"].shape[0] == len(questions)
    ]
    assert branched, [(tuple(kw.get("input_ids", kw.get("inputs_embeds")).shape)) for kw in forwards]
