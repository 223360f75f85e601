"""The fake worker keeps the worker HTTP contract (so frontend tests against it mean something)."""

from __future__ import annotations

import aiohttp

from jev_common.schema import CacheStats, DecisionResponse, ErrorEnvelope, HealthResponse
from tests.fakes.fake_worker import FakeWorker
from tools.compare_with_backend import DEFAULT_CORPUS

TIMEOUT = aiohttp.ClientTimeout(total=20)


async def test_decisions_valid_deterministic_and_not_constant():
    async with FakeWorker() as url, aiohttp.ClientSession(timeout=TIMEOUT) as session:
        answers = []
        for request in DEFAULT_CORPUS[:-1]:
            async with session.post(url + "/v1/systemone", json=request) as resp:
                assert resp.status == 200, await resp.text()
                answer = DecisionResponse.model_validate_json(await resp.read())
            assert answer.kind == request["kind"] and answer.request_id == request["request_id"]
            assert len(answer.probabilities) == len(request["options"])
            answers.append(answer)
        by_kind = {a.kind: a for a in answers}
        assert by_kind["noul"].noul is not None
        assert by_kind["score"].score is not None
        span = by_kind["span"].span
        assert DEFAULT_CORPUS[4]["state"][span.start : span.end] == span.text == by_kind["span"].choice
        assert by_kind["set"].yes_probabilities and by_kind["set"].selected is not None
        assert len({tuple(a.probabilities) for a in answers}) == len(answers)
        async with FakeWorker() as other:  # same request, fresh worker: same decision
            async with session.post(other + "/v1/systemone", json=DEFAULT_CORPUS[0]) as resp:
                again = DecisionResponse.model_validate_json(await resp.read())
        assert again.probabilities == answers[0].probabilities


async def test_health_cache_metrics_and_config_endpoints():
    fake = FakeWorker()
    async with fake as url, aiohttp.ClientSession(timeout=TIMEOUT) as session:
        async with session.get(url + "/health") as resp:
            assert resp.status == 200 and HealthResponse.model_validate(await resp.json()).status == "ok"
        for _ in range(2):
            async with session.post(url + "/v1/systemone", json=DEFAULT_CORPUS[0]):
                pass
        async with session.get(url + "/v1/cache/stats") as resp:
            stats = CacheStats.model_validate(await resp.json())
        assert (stats.levels["l1"].hits, stats.levels["l1"].misses) == (1, 1)
        async with session.post(url + "/v1/cache/reset") as resp:
            assert resp.status == 200 and CacheStats.model_validate(await resp.json()).levels["l1"].hits == 0
        async with session.post(url + "/v1/systemone", json=DEFAULT_CORPUS[0]) as resp:
            assert resp.headers["x-jev-cache"] == "l1=miss"
        async with session.get(url + "/metrics") as resp:
            assert 'jev_worker_decisions_total{kind="choice"} 3.0' in await resp.text()
        async with session.post(url + "/fake/config", json={"healthy": False}) as resp:
            assert resp.status == 200 and (await resp.json())["healthy"] is False
        assert fake.healthy is False
        async with session.get(url + "/health") as resp:
            assert resp.status == 503
            assert ErrorEnvelope.model_validate(await resp.json()).type == "not_ready"
        async with session.post(url + "/fake/config", json={"nope": 1}) as resp:
            assert resp.status == 422
        async with session.post(url + "/v1/systemone", json={"kind": "choice"}) as resp:
            assert resp.status == 422 and fake.received == 4 and len(fake.requests) == 3
