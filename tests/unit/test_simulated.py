"""The simulated device (jev_worker/engine/simulated.py): its cost model against the H200 figures it was fitted to,
prefix states of the simulated model's size, the waits it reports, and a worker serving on it only in benchmark
mode, saying so in /health and /metrics."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from jev_worker.engine.simulated import SHAPES, SimulatedForwards
from jev_worker.scheduling.prefix_cache import PrefixState
from jev_worker.settings import simulated_shapes

from .worker_helpers import sample_value, worker_client


class Device:
    """A clock that stands still unless slept on, and the sleeps asked of it."""

    def __init__(self):
        self.now = 100.0
        self.asked: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        self.now += seconds

    def clock(self) -> float:
        return self.now


def forwards(shapes: str = "1.5b", pack_tokens: int = 0):
    model = torch.nn.Module()
    embed = torch.nn.Embedding(100, 8)
    model.get_input_embeddings = lambda: embed
    device = Device()
    return SimulatedForwards(model, SHAPES[shapes], pack_tokens, sleep=device.sleep, clock=device.clock), device


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_cost_model_reproduces_every_measured_point_within_15_percent(name):
    errors = SHAPES[name].errors()
    assert len(errors) >= 3 and all(abs(e) <= 0.15 for e in errors.values()), errors


def test_the_shapes_are_the_ones_settings_offer():
    assert {simulated_shapes(name) for name in SHAPES} == set(SHAPES)
    with pytest.raises(ValueError):
        simulated_shapes("70b")


def test_prefix_states_weigh_what_the_simulated_models_kv_weighs_and_hold_no_memory():
    assert SHAPES["1.5b"].kv_bytes_per_token == 28_672  # 28 layers x K,V x 2 heads x 128 x BF16: ~28.7 KB
    assert SHAPES["7.35b"].kv_bytes_per_token == 147_456  # 36 layers x K,V x 8 heads x 128 x BF16
    f, _ = forwards("7.35b")
    state = f.prefix_state(tuple(range(2585)), [])
    assert isinstance(state, PrefixState) and state.length == 2585
    assert state.nbytes == 2585 * 147_456  # what L3 counts
    assert state.kv[0][0].untyped_storage().nbytes() <= 16  # a broadcast view: no memory behind it


def test_each_forward_is_priced_as_the_path_the_real_forwards_would_take():
    cost = SHAPES["1.5b"]
    f, _ = forwards()
    f.prefix_state(tuple(range(89)), [])
    assert f.take_device_seconds() == pytest.approx(cost.seconds(89, 89 * 89))
    state = PrefixState(kv=[], length=100)
    rows = [(state, (i,) * 10) for i in range(8)]  # no two rows share a stem (forwards.segments)
    f.packing = False  # right-padded: 8 rows of 10 after 100 cached tokens
    hidden = f.after(rows)
    assert f.take_device_seconds() == pytest.approx(cost.seconds(80, 80 * 110))
    assert hidden.shape == (8, 8)
    f.packing = True  # packed: one forward, each token scored against the state's KV and the pack
    f.after(rows)
    assert f.take_device_seconds() == pytest.approx(cost.seconds(80, 80 * (100 + 80)))
    packed, device = forwards(pack_tokens=40)  # a pack budget splits the rows into forwards of 40 tokens
    packed.after(rows)
    assert packed.take_device_seconds() == pytest.approx(2 * cost.seconds(40, 40 * 140))
    packed.synchronize()
    assert device.asked == pytest.approx([2 * cost.seconds(40, 40 * 140)])  # the two, one after the other
    out, states = f.whole([((1, 2, 3), (4,)), ((5, 6), (7, 8))], capture=True)
    assert out.shape == (2, 8) and [s.length for s in states] == [3, 2]


def test_a_launch_returns_at_once_and_its_event_waits_for_the_device():
    """As a CUDA launch: the forward is queued behind what was launched before it; a batch's event (completion)
    waits until the device reaches it, while the host may launch the next batch meanwhile."""
    cost = SHAPES["1.5b"].seconds(3, 9)
    f, device = forwards()
    f.whole([((1, 2), (3,))], capture=False)
    first = f.completion()
    assert device.asked == []  # nothing waited at launch
    device.now += cost / 2  # the host works on; the device is half way
    f.whole([((1, 2), (3,))], capture=False)  # the next batch, queued behind the first
    second = f.completion()
    first()
    assert device.asked == pytest.approx([cost / 2])  # the first batch's event: the rest of its forward
    second()
    assert device.asked == pytest.approx([cost / 2, cost])  # the second started when the first ended
    device.now += 1.0  # an idle device: the next forward starts when launched
    f.whole([((1, 2), (3,))], capture=False)
    f.completion()()
    assert device.asked[-1] == pytest.approx(cost)
    assert f.take_device_seconds() == pytest.approx(3 * cost) and f.take_device_seconds() == 0.0


def test_the_device_seconds_are_taken_once_per_batch_and_the_real_clock_waits_them():
    f = SimulatedForwards(_model(), SHAPES["1.5b"])  # the real sleep and clock
    started = time.perf_counter()
    f.whole([((1, 2), (3,))], capture=False)
    f.completion()()
    assert time.perf_counter() - started >= SHAPES["1.5b"].seconds(3, 9)
    assert f.take_device_seconds() == pytest.approx(SHAPES["1.5b"].seconds(3, 9)) and f.take_device_seconds() == 0.0


def _model():
    model = torch.nn.Module()
    embed = torch.nn.Embedding(100, 8)
    model.get_input_embeddings = lambda: embed
    return model


def test_a_worker_refuses_the_simulated_device_outside_benchmark_mode(worker_settings):
    with pytest.raises(ValueError, match="JEV_BENCHMARK=1"):
        worker_settings(device="simulated")


async def test_a_worker_serves_on_the_simulated_device_and_says_so(worker_settings):
    from .test_scheduler import ask

    async with worker_client(worker_settings(device="simulated", benchmark=True)) as (client, service):
        response = await client.post("/v1/systemone", json=ask())
        assert response.status == 200
        device_s = float(response.headers["x-jev-device-seconds"])
        assert 0.004 < device_s < 0.5  # at least the cost model's fixed part of one 1.5B forward
        health = await (await client.get("/health")).json()
        assert health["detail"]["device"] == "simulated"
        assert health["detail"]["simulated"]["shapes"] == "1.5b"
        assert health["detail"]["simulated"]["kv_bytes_per_token"] == 28_672
        metrics = await (await client.get("/metrics")).text()
        assert sample_value(metrics, "jev_worker_device_info", device="simulated") == 1.0


async def test_the_device_wait_header_is_for_benchmarks_only(worker_settings):
    from .test_scheduler import ask

    async with worker_client(worker_settings()) as (client, _service):
        response = await client.post("/v1/systemone", json=ask())
        assert response.status == 200 and "x-jev-device-seconds" not in response.headers


def test_settings_are_complete_without_the_simulated_device(worker_settings):
    settings = worker_settings()
    assert settings.device == "cpu" and not settings.benchmark
    assert dataclasses.replace(settings, benchmark=True, device="simulated").device == "simulated"
