"""Per-key rate limits at the edge (jev_frontend/limits.py, buckets.py, ratelimit.py): the configuration, the token
buckets in memory and in a real Redis, and two frontends sharing Redis enforcing one limit."""

from __future__ import annotations

import contextlib
import hashlib
import os
import uuid

import aiohttp
import pytest
import redis.asyncio as aioredis
from aiohttp.test_utils import TestClient, TestServer

from jev_common.identity import CallerIdentity
from jev_frontend.app import create_app
from jev_frontend.buckets import KEY_PREFIX, Buckets, MemoryBuckets
from jev_frontend.limits import Limit, parse_rate_limits
from jev_frontend.settings import Settings
from tests.fakes.fake_worker import FakeWorker
from tests.fakes.net import closed_port

REDIS_URL = os.environ.get("JEV_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
CHOICE = {"kind": "choice", "state": "The light is red.", "question": "What now?", "options": ["stop", "go"]}
TIMEOUT = aiohttp.ClientTimeout(total=20)


def digest(key: str, digits: int = 16) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:digits]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


# --- configuration ---------------------------------------------------------------------------------------


def test_entries_name_keys_by_digest_and_a_default_for_everyone():
    limits = parse_rate_limits(
        f"default=60:20000, sha256:{digest('k-big')}=600:\n# a comment\nsha256:{digest('k-big', 40)}=0:5000"
    )
    assert limits.default == Limit(60, 20000)
    assert limits.for_key("k-big") == Limit(0, 5000)  # the longest matching digest wins
    assert limits.for_key("k-other") == Limit(60, 20000)
    assert parse_rate_limits(f"sha256:{digest('k-1')}=5").for_key("k-2") == Limit()  # no default: unlimited
    assert not parse_rate_limits("") and not parse_rate_limits("default=0:0")
    assert limits.unmatched(("k-big",)) == [] and limits.unmatched(("k-other",)) == [
        digest("k-big"),
        digest("k-big", 40),
    ]
    merged = limits.merged(parse_rate_limits(f"default=1:1,sha256:{digest('k-new')}=2"))
    assert merged.default == Limit(1, 1) and merged.for_key("k-big") == Limit(0, 5000)
    assert merged.for_key("k-new") == Limit(2, 0)


@pytest.mark.parametrize(
    "text",
    ["k-secret=10:10", "default=ten", "default=5:-1", "sha256:abc=1", "default"],
)
def test_a_bad_entry_is_refused_without_echoing_it(text):
    with pytest.raises(ValueError) as raised:
        parse_rate_limits(text)
    message = str(raised.value)
    assert "JEV_RATE_LIMITS, entry 1" in message and "k-secret" not in message and "ten" not in message


