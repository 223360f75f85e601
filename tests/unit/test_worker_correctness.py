"""The served path equals a plain transformers forward; caching and batching change nothing."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from jev_worker.request.legacy import prepare_legacy
from jev_worker.settings import CacheSettings

from .worker_helpers import (
    REQUESTS,
    assert_close,
    post_as_one_batch,
    prefixes_in_one_forward,
    record_forwards,
    reference_row_probs,
    served_row_probs,
    worker_client,
)

CACHE_OFF = CacheSettings(False, 1024, 64 << 20, 64 << 20)
PILOT = {
    "kind": "choice",
    "state": {"text": "A pilot request about another state."},
    "question": "q?",
    "options": ["a", "b"],
}


@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_served_probabilities_equal_plain_forward(worker_settings, kind):
    body = REQUESTS[kind]
    async with worker_client(worker_settings()) as (client, service):
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        answer = await response.json()
        assert_close(served_row_probs(body, answer), reference_row_probs(service, body))


async def test_tied_embeddings_model(worker_settings, tiny_tied_dir):
    body = REQUESTS["choice"]
    async with worker_client(worker_settings(model_path=tiny_tied_dir)) as (client, service):
        assert service.model.loaded.model.config.tie_word_embeddings
        answer = await (await client.post("/v1/systemone", json=body)).json()
        assert_close(served_row_probs(body, answer), reference_row_probs(service, body))


async def test_decision_head_rows_are_fp32_copies_under_bf16(worker_settings):
    async with worker_client(worker_settings(dtype="bfloat16")) as (client, service):
        assert service.model.loaded.model.dtype == torch.bfloat16
        weight, _ = service.model.engine.head.rows(tuple(service.model.builder.letter_ids[:2]))
        assert weight.dtype == torch.float32
        expected = (
            service.model.loaded.model.get_output_embeddings().weight[service.model.builder.letter_ids[:2]].float()
        )
        assert torch.equal(weight, expected)
        response = await client.post("/v1/systemone", json=REQUESTS["choice"])
        assert response.status == 200
        assert abs(sum((await response.json())["probabilities"]) - 1) < 1e-5


@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_l3_cached_equals_uncached(worker_settings, kind):
    body = REQUESTS[kind]
    async with worker_client(worker_settings(cache=CACHE_OFF)) as (client, _):
        uncached = await (await client.post("/v1/systemone", json=body)).json()
        assert uncached["usage"]["cached_tokens"] == 0
    async with worker_client(worker_settings()) as (client, _):
        first = await client.post("/v1/systemone", json=body)
        assert "l3=miss" in first.headers["x-jev-cache"]
        other_question = dict(body, question=body["question"] + " Think.")
        second = await client.post("/v1/systemone", json=other_question)
        assert "l3=hit" in second.headers["x-jev-cache"]
        third = await client.post("/v1/systemone", json=body)
        assert third.headers["x-jev-cache"] == "l1=hit,l3=hit"
        cached = await third.json()
    assert cached["usage"]["cached_tokens"] > 0
    assert cached["usage"]["prompt_tokens"] == uncached["usage"]["prompt_tokens"]
    assert_close(served_row_probs(body, cached), served_row_probs(body, uncached))


@pytest.mark.parametrize("l3", [True, False])
async def test_batched_equals_one_by_one(worker_settings, l3):
    cache = CacheSettings(True, 1024, 64 << 20, 64 << 20 if l3 else 0)
    questions = [f"Question number {i}: is the kettle hot?" for i in range(6)]
    bodies = [dict(copy.deepcopy(REQUESTS["choice"]), question=q) for q in questions] + [REQUESTS["set"]]
    async with worker_client(worker_settings(batching=False, cache=cache)) as (client, _):
        single = [await (await client.post("/v1/systemone", json=b)).json() for b in bodies]
    async with worker_client(worker_settings(batching=True, cache=cache, max_wait_ms=250.0)) as (client, service):
        sizes = []
        original = service.model.engine.run
        service.model.engine.run = lambda items, groups: sizes.append(len(items)) or original(items, groups)
        responses = await asyncio.gather(*(client.post("/v1/systemone", json=b) for b in bodies))
        batched = [await r.json() for r in responses]
    assert max(sizes) > 1, f"concurrent same-prefix requests were not batched: {sizes}"
    for body, a, b in zip(bodies, single, batched):
        assert_close(served_row_probs(body, a), served_row_probs(body, b))
        assert a["choice_index"] == b["choice_index"]


async def test_set_rows_branch_from_one_prefix(worker_settings):
    """Within one question the prefix is computed once and its KV branched per option."""
    body = REQUESTS["set"]
    async with worker_client(worker_settings(cache=CACHE_OFF, batching=True)) as (client, service):
        calls = []
        original = service.model.engine.compute_prefix
        service.model.engine.compute_prefix = lambda item: calls.append(item) or original(item)
        answer = await (await client.post("/v1/systemone", json=body)).json()
        assert len(calls) == 1
        assert_close(served_row_probs(body, answer), reference_row_probs(service, body))


async def test_prompt_carries_state_question_and_options(worker_settings):
    from jev_common.schema import DecisionRequest

    async with worker_client(worker_settings()) as (_, service):
        prepared = prepare_legacy(service.model.builder, DecisionRequest.model_validate(REQUESTS["choice"]))
        tokenizer = service.model.loaded.tokenizer
        prefix = tokenizer.decode(prepared.prefix_ids)
        row = tokenizer.decode(prepared.rows[0])
        assert REQUESTS["choice"]["state"]["text"] in prefix and "Is the water boiling?" not in prefix
        assert "Is the water boiling?" in row and "A. yes" in row and "C. cannot tell" in row
        assert row.rstrip().endswith("assistant")


async def test_exported_bf16_checkpoint_uses_the_unrounded_fp32_head_rows(worker_settings, tiny_text_dir, tmp_path):
    """A BF16 export keeps the label rows from the FP32 head in decision_head.safetensors; the worker
    scores with those, not with the rounded BF16 LM head."""
    from transformers import AutoModelForCausalLM

    from tools.export_checkpoint import export_checkpoint

    async with worker_client(worker_settings()) as (_, service):
        label_ids = list(service.model.builder.letter_ids[:4]) + list(service.model.builder.yes_no_ids)
    exported = tmp_path / "exported"
    export_checkpoint(tiny_text_dir, exported, dtype="bfloat16", label_ids=label_ids, log=lambda *_: None)
    fp32_rows = AutoModelForCausalLM.from_pretrained(tiny_text_dir).lm_head.weight[label_ids].float()
    async with worker_client(worker_settings(model_path=str(exported), dtype="bfloat16")) as (client, service):
        rows, _ = service.model.engine.head.rows(tuple(label_ids))
        rounded = service.model.loaded.model.get_output_embeddings().weight[label_ids].float()
        assert torch.equal(rows, fp32_rows)
        assert not torch.equal(rounded, fp32_rows)  # the backbone's own rows were rounded
        assert (await client.post("/v1/systemone", json=REQUESTS["choice"])).status == 200


@pytest.mark.parametrize("l3", [True, False])
async def test_concurrent_requests_with_different_prefixes_share_forwards(worker_settings, l3):
    """Single-row requests about different states run whole in one forward (packed end to end, or
    right-padded), and a miss still fills L3 from that same forward (cut per sequence), so the next
    ask is a hit with equal answers."""
    cache = CacheSettings(True, 1024, 64 << 20, 64 << 20 if l3 else 0)
    bodies = [
        dict(copy.deepcopy(REQUESTS["choice"]), state={"text": f"State {i}: " + "the kettle is hot. " * i})
        for i in range(1, 6)
    ]
    async with worker_client(worker_settings(batching=False, cache=CACHE_OFF)) as (client, _):
        single = [await (await client.post("/v1/systemone", json=b)).json() for b in bodies]
    async with worker_client(worker_settings(batching=True, cache=cache, max_wait_ms=250.0)) as (client, service):
        forwards = record_forwards(service.model.engine)
        responses = await post_as_one_batch(client, service, bodies, PILOT)
        batched = [await r.json() for r in responses]
        assert prefixes_in_one_forward(forwards) > 1, "different-prefix requests were not batched into one forward"
        assert (
            service.model.engine.forwards.packing
            and any(  # whole sequences packed: a block-diagonal mask, no padding
                kw.get("attention_mask") is not None
                and kw["attention_mask"].dim() == 4
                and kw["attention_mask"].shape[-1] == kw["input_ids"].shape[1]
                for kw in forwards
            )
        )
        again = [await (await client.post("/v1/systemone", json=b)).json() for b in bodies]
    for body, a, b, c in zip(bodies, single, batched, again):
        assert_close(served_row_probs(body, a), served_row_probs(body, b))
        assert_close(served_row_probs(body, a), served_row_probs(body, c))
        assert (c["usage"]["cached_tokens"] > 0) == l3


async def test_cached_prefixes_of_different_lengths_share_one_masked_forward(worker_settings):
    """Concurrent hits on different cached states run in one forward (packed: each row attends to its
    own state's KV; or padded and masked); answers equal the one-by-one ones."""
    bodies = [
        dict(copy.deepcopy(REQUESTS[kind]), state={"text": f"State {i}: " + "the kettle is hot. " * (i + 1)})
        for i, kind in enumerate(["choice", "set", "noul", "choice", "score"])
    ]
    bodies[4]["options"] = ["1", "2", "3"]
    async with worker_client(worker_settings(batching=False, cache=CACHE_OFF)) as (client, _):
        single = [await (await client.post("/v1/systemone", json=b)).json() for b in bodies]
    async with worker_client(worker_settings(batching=True, max_wait_ms=250.0)) as (client, service):
        for body in bodies:  # warm L3 for every state
            await client.post("/v1/systemone", json=dict(body, question=body["question"] + " (warm-up)"))
        forwards = record_forwards(service.model.engine)
        responses = await post_as_one_batch(client, service, bodies, PILOT)
        batched = [await r.json() for r in responses]
    assert all("l3=hit" in r.headers["x-jev-cache"] for r in responses)
    assert prefixes_in_one_forward(forwards) > 2
    for body, a, b in zip(bodies, single, batched):
        assert_close(served_row_probs(body, a), served_row_probs(body, b))


@pytest.fixture(scope="module")
def tiny_hybrid_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_hybrid

    return str(make_tiny_hybrid(tmp_path_factory.mktemp("tiny-hybrid")))


@pytest.mark.parametrize("kind", ["choice", "set", "noul"])
async def test_hybrid_conv_attention_model_caches_prefix_snapshots(worker_settings, tiny_hybrid_dir, kind):
    """LFM2-style hybrid layers keep recurrent conv state beside the KV: the prefix state is a cache
    snapshot, copied per branch, and cached answers equal uncached ones and the plain forward."""
    body = REQUESTS[kind]
    async with worker_client(worker_settings(model_path=tiny_hybrid_dir, cache=CACHE_OFF)) as (client, service):
        uncached = await (await client.post("/v1/systemone", json=body)).json()
        assert_close(served_row_probs(body, uncached), reference_row_probs(service, body))
    async with worker_client(worker_settings(model_path=tiny_hybrid_dir)) as (client, service):
        assert service.model.engine.forwards.prefix_mode == "snapshot"  # learnt from the warmup's forward
        first = await client.post("/v1/systemone", json=body)
        assert service.model.engine.kv_branching is True  # the once-per-model snapshot check passed
        second = await client.post("/v1/systemone", json=dict(body, question=body["question"] + " Again."))
        third = await client.post("/v1/systemone", json=body)
        assert "l3=miss" in first.headers["x-jev-cache"] and "l3=hit" in second.headers["x-jev-cache"]
        cached = await third.json()
        assert cached["usage"]["cached_tokens"] > 0
        assert_close(served_row_probs(body, cached), served_row_probs(body, uncached))
        assert service.cache_stats().levels["l3"].resident_bytes > 0


async def test_snapshot_branching_that_disagrees_with_a_whole_forward_is_turned_off(worker_settings, tiny_hybrid_dir):
    from jev_common.schema import DecisionRequest
    from jev_worker.scheduling.batch import EngineItem

    async with worker_client(worker_settings(model_path=tiny_hybrid_dir)) as (client, service):
        engine = service.model.engine
        engine.kv_branching = None
        engine.forwards.branch_snapshot = lambda state, batch: engine.forwards.new_cache()  # forgets the prefix
        item = EngineItem(
            prepared=prepare_legacy(service.model.builder, DecisionRequest.model_validate(REQUESTS["set"]))
        )
        assert engine.compute_prefix(item) is None and engine.kv_branching is False
        response = await client.post("/v1/systemone", json=REQUESTS["set"])
        assert response.status == 200 and "l3=off" in response.headers["x-jev-cache"]
        assert_close(
            served_row_probs(REQUESTS["set"], await response.json()), reference_row_probs(service, REQUESTS["set"])
        )


async def test_rows_after_one_prefix_run_packed_without_padding(worker_settings):
    """A request's rows run end to end in one sequence (no padding), each seeing only the prefix and
    itself; the answers equal the padded batch's, which the engine checked once at the start."""
    body = {
        "model": "jev-latest",
        "state": "The kettle on the stove is whistling.",
        "questions": {
            "n": {"type": "noul", "instructions": "Is the water boiling?"},
            "c": {"type": "choice", "criteria": {"a kettle": None, "a pan": "flat, no spout", "a pot": None}},
            "s": {"type": "score", "criteria": ["cold", "warm", "hot", "boiling"]},
        },
    }
    async with worker_client(worker_settings()) as (client, service):
        assert (
            service.model.engine.forwards.packing and "rows" in service.model.engine.forwards.packing_verified
        )  # the warmup checked it
        forwards = record_forwards(service.model.engine)
        packed = await (await client.post("/v1/systemone", json=body)).json()
        rows = [kw for kw in forwards if kw.get("attention_mask") is not None and kw["attention_mask"].dim() == 4]
        assert rows and rows[-1]["input_ids"].shape[0] == 1
        from jev_common.schema import SystemOneRequest
        from jev_worker.questions.plan import question_rows

        request = SystemOneRequest.model_validate(body)
        specs, _ = question_rows(request, service.model.builder)
        prepared = service.model.builder.prepare(request.state, specs)
        assert rows[-1]["input_ids"].shape[1] == sum(len(r) for r in prepared.rows)  # real tokens only
        service.model.engine.forwards.packing = False
        other = dict(body, state=body["state"] + " ")  # a new prefix, so the padded path computes it all
        padded = await (await client.post("/v1/systemone", json=other)).json()
        again_packed_off = await (await client.post("/v1/systemone", json=body)).json()
    for qid in body["questions"]:
        a, b = packed["answers"][qid], again_packed_off["answers"][qid]
        va = [a["noul"]] if "noul" in a else list(a["probabilities"].values())
        vb = [b["noul"]] if "noul" in b else list(b["probabilities"].values())
        assert max(abs(x - y) for x, y in zip(va, vb)) < 1e-5
    assert padded["answers"].keys() == packed["answers"].keys()
