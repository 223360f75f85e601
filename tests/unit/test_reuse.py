"""reuse.py: an L3 hit is used only where the measured cost of continuing the cached state is no higher
than recomputing the prefix; the engine honours the decision and says so (header, /health, metrics)."""

from __future__ import annotations

import re

import pytest

from jev_worker.scheduling.reuse import LinearCost, ReuseCosts, ReusePolicy, reuse_pays
from jev_worker.settings import reuse_mode

from .worker_helpers import REQUESTS, assert_close, reference_row_probs, served_row_probs, worker_client

# a GPU-like device: assembling a cached state has a fixed cost a short prefix's recompute does not repay
GPU_LIKE = ReuseCosts(recompute=LinearCost(0.005, 10e-6), reuse=LinearCost(0.008, 1e-6))
NEVER = ReuseCosts(recompute=LinearCost(0.001, 0.0), reuse=LinearCost(0.002, 1e-6))


def test_reuse_pays_where_it_costs_no_more_than_recomputing():
    assert reuse_pays(100, None)  # nothing measured: every hit is used
    assert not reuse_pays(100, GPU_LIKE)  # 8.1 ms vs 6.0 ms
    assert reuse_pays(1000, GPU_LIKE)  # 9.0 ms vs 15.0 ms
    assert reuse_pays(334, GPU_LIKE) and not reuse_pays(333, GPU_LIKE)  # break-even at 333.3 tokens


def test_costs_fit_through_two_measurements():
    cost = LinearCost.through((32, 0.010), (512, 0.034))
    assert cost.at(32) == pytest.approx(0.010) and cost.at(512) == pytest.approx(0.034)
    assert cost.per_token_s == pytest.approx(5e-5)


def test_policy_modes():
    assert ReusePolicy("auto").resolved("cuda").mode == "measured"
    assert ReusePolicy("auto").resolved("cpu").mode == "always"
    always = ReusePolicy("always", GPU_LIKE)
    assert always.use_cached(10) and always.decisions == {"reuse": 1, "recompute": 0}
    measured = ReusePolicy("measured", GPU_LIKE)
    assert not measured.use_cached(10) and measured.use_cached(5000)
    assert measured.decisions == {"reuse": 1, "recompute": 1}
    assert measured.describe()["reuse_pays"] == "from 333 prefix tokens"
    assert ReusePolicy("measured", NEVER).describe()["reuse_pays"] == "never"
    assert ReusePolicy("measured").use_cached(10)  # measured mode before a measurement: use every hit
    assert reuse_mode("Measured") == "measured"
    with pytest.raises(ValueError):
        ReusePolicy("sometimes")


@pytest.mark.parametrize("kind", ["choice", "set"])
async def test_engine_recomputes_a_cached_prefix_when_reuse_does_not_pay(worker_settings, kind):
    body = REQUESTS[kind]
    async with worker_client(worker_settings(l3_reuse="measured")) as (client, service):
        policy = service.model.scheduler.prefix_cache.reuse
        assert policy.costs is not None  # measured at start-up (calibrate), on this CPU
        policy.costs = NEVER
        first = await client.post("/v1/systemone", json=body)
        assert "l3=miss" in first.headers["x-jev-cache"]
        second = await client.post("/v1/systemone", json=body)
        assert second.headers["x-jev-cache"] == "l1=hit,l3=bypass"
        answer = await second.json()
        assert answer["usage"]["cached_tokens"] == 0
        assert_close(served_row_probs(body, answer), reference_row_probs(service, body))
        policy.costs = ReuseCosts(recompute=NEVER.reuse, reuse=NEVER.recompute)  # reuse always cheaper
        third = await client.post("/v1/systemone", json=body)
        assert third.headers["x-jev-cache"] == "l1=hit,l3=hit"
        assert_close(served_row_probs(body, await third.json()), reference_row_probs(service, body))
        assert policy.decisions["recompute"] >= 1 and policy.decisions["reuse"] >= 1
        health = await (await client.get("/health")).json()
        assert health["detail"]["l3_reuse"]["mode"] == "measured"
        assert set(health["detail"]["l3_reuse"]["costs"]) == {"recompute", "reuse"}
        metrics = await (await client.get("/metrics")).text()
        assert re.search(r'^jev_worker_l3_reuse_decisions_total\{decision="recompute"[,}]', metrics, re.M)