def test_the_file_is_read_over_the_variable(tmp_path, monkeypatch):
    path = tmp_path / "limits"
    path.write_text(f"default=10:100\nsha256:{digest('k-1')}=1:1  # one key\n")
    monkeypatch.setenv("JEV_RATE_LIMITS", "default=5,sha256:" + digest("k-2") + "=2")
    monkeypatch.setenv("JEV_RATE_LIMITS_FILE", str(path))
    limits = Settings.from_env().rate_limits
    assert (
        limits.default == Limit(10, 100) and limits.for_key("k-1") == Limit(1, 1) and limits.for_key("k-2") == Limit(2)
    )
    monkeypatch.setenv("JEV_RATE_LIMITS_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="JEV_RATE_LIMITS_FILE"):
        Settings.from_env()


# --- buckets -------------------------------------------------------------------------------------------------


def test_memory_buckets_refill_over_a_minute_and_tokens_debited_after_hold_the_next_request():
    clock = Clock()
    buckets = MemoryBuckets(clock)
    limit = Limit(requests=3, tokens=100)
    assert [buckets.apply("c", limit, 1, 0).admitted for _ in range(4)] == [True, True, True, False]
    clock.now += 20  # a third of a minute: one request back
    assert buckets.apply("c", limit, 1, 0).admitted and not buckets.apply("c", limit, 1, 0).admitted
    clock.now += 60
    assert buckets.apply("c", limit, 0, 250).tokens == pytest.approx(-150)  # an answer's tokens may overdraw
    assert not buckets.apply("c", limit, 1, 0).admitted  # ... and hold the caller until they are back
    clock.now += 91  # 151 tokens refilled
    assert buckets.apply("c", limit, 1, 0).admitted
    assert buckets.apply("other", limit, 1, 0).admitted  # callers never share a bucket
    clock.now += 120  # both full again: swept, nothing kept for idle callers
    buckets.apply("third", limit, 0, 0)
    assert len(buckets) == 1


async def test_redis_buckets_are_one_bucket_for_every_client_and_expire_when_full():
    identity, namespace = "addr:127.0.0.1", f"test-{uuid.uuid4().hex[:12]}"  # a namespace of this test's own
    first, second = Buckets(REDIS_URL, namespace), Buckets(REDIS_URL, namespace)
    try:
        limit = Limit(requests=4, tokens=1000)
        got = [await (first if i % 2 else second).take(identity, limit) for i in range(5)]
        assert [g.admitted for g in got] == [True, True, True, True, False] and first.shared and second.shared
        levels = await first.debit(identity, limit, 300)
        assert levels.tokens == pytest.approx(700, abs=5)
        client = aioredis.Redis.from_url(REDIS_URL)
        ttl_ms = await client.pttl(f"{KEY_PREFIX}{namespace}:{identity}")
        await client.aclose()
        assert 1000 < ttl_ms <= 61_000  # gone once both buckets would be full again
    finally:
        await first.close()
        await second.close()


async def test_without_redis_each_replica_enforces_the_full_limit_alone_and_says_so():
    with closed_port() as port:
        buckets = Buckets(f"redis://127.0.0.1:{port}/0")
        limit = Limit(requests=2)
        got = [(await buckets.take("key:x", limit)).admitted for _ in range(3)]
        assert got == [True, True, False]
        state = buckets.state()
        assert state["store"] == "memory" and state["enforced"] == "per replica" and "Redis" in state["reason"]
        await buckets.close()


# --- two frontends sharing Redis --------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def frontends(count: int, redis_url: str, **settings):
    async with FakeWorker() as worker_url, contextlib.AsyncExitStack() as stack:
        clients = []
        for _ in range(count):
            app = create_app(Settings(backend_url=worker_url, redis_url=redis_url, **settings))
            clients.append(await stack.enter_async_context(TestClient(TestServer(app), timeout=TIMEOUT)))
        yield clients


async def test_two_frontends_sharing_redis_enforce_one_per_key_limit():
    key, other, token = f"k-{uuid.uuid4().hex}", f"k-{uuid.uuid4().hex}", f"t-{uuid.uuid4().hex}"
    limits = parse_rate_limits(f"default=2, sha256:{digest(key)}=4:")
    async with frontends(2, REDIS_URL, api_keys=(key, other), internal_tokens=(token,), rate_limits=limits) as (a, b):
        auth = {"Authorization": f"Bearer {key}"}
        statuses = []
        for i in range(5):  # alternating replicas: one bucket of 4 for this key
            response = await (a if i % 2 else b).post("/v1/systemone", json=CHOICE, headers=auth)
            statuses.append(response.status)
        assert statuses == [200, 200, 200, 200, 429]
        body = await response.json()
        assert (
            body["detail"]["error_type"] == "rate_limit_error" and "4 requests per minute" in body["detail"]["message"]
        )
        assert 1 <= int(response.headers["Retry-After"]) <= 15 and int(response.headers["retry-after-ms"]) > 0
        assert response.headers["x-ratelimit-limit-requests"] == "4"
        assert response.headers["x-ratelimit-remaining-requests"] == "0"
        assert "x-ratelimit-limit-tokens" not in response.headers  # this key has no token limit
        # another key has its own bucket, of the default
        others = [
            (await c.post("/v1/systemone", json=CHOICE, headers={"Authorization": f"Bearer {other}"})).status
            for c in (a, b, a)
        ]
        assert others == [200, 200, 429]
        assert (await a.post("/v1/systemone", json=CHOICE, headers={"Authorization": "Bearer wrong"})).status == 401
        health = await (await b.get("/health")).json()
        assert health["detail"]["rate_limits"]["store"] == "redis"
        assert health["detail"]["rate_limits"]["enforced"] == "across replicas"
        metrics = await (await a.get("/metrics")).text()
        assert 'jev_frontend_rate_limited_total{limit="requests"}' in metrics
        assert "jev_frontend_rate_limit_shared 1.0" in metrics


async def test_prompt_tokens_are_debited_from_the_answer_and_limit_the_next_request():
    token = f"t-{uuid.uuid4().hex}"
    limits = parse_rate_limits("default=100:10")  # keys off: per address (in this deployment's namespace)
    async with frontends(2, REDIS_URL, internal_tokens=(token,), rate_limits=limits) as (a, b):
        first = await a.post("/v1/systemone", json=CHOICE)
        assert first.status == 200
        used = (await first.json())["usage"]["prompt_tokens"]
        assert used > 10  # the fake worker's count: this one answer overdraws the bucket
        assert first.headers["x-ratelimit-limit-tokens"] == "10"
        assert first.headers["x-ratelimit-remaining-tokens"] == "0"
        assert float(first.headers["x-ratelimit-reset-tokens"]) > 60  # in debt: more than a minute to full
        second = await b.post("/v1/systemone", json=CHOICE, headers={"Authorization": "Bearer anything"})
        assert second.status == 429 and "prompt tokens per minute" in (await second.json())["detail"]["message"]
        assert int(second.headers["Retry-After"]) >= 1
        assert (await a.get("/v1/models")).status == 200  # only the work routes are limited


async def test_an_admitted_request_refused_later_still_says_where_its_caller_stands():
    async with frontends(
        1, REDIS_URL, internal_tokens=(f"t-{uuid.uuid4().hex}",), rate_limits=parse_rate_limits("default=5")
    ) as (a,):
        response = await a.post("/v1/systemone", data=b"{not json", headers={"Content-Type": "application/json"})
        assert response.status == 422  # the frontend's own refusal, after the request was counted
        assert response.headers["x-ratelimit-limit-requests"] == "5"
        assert response.headers["x-ratelimit-remaining-requests"] == "4"


async def test_with_redis_unreachable_each_frontend_enforces_the_full_limit_alone():
    limits = parse_rate_limits("default=2")
    with closed_port() as port:
        async with frontends(2, f"redis://127.0.0.1:{port}/0", rate_limits=limits) as (a, b):
            statuses = [(await c.post("/v1/systemone", json=CHOICE)).status for c in (a, a, a, b, b, b)]
            assert statuses == [200, 200, 429, 200, 200, 429]
            health = await (await a.get("/health")).json()
            assert health["status"] == "ok"  # the worker's health, passed through ...
            assert health["detail"]["rate_limits"]["enforced"] == "per replica"  # ... and where the limits are
            assert "Redis unreachable" in health["detail"]["rate_limits"]["reason"]
            assert "jev_frontend_rate_limit_shared 0.0" in await (await a.get("/metrics")).text()


async def test_without_limits_nothing_is_counted_or_added():
    async with frontends(1, REDIS_URL) as (a,):
        response = await a.post("/v1/systemone", json=CHOICE)
        assert response.status == 200 and not any(h.startswith("x-ratelimit") for h in response.headers)
        assert "rate_limits" not in (await (await a.get("/health")).json()).get("detail", {})


def test_buckets_are_named_by_the_deployment_and_the_keys_hmac_identity():
    identity, other = CallerIdentity.for_tokens(("t",)), CallerIdentity.for_tokens(("t-2",))
    assert identity.of_key("k") != "key:" + digest("k")  # the configured digest never names the Redis key
    assert identity.namespace != other.namespace  # two deployments on one Redis: per-address buckets apart too
