"""One frontend in front of three real worker processes (python -m jev_worker on the tiny random
checkpoint): two replicas of one model and one worker of a second model, found through the Redis
index (the workers announce themselves). Routing by model, by the worker where a state's prefix is
resident (asserted on the workers' own L3 counters), around a killed replica and back, and overload
spreading."""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import time
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer

from benchmarks.stack import Stack
from jev_frontend.app import create_app
from jev_frontend.settings import Settings

from ..unit.test_cache_index import needs_redis

pytestmark = [pytest.mark.slow, needs_redis]
REPO = Path(__file__).resolve().parents[2]
MAIN, SECOND = "smollm2-135m-cpu", "tiny-second"
TIMEOUT = aiohttp.ClientTimeout(total=60)


def ask(state: str, question: str = "Is it on?", model: str = MAIN) -> dict:
    return {"model": model, "state": state, "questions": {"q": {"type": "noul", "instructions": question}}}


def second_recipe(tmp: Path) -> str:
    folder = tmp / SECOND
    shutil.copytree(REPO / "recipes" / MAIN, folder)
    data = yaml.safe_load((folder / "recipe.yaml").read_text())
    data["name"] = SECOND
    (folder / "recipe.yaml").write_text(yaml.safe_dump(data))
    return str(folder)


@contextlib.asynccontextmanager
async def frontend(redis_url: str, **overrides):
    settings = dict(backend_url="", discovery=True, redis_url=redis_url, default_model=MAIN, health_interval_s=0.5)
    settings.update(overrides)
    async with TestClient(TestServer(create_app(Settings(**settings))), timeout=TIMEOUT) as client:
        yield client


async def l3(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url + "/v1/cache/stats") as resp:
        return (await resp.json())["levels"]["l3"]


async def decisions(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    return sum(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("jev_worker_decisions_total{") and 'outcome="ok"' in line
    )


@pytest.fixture
async def workers(tiny_text_dir, tmp_path):
    redis_url = f"redis://127.0.0.1:6379/{random.randint(1, 15)}"
    common = {
        "JEV_MODEL_PATH": tiny_text_dir,
        "JEV_DEVICE": "cpu",
        "JEV_DTYPE": "float32",
        "JEV_REDIS_URL": redis_url,
        "JEV_WORKER_REGISTER_TTL_S": "3",
        "JEV_TORCH_THREADS": "1",
        "JEV_CACHE_L3_BYTES": "64M",
    }
    tag = f"{random.randrange(1 << 30):x}"
    async with Stack(tmp_path / "logs") as stack:
        a1 = await stack.worker("a1", **common, JEV_RECIPE=MAIN, JEV_WORKER_ID=f"routing-{tag}-a1")
        a2 = await stack.worker("a2", **common, JEV_RECIPE=MAIN, JEV_WORKER_ID=f"routing-{tag}-a2")
        b1 = await stack.worker("b1", **common, JEV_RECIPE=second_recipe(tmp_path), JEV_WORKER_ID=f"routing-{tag}-b1")
        await stack.wait_healthy(timeout_s=240)
        yield stack, redis_url, (a1, a2, b1)


async def test_routing_across_real_workers(workers):
    stack, redis_url, (a1, a2, b1) = workers
    async with aiohttp.ClientSession(timeout=TIMEOUT) as direct:
        async with frontend(redis_url) as client:
            # --- discovery and models
            health = await (await client.get("/health")).json()
            urls = {x["url"]: x for x in health["detail"]["backends"]}
            assert {a1.url, a2.url, b1.url} <= set(urls), health
            assert urls[a1.url]["model"] == urls[a2.url]["model"] == MAIN and urls[b1.url]["model"] == SECOND
            names = [m["name"] for m in (await (await client.get("/v1/models")).json())["models"]]
            assert {MAIN, SECOND, "jev-latest"} <= set(names)

            # --- by model
            for model, want in ((SECOND, SECOND), (MAIN, MAIN), ("jev-latest", MAIN)):
                resp = await client.post("/v1/systemone", json=ask("The kettle is on.", model=model))
                assert resp.status == 200 and (await resp.json())["model"] == want
            resp = await client.post("/v1/systemone", json=ask("x", model="no-such-model"))
            assert resp.status == 400 and (await resp.json())["detail"]["error_type"] == "api_usage_error"

            # --- a state's later requests land where its prefix is resident (the workers' L3 counters)
            for url in (a1.url, a2.url):
                async with direct.post(url + "/v1/cache/reset") as r:
                    assert r.status == 200
            states = [f"Ticket {i}: the invoice for order {i * 7} was charged twice." for i in range(6)]
            for state in states:
                assert (await client.post("/v1/systemone", json=ask(state, "Is a refund asked for?"))).status == 200
            first = {url: await l3(direct, url) for url in (a1.url, a2.url)}
            assert sum(s["misses"] for s in first.values()) == len(states)
            assert all(s["misses"] > 0 for s in first.values()), first  # cold states spread over both
        await asyncio.sleep(0.3)  # the workers' route registrations land in Redis
        async with frontend(redis_url) as fresh:  # no memory of where it sent anything: the index decides
            for state in states:
                resp = await fresh.post("/v1/systemone", json=ask(state, "Is the customer angry?"))
                assert resp.status == 200 and "l3=hit" in resp.headers["x-jev-cache"], resp.headers
            second = {url: await l3(direct, url) for url in (a1.url, a2.url)}
            for url in (a1.url, a2.url):  # each state went back to the worker that had computed it
                assert second[url]["misses"] == first[url]["misses"]
                assert second[url]["hits"] - first[url]["hits"] == first[url]["misses"]
            text = await (await fresh.get("/metrics")).text()
            assert 'decision="warm"' in text

            # --- overload spreads: a hot state is sent to its warm replica until that one is busy
            before = {url: await decisions(direct, url) for url in (a1.url, a2.url)}
            async with frontend(redis_url, max_imbalance=1) as busy:
                answers = await asyncio.gather(
                    *(busy.post("/v1/systemone", json=ask(states[0], f"Question {i}?")) for i in range(24))
                )
                assert [r.status for r in answers] == [200] * 24
            after = {url: await decisions(direct, url) for url in (a1.url, a2.url)}
            assert all(after[url] > before[url] for url in after), (before, after)

            # --- a killed replica is skipped at once, and back within its health interval once it answers
            a2.process.kill()
            await a2.process.wait()
            started = time.monotonic()
            for i in range(6):
                resp = await fresh.post("/v1/systemone", json=ask(f"After the kill {i}."))
                assert resp.status == 200, await resp.text()
            assert time.monotonic() - started < 30
            await asyncio.sleep(0.6)
            backends = {x["url"]: x["state"] for x in (await (await fresh.get("/health")).json())["detail"]["backends"]}
            assert backends[a2.url] == "down" and backends[a1.url] == "up"
            port = a2.url.rsplit(":", 1)[1]
            restarted = await stack.start("a2-again", "jev_worker", int(port), {**a2.env})
            await stack.wait_healthy([restarted], timeout_s=240)
            await asyncio.sleep(1.2)  # two health intervals
            served = await decisions(direct, a2.url)
            for i in range(12):
                assert (await fresh.post("/v1/systemone", json=ask(f"Back again {i}."))).status == 200
            assert await decisions(direct, a2.url) > served  # in rotation again
