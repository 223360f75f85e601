"""graphs.py: bucket choice, and the static-buffer path (run eagerly, without capture, on CPU) computing
what the plain eager engine computes (FP32, 1e-5) on the tiny checkpoints."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from jev_worker.engine.graphs import (
    LENGTH_BUCKETS,
    Bucket,
    CudaGraphCapture,
    Fallback,
    NoCapture,
    capture_for,
    choose_bucket,
    row_buckets,
)
from jev_worker.settings import CacheSettings, graph_mode

from .worker_helpers import (
    REQUESTS,
    assert_close,
    reference_row_probs,
    sample_value,
    served_row_probs,
    worker_client,
)


# ----- bucket choice (pure) ---------------------------------------------------------------------------
def test_rows_and_lengths_round_up_to_the_smallest_bucket():
    assert row_buckets(32) == (1, 2, 4, 8, 16, 32)
    assert row_buckets(12) == (1, 2, 4, 8, 12)
    assert choose_bucket(1, 89, max_rows=32) == Bucket(1, 96)
    assert choose_bucket(3, 16, max_rows=32) == Bucket(4, 16)
    assert choose_bucket(8, 459, max_rows=32) == Bucket(8, 512)
    assert choose_bucket(5, 20, 60, True, max_rows=32, kv_capacity=64) == Bucket(8, 32, 64, True)


def test_what_fits_no_bucket_says_why():
    assert choose_bucket(33, 10, max_rows=32) == Fallback("rows")
    assert choose_bucket(1, LENGTH_BUCKETS[-1] + 1, max_rows=32) == Fallback("length")
    assert choose_bucket(1, 10, LENGTH_BUCKETS[-1] + 1, True, max_rows=32, kv_capacity=1 << 30) == Fallback(
        "prefix_length"
    )
    # the static KV pool holds one row of a shared state, but not four rows of separate states
    assert choose_bucket(4, 10, 100, True, max_rows=32, kv_capacity=128) == Bucket(4, 16, 128, True)
    assert choose_bucket(4, 10, 100, False, max_rows=32, kv_capacity=128) == Fallback("kv_budget")
    assert choose_bucket(32, 4096, 4096, True, max_rows=32, kv_capacity=1 << 30) == Fallback("mask_size")


def test_cuda_graphs_setting():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert capture_for("auto", cpu) is None  # the default CPU path stays the plain eager engine
    assert capture_for("off", cuda) is None
    assert isinstance(capture_for("on", cpu), NoCapture)
    assert graph_mode(" ON ") == "on"
    with pytest.raises(ValueError):
        graph_mode("yes")
    if torch.cuda.is_available():
        assert isinstance(capture_for("auto", cuda), CudaGraphCapture)


# ----- the static-buffer path equals the eager engine -------------------------------------------------
def _tokens(n: int, start: int) -> tuple[int, ...]:
    return tuple(100 + (start + 7 * i) % 900 for i in range(n))


def _both(engine, call):
    """call() through the graph path, then with the graph path off (the plain eager engine)."""
    graphed = call()
    runner, engine.graphs = engine.graphs, None
    try:
        return graphed, call()
    finally:
        engine.graphs = runner


async def test_hidden_states_equal_the_eager_engine(worker_settings):
    async with worker_client(worker_settings(cuda_graphs="on")) as (_, service):
        engine = service.model.engine
        runner = engine.graphs
        assert runner is not None and runner.capture.name == "eager"
        with torch.inference_mode():
            # whole sequences of different lengths, keeping each prefix's KV
            sequences = [
                (_tokens(30, 0), _tokens(9, 1)),
                (_tokens(50, 2), _tokens(4, 3)),
                (_tokens(7, 4), _tokens(12, 5)),
            ]
            (h_graph, s_graph), (h_eager, s_eager) = _both(engine, lambda: engine.forwards.whole(sequences, True))
            torch.testing.assert_close(h_graph, h_eager, rtol=0, atol=1e-5)
            for a, b in zip(s_graph, s_eager):
                assert a.length == b.length
                for (ka, va), (kb, vb) in zip(a.kv, b.kv):
                    torch.testing.assert_close(ka, kb, rtol=0, atol=1e-5)
                    torch.testing.assert_close(va, vb, rtol=0, atol=1e-5)
            long, short = s_eager[1], s_eager[2]
            # rows after one shared state (its KV held once), then rows after states of different lengths:
            # the long state runs first so the pool holds its KV where the short state's padding is masked
            shared = [(long, _tokens(5, 9)), (long, _tokens(11, 10)), (long, _tokens(3, 11))]
            mixed = [(short, _tokens(6, 12)), (long, _tokens(2, 13)), (short, _tokens(9, 14))]
            for pairs in (shared, mixed, [(short, _tokens(1, 15))]):
                graphed, eager = _both(engine, lambda pairs=pairs: engine.forwards.after(pairs))
                torch.testing.assert_close(graphed, eager, rtol=0, atol=1e-5)
        buckets = {program.bucket for program in runner.programs.values()}
        assert Bucket(4, 16, 64, True) in buckets and Bucket(4, 16, 64, False) in buckets
        assert runner.replays >= 5 and not runner.fallbacks


@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_served_answers_equal_a_one_pass_forward_through_the_static_path(worker_settings, kind):
    body = REQUESTS[kind]
    async with worker_client(worker_settings(cuda_graphs="on")) as (client, service):
        first = await (await client.post("/v1/systemone", json=body)).json()
        again = await client.post("/v1/systemone", json=dict(body, question=body["question"] + " Think."))
        assert "l3=hit" in again.headers["x-jev-cache"]
        cached = await (await client.post("/v1/systemone", json=body)).json()
        reference = reference_row_probs(service, body)
        assert_close(served_row_probs(body, first), reference)
        assert_close(served_row_probs(body, cached), reference)
        assert service.model.engine.graphs.replays >= 3 and not service.model.engine.graphs.fallbacks


async def test_concurrent_requests_run_in_one_replay(worker_settings):
    questions = [f"Question number {i}: is the kettle hot?" for i in range(6)]
    bodies = [dict(copy.deepcopy(REQUESTS["choice"]), question=q) for q in questions]
    async with worker_client(worker_settings(batching=False)) as (client, _):
        single = [await (await client.post("/v1/systemone", json=b)).json() for b in bodies]
    async with worker_client(worker_settings(batching=True, max_wait_ms=250.0, cuda_graphs="on")) as (client, service):
        runner = service.model.engine.graphs
        rows_per_replay = []
        original = runner._replay
        runner._replay = lambda program: rows_per_replay.append(program.bucket.rows) or original(program)
        responses = await asyncio.gather(*(client.post("/v1/systemone", json=b) for b in bodies))
        batched = [await r.json() for r in responses]
    assert max(rows_per_replay) >= 4, f"concurrent requests' rows did not share a replay: {rows_per_replay}"
    for body, a, b in zip(bodies, single, batched):
        assert_close(served_row_probs(body, a), served_row_probs(body, b))


async def test_what_fits_no_bucket_runs_eagerly_and_is_counted(worker_settings):
    """An L3 budget too small for the static KV pool to hold the prefix: the hit runs eagerly, exactly."""
    body = REQUESTS["set"]
    cache = CacheSettings(True, 1024, 64 << 20, 64 << 20)
    async with worker_client(worker_settings(cuda_graphs="on", cache=cache)) as (client, service):
        runner = service.model.engine.graphs
        runner.kv_budget_bytes, runner.pool = 1024, None  # the pool made anew holds ~2 tokens
        answer = await (await client.post("/v1/systemone", json=body)).json()
        assert_close(served_row_probs(body, answer), reference_row_probs(service, body))
        assert service.model.engine.graphs.fallbacks.get("kv_budget", 0) >= 1
        metrics = await (await client.get("/metrics")).text()
        assert sample_value(metrics, "jev_worker_graph_fallbacks_total", reason="kv_budget")
        assert "jev_worker_graph_replays_total" in metrics


async def test_cpu_default_keeps_the_plain_eager_engine(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        assert service.model.engine.graphs is None
        health = await (await client.get("/health")).json()
        assert "graphs" not in health["detail"] and health["detail"]["l3_reuse"]["mode"] == "always"


async def test_cache_snapshot_models_fall_back_visibly(worker_settings, tmp_path):
    from tools.tiny_checkpoints import make_tiny_hybrid

    folder = str(make_tiny_hybrid(tmp_path / "hybrid"))
    body = REQUESTS["set"]
    async with worker_client(worker_settings(model_path=folder, cuda_graphs="on")) as (client, service):
        for _ in range(2):
            answer = await (await client.post("/v1/systemone", json=body)).json()
            assert_close(served_row_probs(body, answer), reference_row_probs(service, body))
        assert service.model.engine.forwards.prefix_mode == "snapshot"
        assert service.model.engine.graphs.fallbacks.get("snapshot_cache", 0) >= 1
