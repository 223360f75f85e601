"""The frontend in front of several backends (fake workers on loopback): routing by model, by warm
state (the index's route keys, or this frontend's own affinity), by load; replicas taken out and put
back; discovery through the index; per-backend metrics and health."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from jev_common.index import IndexConnection, namespace
from jev_common.index.owners import Owner
from jev_common.route_key import render_state, state_route_key
from jev_common.schema import ErrorEnvelope
from jev_frontend.app import POOL, create_app
from jev_frontend.pool import BackendState
from jev_frontend.router import Router
from jev_frontend.settings import Settings, parse_backends
from jev_worker.registration import WorkerIndex
from tests.fakes.fake_worker import FakeWorker

from .test_cache_index import needs_redis

CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)
QUESTIONS = {"q": {"type": "noul", "instructions": "Is it on?"}}


def ask(state: str, model: str = "jev-latest") -> dict:
    return {"model": model, "state": state, "questions": QUESTIONS}


@contextlib.asynccontextmanager
async def frontend(backends, **settings):
    settings.setdefault("redis_url", "none")
    settings.setdefault("health_interval_s", 0.2)
    app = create_app(Settings(backend_url="", backends=tuple(backends), **settings))
    async with TestClient(TestServer(app), timeout=CLIENT_TIMEOUT) as client:
        yield client


@contextlib.asynccontextmanager
async def fakes(*specs: dict):
    workers = [FakeWorker(**spec) for spec in specs]
    for worker in workers:
        await worker.start()
    try:
        yield workers
    finally:
        for worker in workers:
            await worker.stop()


async def post(client, body) -> tuple[int, str, dict]:
    resp = await client.post("/v1/systemone", json=body)
    return resp.status, resp.headers.get("x-jev-worker", ""), await resp.json()


async def metric(client, name: str, **labels) -> float:
    text = await (await client.get("/metrics")).text()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def until(predicate, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached in time")


# --- by model ---------------------------------------------------------------------------------------


async def test_routes_by_model_lists_the_union_and_refuses_unknown_models():
    async with (
        fakes({"model": "m-a", "worker_id": "a"}, {"model": "m-b", "worker_id": "b"}) as (a, b),
        frontend([("m-a", a.url), ("m-b", b.url)]) as client,
    ):
        assert (await post(client, ask("x", "m-a")))[:2] == (200, "a")
        assert (await post(client, ask("x", "m-b")))[:2] == (200, "b")
        assert (await post(client, ask("x", "jev-latest")))[:2] == (200, "a")  # the first backend's model
        legacy = {"kind": "choice", "state": "s", "question": "q?", "options": ["x", "y"]}
        assert (await post(client, legacy))[:2] == (200, "a")
        status, worker, body = await post(client, ask("x", "m-c"))
        assert status == 400 and worker == ""
        error = ErrorEnvelope.model_validate(body)
        assert error.type == "api_usage_error" and "'m-a'" in error.message and "'m-b'" in error.message
        bad = await client.post("/v1/systemone", json={"model": "m-a", "state": "x", "questions": {}})
        assert bad.status == 422  # still validated at the edge, never forwarded
        models = await (await client.get("/v1/models")).json()
        assert [m["name"] for m in models["models"]] == ["m-a", "m-b", "jev-latest"]
    assert a.received == 3 and b.received == 1


async def test_default_model_and_model_learned_from_the_backend():
    async with (
        fakes({"model": "m-a", "worker_id": "a"}, {"model": "m-b", "worker_id": "b"}) as (a, b),
        frontend([("", a.url), ("", b.url)], default_model="m-b") as client,
    ):
        assert (await post(client, ask("x", "m-a")))[:2] == (200, "a")  # model read from its /v1/models
        assert (await post(client, ask("x")))[:2] == (200, "b")


async def test_a_backend_first_down_then_named_leaves_no_unnamed_series():
    """A backend down before its model is known is counted under model "?"; once it answers and names its model,
    that series goes, so the no-healthy-backend alert (deploy/prometheus) does not see a model "?" down forever."""
    async with fakes({"model": "m-a", "worker_id": "a", "healthy": False}) as (a,):
        async with frontend([("", a.url)], default_model="m-a") as client:
            assert await metric(client, "jev_frontend_route_backend_up", model="?") == 0
            text = await (await client.get("/metrics")).text()
            assert 'model="?"' in text
            a.healthy = True

            async def named():
                return await metric(client, "jev_frontend_route_backend_up", model="m-a") == 1

            await until(named)
            text = await (await client.get("/metrics")).text()
            assert not [
                s
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "jev_frontend_route_backend_up" and s.labels["model"] == "?"
            ]


# --- among replicas ---------------------------------------------------------------------------------


async def test_a_state_sticks_to_one_replica_and_cold_states_spread():
    async with (
        fakes({"model": "m", "worker_id": "a"}, {"model": "m", "worker_id": "b"}) as (a, b),
        frontend([("m", a.url), ("m", b.url)]) as client,
    ):
        placed = {}
        for round_ in range(3):
            for i in range(12):
                status, worker, _ = await post(client, ask(f"state {i}", "m"))
                assert status == 200
                assert placed.setdefault(i, worker) == worker, (round_, i)
        assert set(placed.values()) == {"a", "b"}  # cold states go to both (power of two choices)
        assert await metric(client, "jev_frontend_route_requests_total", decision="affinity") == 24
        assert await metric(client, "jev_frontend_route_requests_total", decision="cold") == 12


async def test_round_robin_alternates():
    async with (
        fakes({"model": "m", "worker_id": "a"}, {"model": "m", "worker_id": "b"}) as (a, b),
        frontend([("m", a.url), ("m", b.url)], routing="round_robin") as client,
    ):
        workers = [(await post(client, ask("same", "m")))[1] for _ in range(6)]
    assert sorted(workers) == ["a", "a", "a", "b", "b", "b"] and workers[0] != workers[1]


async def test_overload_spreads_to_the_least_loaded_replica():
    async with (
        fakes({"model": "m", "worker_id": "a", "delay_s": 0.4}, {"model": "m", "worker_id": "b", "delay_s": 0.4}) as (
            a,
            b,
        ),
        frontend([("m", a.url), ("m", b.url)], max_imbalance=2) as client,
    ):
        first = (await post(client, ask("hot", "m")))[1]
        answers = await asyncio.gather(*(post(client, ask("hot", "m")) for _ in range(12)))
        assert all(status == 200 for status, _, _ in answers)
        counts = {w: sum(1 for _, got, _ in answers if got == w) for w in ("a", "b")}
        other = "b" if first == "a" else "a"
        assert counts[first] > counts[other] > 0, counts  # warm first, the overflow to the other
        assert await metric(client, "jev_frontend_route_requests_total", decision="load") == counts[other]


def test_two_choices_and_imbalance_rule():
    settings = Settings(backend_url="", backends=(("m", "http://a:1"), ("m", "http://b:1")), max_imbalance=3)

    class Pool:
        backends = {u: BackendState(u, "m") for _, u in settings.backends}

        def replicas(self, model):
            return list(self.backends.values())

    pool = Pool()
    router = Router(settings, pool, None, rng=random.Random(0))
    a, b = pool.backends.values()
    a.in_flight, b.in_flight = 5, 1
    assert all(router._two_choices([a, b]) is b for _ in range(20))
    a.in_flight = b.in_flight = 0  # a tie: the one given fewer new states so far
    a.cold_assigned = b.cold_assigned = 0
    picks = [router._two_choices([a, b]).url for _ in range(10)]
    assert picks.count(a.url) == picks.count(b.url) == 5
    a.in_flight, b.in_flight = 5, 1
    assert router._unless_overloaded([a], [a, b], "warm").decision == "load"  # 5 - 1 > 3
    b.in_flight = 2
    assert router._unless_overloaded([a], [a, b], "warm").backend is a  # 5 - 2 <= 3
    a.queue_depth = 9  # the worker's own queue counts too
    assert router._unless_overloaded([a], [a, b], "warm").backend is b


# --- out and back in --------------------------------------------------------------------------------


async def test_a_stopped_replica_is_skipped_at_once_and_comes_back():
    async with (
        fakes({"model": "m", "worker_id": "a"}, {"model": "m", "worker_id": "b"}) as (a, b),
        frontend([("m", a.url), ("m", b.url)], health_interval_s=0.3) as client,
    ):
        port = int(b.url.rsplit(":", 1)[1])
        await b.stop()
        started = time.monotonic()
        for i in range(8):  # a refused connection is retried on the other replica: no error at all
            status, worker, _ = await post(client, ask(f"s{i}", "m"))
            assert (status, worker) == (200, "a")
        assert time.monotonic() - started < 5
        health = await (await client.get("/health")).json()
        assert health["status"] == "degraded"
        assert {x["url"]: x["state"] for x in health["detail"]["backends"]} == {a.url: "up", b.url: "down"}
        back = FakeWorker(port=port, model="m", worker_id="b2")
        await back.start()
        try:
            await asyncio.sleep(0.8)  # within a few health intervals it is in rotation again
            workers = {(await post(client, ask(f"new {i}", "m")))[1] for i in range(16)}
            assert workers == {"a", "b2"}
            assert (await (await client.get("/health")).json())["status"] == "ok"
        finally:
            await back.stop()


async def test_an_unhealthy_replica_is_taken_out_within_its_health_interval_and_put_back():
    async with (
        fakes({"model": "m", "worker_id": "a"}, {"model": "m", "worker_id": "b"}) as (a, b),
        frontend([("m", a.url), ("m", b.url)], health_interval_s=0.2) as client,
    ):
        b.healthy = False
        await asyncio.sleep(0.5)
        before = b.received
        assert {(await post(client, ask(f"s{i}", "m")))[1] for i in range(10)} == {"a"}
        assert b.received == before
        b.healthy = True
        await asyncio.sleep(0.5)
        assert {(await post(client, ask(f"t{i}", "m")))[1] for i in range(16)} == {"a", "b"}


async def test_a_draining_replica_s_503_is_answered_by_another_replica():
    """A worker that drains (a rolling update) answers new decisions 503 `unavailable` without computing them; a
    decision is idempotent, so the frontend takes that replica out and asks another: the caller sees no error."""
    async with (
        fakes({"model": "m", "worker_id": "a"}, {"model": "m", "worker_id": "b"}) as (a, b),
        frontend([("m", a.url), ("m", b.url)], health_interval_s=30) as client,
    ):
        await asyncio.sleep(0.2)
        b.error_status = 503
        answered = [await post(client, ask(f"s{i}", "m")) for i in range(8)]
        assert {(status, worker) for status, worker, _ in answered} == {(200, "a")}
        health = await (await client.get("/health")).json()
        assert {x["url"]: x["state"] for x in health["detail"]["backends"]}[b.url] == "up"  # health says up...
        b.error_status, a.error_status = 503, 503  # ...but with every replica draining, the 503 passes through
        status, _, body = await post(client, ask("last", "m"))
        assert status == 503 and ErrorEnvelope.model_validate(body).type == "unavailable"
        a.error_status = 500  # a failure is not retried elsewhere: the work may have run
        b.error_status = None
        status, _, _ = await post(client, ask("other", "m"))
        assert status in (200, 500)


async def test_requests_waiting_on_a_replica_that_stops_answering_are_answered_by_another():
    """A dead host or a cut link answers nothing, not even a reset: once the health probe finds the replica
    unreachable, the requests waiting on it go to another replica instead of waiting for the deadline."""
    async with (
        fakes({"model": "m", "worker_id": "a"}, {"model": "m", "worker_id": "b", "delay_s": 30}) as (a, b),
        frontend([("m", a.url), ("m", b.url)], health_interval_s=0.2, timeout_s=20) as client,
    ):
        await asyncio.sleep(0.3)
        pending = [asyncio.ensure_future(post(client, ask(f"s{i}", "m"))) for i in range(6)]
        await until(lambda: asyncio.sleep(0, len(b.requests) >= 1))
        started = time.monotonic()
        b.health_delay_s = 30  # its probe times out: unreachable
        answered = await asyncio.gather(*pending)
        assert {(status, worker) for status, worker, _ in answered} == {(200, "a")}
        assert time.monotonic() - started < 5  # not the 30 s the replica would have taken, nor the 20 s deadline


async def test_a_replica_that_answers_its_probe_late_once_stays_in_rotation_and_answers():
    """A loaded worker answers its health probe late: one late probe does not take the only replica out (and 502 the
    decision it is computing); `JEV_FRONTEND_HEALTH_MISSES` late probes in a row do."""
    async with (
        fakes({"model": "m", "worker_id": "a", "delay_s": 1.5}) as (a,),
        frontend([("m", a.url)], health_interval_s=0.2, timeout_s=20) as client,
    ):
        await asyncio.sleep(0.3)
        pending = asyncio.ensure_future(post(client, ask("s", "m")))
        await until(lambda: asyncio.sleep(0, len(a.requests) >= 1))
        a.health_delay_s = 0.8  # one probe (0.5 s at this interval) goes unanswered
        await asyncio.sleep(0.6)
        a.health_delay_s = 0
        status, worker, _ = await pending
        assert (status, worker) == (200, "a")
        body = await (await client.get("/health")).json()
        assert [b["state"] for b in body["detail"]["backends"]] == ["up"]
        a.health_delay_s = 30  # every probe late: out after three in a row
        await until(lambda: asyncio.sleep(0, not any(b.up for b in client.app[POOL].backends.values())), 10)
        assert client.app[POOL].backends[a.url].missed == 3


async def test_in_flight_requests_to_a_dying_replica_get_502_not_a_hang():
    async with (
        fakes({"model": "m", "worker_id": "a", "delay_s": 30}) as (a,),
        frontend([("m", a.url)], timeout_s=20) as client,
    ):
        pending = [asyncio.ensure_future(post(client, ask(f"s{i}", "m"))) for i in range(3)]
        await until(lambda: asyncio.sleep(0, len(a.requests) == 3))
        started = time.monotonic()
        await a.stop()  # closes the connections of the requests it holds
        for status, _, body in await asyncio.gather(*pending):
            assert status == 502 and ErrorEnvelope.model_validate(body).type == "backend_unavailable"
        assert time.monotonic() - started < 5
        status, _, body = await post(client, ask("after", "m"))  # nothing left to try: 502 naming it
        assert status == 502 and a.url in ErrorEnvelope.model_validate(body).message


async def test_slow_replica_is_504_in_the_error_shape():
    async with (
        fakes({"model": "m", "worker_id": "a", "delay_s": 5}, {"model": "m", "worker_id": "b", "delay_s": 5}) as (a, b),
        frontend([("m", a.url), ("m", b.url)], timeout_s=0.3) as client,
    ):
        status, _, body = await post(client, ask("s", "m"))
    assert status == 504 and ErrorEnvelope.model_validate(body).type == "backend_timeout"


# --- health and metrics -----------------------------------------------------------------------------


async def test_health_lists_backends_and_metrics_are_per_backend():
    async with (
        fakes({"model": "m", "worker_id": "a"}, {"model": "m", "worker_id": "b"}) as (a, b),
        frontend([("m", a.url), ("m", b.url)]) as client,
    ):
        for i in range(4):
            assert (await post(client, ask(f"s{i}", "m")))[0] == 200
        health = await client.get("/health")
        body = await health.json()
        assert health.status == 200 and body["status"] == "ok"
        assert sorted(x["worker_id"] for x in body["detail"]["backends"]) == ["a", "b"]
        assert body["detail"]["models"] == {"m": {"up": 2, "total": 2}}
        text = await (await client.get("/metrics")).text()
        families = {f.name: f for f in text_string_to_metric_families(text)}  # one valid exposition
        routed = sum(s.value for s in families["jev_frontend_route_requests"].samples)
        (remembered,) = families["jev_frontend_route_affinity_entries"].samples
        assert remembered.value == 4  # four states, each remembered where it was sent
        assert routed == 4
        assert {s.labels["backend"] for s in families["jev_frontend_route_request_seconds"].samples} <= {a.url, b.url}
        workers = {s.labels["backend"] for s in families["jev_worker_decisions"].samples}
        assert workers and workers <= {a.url, b.url}  # the workers' metrics, merged, labelled by backend
        assert "jev_frontend_backend_up 1.0" in text
        a.healthy = b.healthy = False
        down = await client.get("/health")
        assert down.status == 503 and (await down.json())["detail"]["error_type"] == "not_ready"


# --- the index: warm states and discovery -----------------------------------------------------------


@needs_redis
async def test_discovery_and_warm_routing_from_the_index():
    redis_url = f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
    identity = f"test/{uuid.uuid4().hex}@1"
    model = f"m-{uuid.uuid4().hex[:8]}"
    ns = namespace(identity)
    index_a = WorkerIndex.over(IndexConnection(redis_url), identity, Owner(f"{model}-a", "http://unused"))
    index_b = WorkerIndex.over(IndexConnection(redis_url), identity, Owner(f"{model}-b", "http://unused"))
    try:
        async with fakes({"model": model, "worker_id": f"{model}-a"}, {"model": model, "worker_id": f"{model}-b"}) as (
            a,
            b,
        ):
            for index, fake in ((index_a, a), (index_b, b)):
                await index.directory.register({"worker_id": fake.worker_id, "url": fake.url, "model": model, "ns": ns})
            async with frontend([], discovery=True, redis_url=redis_url, default_model=model) as client:
                health = await (await client.get("/health")).json()
                mine = {x["url"] for x in health["detail"]["backends"] if x["model"] == model}
                assert mine == {a.url, b.url}
                # b holds "warm state" (what a worker registers when the prefix enters its L3)
                await index_b.routes.register(state_route_key(render_state("warm state")))
                for _ in range(5):
                    assert (await post(client, ask("warm state", model)))[1] == f"{model}-b"
                assert await metric(client, "jev_frontend_route_requests_total", decision="warm") == 5
                # the index loses every record (Redis restarted empty): the workers that still answer stay
                await index_a.directory.unregister(a.worker_id)
                await index_b.directory.unregister(b.worker_id)
                await asyncio.sleep(0.6)
                health = await (await client.get("/health")).json()
                assert {x["url"] for x in health["detail"]["backends"] if x["model"] == model} == {a.url, b.url}
                # b stops (out of the index, its health no longer 200): dropped at the next discovery round
                await b.stop()
                await asyncio.sleep(0.8)
                assert {(await post(client, ask("warm state", model)))[1] for _ in range(3)} == {f"{model}-a"}
                health = await (await client.get("/health")).json()
                assert {x["url"] for x in health["detail"]["backends"] if x["model"] == model} == {a.url}
                # its backend-up series leaves with it (else it would read 0 forever, as if the model lost one)
                text = await (await client.get("/metrics")).text()
                ups = {
                    s.labels["backend"]
                    for f in text_string_to_metric_families(text)
                    for s in f.samples
                    if s.name == "jev_frontend_route_backend_up"
                }
                assert a.url in ups and b.url not in ups
                assert await metric(client, "jev_frontend_index_up") == 1
    finally:
        for index in (index_a, index_b):
            await index.directory.unregister(index.routes.owner.worker_id)
            await index.connection.purge(index.ns)
            await index.close()


# --- settings and the route key ---------------------------------------------------------------------


def test_backends_setting(monkeypatch):
    assert parse_backends(" m1=http://a:8000/, http://b:8000 ,") == (("m1", "http://a:8000"), ("", "http://b:8000"))
    with pytest.raises(ValueError, match="JEV_BACKENDS"):
        parse_backends("m1=a:8000")
    for name in ("JEV_BACKEND_URL", "JEV_FRONTEND_DISCOVERY", "JEV_DEFAULT_MODEL", "JEV_ROUTING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JEV_BACKENDS", "m=http://w1:8000,m=http://w2:8000")
    settings = Settings.from_env()
    assert settings.backend_url == "" and not settings.single_backend
    assert settings.static_backends() == (("m", "http://w1:8000"), ("m", "http://w2:8000"))
    monkeypatch.setenv("JEV_BACKEND_URL", "http://w1:8000")  # listed twice: one backend
    assert Settings.from_env().static_backends() == (("m", "http://w1:8000"), ("m", "http://w2:8000"))
    monkeypatch.setenv("JEV_ROUTING", "random")
    with pytest.raises(ValueError, match="JEV_ROUTING"):
        Settings.from_env()
    with pytest.raises(ValueError, match="no backend"):
        Settings(backend_url="")


def test_route_key_matches_the_workers_rendering():
    from jev_common.schema import SystemOneRequest
    from jev_worker.request.envelope import render_state as worker_render

    for state in ("plain text", "  spaced\n", {"b": [1, 2.5, None], "a": "ü 中"}, [{"x": True}], "🙂"):
        request = SystemOneRequest.model_validate({"model": "m", "state": state, "questions": QUESTIONS})
        assert render_state(request.state) == worker_render(request)
    assert state_route_key("s", ["k2", "k1"]) == state_route_key("s", ["k1", "k2"]) != state_route_key("s")
