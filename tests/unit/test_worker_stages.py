"""Per-stage host time (jev_worker_stage_seconds{stage}): every decision's time is split into back-to-back stages,
from its body's parsing to its response, and each stage is observed."""

from __future__ import annotations

from jev_common.timeline import Timeline

from .test_scheduler import ask
from .worker_helpers import sample_value, worker_client

STAGES = ["parse", "prepare", "queue", "device", "readout", "respond"]


async def test_a_decisions_stages_are_back_to_back_and_observed(worker_settings, monkeypatch):
    async with worker_client(worker_settings()) as (client, service):
        seen: list[Timeline] = []
        observe = service.metrics.observe_stages
        monkeypatch.setattr(service.metrics, "observe_stages", lambda t: seen.append(t) or observe(t))
        response = await client.post("/v1/systemone", json=ask(7))
        assert response.status == 200
        timeline = seen[-1]
        assert [s.name for s in timeline.stages] == STAGES
        for before, after in zip(timeline.stages, timeline.stages[1:]):
            assert after.start == before.end, (before, after)  # nothing falls between two stages
        metrics = await (await client.get("/metrics")).text()
        for stage in STAGES:
            assert sample_value(metrics, "jev_worker_stage_seconds_count", stage=stage) == 1


async def test_on_a_simulated_device_the_batch_and_device_stages_split_the_run(worker_settings, monkeypatch):
    async with worker_client(worker_settings(device="simulated", benchmark=True)) as (client, service):
        seen: list[Timeline] = []
        monkeypatch.setattr(service.metrics, "observe_stages", seen.append)
        response = await client.post("/v1/systemone", json=ask(8))
        names = [s.name for s in seen[-1].stages]
        assert names == ["parse", "prepare", "queue", "batch", "device", "readout", "respond"]
        device = next(s for s in seen[-1].stages if s.name == "device")
        assert abs(device.seconds - float(response.headers["x-jev-device-seconds"])) < 1e-6


async def test_a_refused_request_still_observes_what_it_spent(worker_settings, monkeypatch):
    async with worker_client(worker_settings()) as (client, service):
        seen: list[Timeline] = []
        monkeypatch.setattr(service.metrics, "observe_stages", seen.append)
        response = await client.post("/v1/systemone", json={"model": "jev-latest", "state": "x", "questions": {}})
        assert response.status == 422
        assert seen and [s.name for s in seen[-1].stages] == []  # refused while parsing: nothing marked yet
