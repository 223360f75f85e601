"""jev_common/gc_pauses.py: the collector's pauses counted in every service's exposition, a start-up heap frozen out
of its walks, and a real worker process frozen once its model is loaded."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from jev_common.gc_pauses import freeze_heap
from jev_common.metrics import HttpMetrics
from tests.fakes.net import free_port

from .test_faults import start_real_worker, stop_process


def samples(text: str, name: str) -> dict[str, float]:
    """`name`'s samples by their generation label ('' where it has none)."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    return {s.labels.get("generation", ""): s.value for s in families[name].samples}


def test_every_full_collection_is_counted_with_its_pause():
    metrics = HttpMetrics("svc")
    before = samples(metrics.exposition().decode(), "jev_svc_gc_pause_seconds")
    gc.collect()
    after = samples(metrics.exposition().decode(), "jev_svc_gc_pause_seconds")
    assert set(after) == {"0", "1", "2"}
    assert after["2"] > before["2"]
    assert samples(metrics.exposition().decode(), "jev_svc_gc_pause_max_seconds")["2"] > 0


def test_a_frozen_heap_is_left_out_of_the_collectors_walks():
    loaded = [[i] for i in range(20_000)]  # what a model's load leaves: many tracked objects
    try:
        frozen = freeze_heap()
        assert frozen >= 20_000 and gc.get_freeze_count() == frozen
        walked = {id(o) for o in gc.get_objects()}
        assert not any(id(o) in walked for o in loaded[:100])  # a full collection no longer visits them
        metrics = HttpMetrics("svc")
        before = gc.get_freeze_count()  # frozen objects other code lets go of leave the count, so read it around
        text = metrics.exposition().decode()
        after = gc.get_freeze_count()
        assert after <= samples(text, "jev_svc_gc_frozen_objects")[""] <= before <= frozen
    finally:
        gc.unfreeze()  # this test process is not a service: give the collector its objects back


async def test_a_worker_process_freezes_its_loaded_model(tiny_text_dir, tmp_path):
    port = free_port()
    log = tmp_path / "worker.log"
    worker = await start_real_worker(port, tiny_text_dir, log)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as client:
            for _ in range(1200):
                assert worker.returncode is None, log.read_text()[-2000:]
                with contextlib.suppress(aiohttp.ClientError):
                    if (await client.get("/health")).status == 200:
                        break
                await asyncio.sleep(0.1)
            text = await (await client.get("/metrics")).text()
        frozen = sorted(samples(text, "jev_worker_gc_frozen_objects").values())[0]
        assert frozen > 100_000, frozen  # torch, transformers and the model's modules: out of every walk
        assert "froze" in log.read_text()
    finally:
        await stop_process(worker)
