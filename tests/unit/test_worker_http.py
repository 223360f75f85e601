"""The worker's HTTP contract: health, errors as envelopes, capacity, deadlines, caches, metrics."""

from __future__ import annotations

import asyncio
import copy
import re

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from jev_common.schema import CacheStats, DecisionResponse, ErrorEnvelope
from jev_worker.app import create_app
from jev_worker.settings import CacheSettings

from .worker_helpers import REQUESTS, sample_value, slow_engine, worker_client

GOOD = REQUESTS["choice"]


def envelope(body: dict) -> ErrorEnvelope:
    return ErrorEnvelope.model_validate(body)


ENVELOPE = {
    "model": "jev-latest",
    "state": "The kettle whistles.",
    "questions": {"q": {"type": "noul", "instructions": "Is the water boiling?"}},
}


def _nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = [value]
    return value


BAD_BODIES = [
    ("not json", b"{kind: choice", 422, "validation_error"),
    (
        "huge integer",
        b'{"model": "jev-latest", "state": ' + b"9" * 5000 + b', "questions": {}}',
        422,
        "validation_error",
    ),
    ("deeply nested", b'{"model": "jev-latest", "state": ' + b"[" * 5000 + b"]" * 5000 + b"}", 422, "validation_error"),
    ("nested state", dict(ENVELOPE, state=_nested(40)), 422, "validation_error"),
    (
        "nested set description",
        dict(ENVELOPE, questions={"q": {"type": "set", "criteria": {"a": _nested(40)}}}),
        422,
        "validation_error",
    ),
    ("envelope: null state", dict(ENVELOPE, state=None), 422, "validation_error"),
    ("envelope: no questions", dict(ENVELOPE, questions={}), 422, "validation_error"),
    ("envelope: missing type", dict(ENVELOPE, questions={"q": {"instructions": "x"}}), 422, "validation_error"),
    (
        "envelope: unknown type",
        dict(ENVELOPE, questions={"q": {"type": "boolean", "instructions": "x"}}),
        422,
        "validation_error",
    ),
    (
        "envelope: one option",
        dict(ENVELOPE, questions={"q": {"type": "choice", "criteria": {"a": None}}}),
        422,
        "validation_error",
    ),
    (
        "envelope: 256 options",
        dict(ENVELOPE, questions={"q": {"type": "choice", "criteria": {f"o{i}": None for i in range(256)}}}),
        422,
        "validation_error",
    ),
    (
        "envelope: 11 levels",
        dict(ENVELOPE, questions={"q": {"type": "score", "criteria": list("abcdefghijk")}}),
        422,
        "validation_error",
    ),
    (
        "envelope: map score",
        dict(ENVELOPE, questions={"q": {"type": "score", "criteria": {"0": "a", "1": "b"}}}),
        422,
        "validation_error",
    ),
    (
        "envelope: null level",
        dict(ENVELOPE, questions={"q": {"type": "score", "criteria": ["a", None]}}),
        422,
        "validation_error",
    ),
    ("envelope: empty noul", dict(ENVELOPE, questions={"q": {"type": "noul"}}), 422, "validation_error"),
    ("envelope: unknown model", dict(ENVELOPE, model="no-such-model"), 400, "api_usage_error"),
    (
        "envelope: image on a text recipe",
        dict(ENVELOPE, state="see <img>", assets={"<img>": {"type": "image", "data_base64": "iVBORw0KGgo="}}),
        422,
        "image_not_supported",
    ),
    ("not an object", b"[1, 2]", 422, "validation_error"),
    ("unknown kind", dict(GOOD, kind="rank"), 422, "validation_error"),
    ("empty options", dict(GOOD, options=[]), 422, "validation_error"),
    ("one option", dict(GOOD, options=["yes"]), 422, "validation_error"),
    ("duplicate options", dict(GOOD, options=["yes", "yes"]), 422, "validation_error"),
    ("blank option", dict(GOOD, options=["yes", "  "]), 422, "validation_error"),
    ("wrong option type", dict(GOOD, options=["yes", 3]), 422, "validation_error"),
    ("too many options", dict(GOOD, options=[f"o{i}" for i in range(256)]), 422, "validation_error"),
    ("missing question", {k: v for k, v in GOOD.items() if k != "question"}, 422, "validation_error"),
    ("blank question", dict(GOOD, question="   "), 422, "validation_error"),
    ("empty state", dict(GOOD, state={}), 422, "validation_error"),
    ("unknown field", dict(GOOD, temperature=0.7), 422, "validation_error"),
    ("image as URL", dict(GOOD, state={"image": "https://example.com/cat.png"}), 422, "validation_error"),
    ("score non-numeric", dict(GOOD, kind="score"), 422, "validation_error"),
    ("span not in state", dict(GOOD, kind="span", options=["kettle", "teapot"]), 422, "validation_error"),
    ("negative deadline", dict(GOOD, deadline_s=-1), 422, "validation_error"),
    (
        "image on a text recipe",
        dict(GOOD, state={"image": "data:image/png;base64,iVBORw0KGgo="}),
        422,
        "image_not_supported",
    ),
    # JEV-VL's own single-question forms, which a label-token recipe does not read (legacy.QuestionForm)
    ("list state", dict(GOOD, state=["The kettle ", "whistles."]), 422, "validation_error"),
    ("object state", dict(GOOD, state={"kettle": "whistles"}), 422, "validation_error"),
    (
        "noul without options",
        {k: v for k, v in dict(GOOD, kind="noul").items() if k != "options"},
        422,
        "validation_error",
    ),
    ("choice without options", {k: v for k, v in GOOD.items() if k != "options"}, 422, "validation_error"),
]


async def test_bad_inputs_get_their_4xx_envelope(worker_settings):
    async with worker_client(worker_settings(max_body_bytes=64 << 10)) as (client, _):
        for name, body, status, type_ in BAD_BODIES:
            if isinstance(body, bytes):
                response = await client.post("/v1/systemone", data=body, headers={"content-type": "application/json"})
            else:
                response = await client.post("/v1/systemone", json=body)
            payload = await response.json()
            assert response.status == status, (name, payload)
            assert envelope(payload).type == type_, (name, payload)
        big = dict(GOOD, state={"text": "x" * 60_000}, question="q" * 10_000)
        response = await client.post("/v1/systemone", json=big)
        assert response.status == 413
        assert envelope(await response.json()).type == "body_too_large"
        # after all of that the worker still answers
        response = await client.post("/v1/systemone", json=GOOD)
        assert response.status == 200
        DecisionResponse.model_validate(await response.json())


async def test_unknown_route_and_method(worker_settings):
    async with worker_client(worker_settings()) as (client, _):
        response = await client.get("/v1/chat/completions")
        assert response.status == 404 and envelope(await response.json()).type == "not_found"
        response = await client.get("/v1/systemone")
        assert response.status == 405 and envelope(await response.json()).type == "method_not_allowed"
        assert response.headers["Allow"] == "POST"


async def test_health_is_503_until_loaded_and_says_why(worker_settings, tmp_path):
    app = create_app(worker_settings(model_path=str(tmp_path / "missing")), wait_until_ready=True)
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/health")
        body = await response.json()
        assert response.status == 503
        assert body["detail"]["error_type"] == "not_ready" and "missing" in body["detail"]["message"]
        response = await client.post("/v1/systemone", json=GOOD)
        assert response.status == 503
        live = await client.get("/livez")  # not ready, but alive: liveness must not restart a failed load loop
        assert live.status == 200 and (await live.json())["state"] == "unavailable"


async def test_a_decision_names_the_worker_the_checkpoint_and_the_code_that_answered(worker_settings):
    """Every answer can be traced: which worker, which checkpoint (its pinned revision, here a local folder's
    content digest) and which code (JEV_CODE_VERSION, else a digest of the sources) answered it; /v1/models says
    the same of each model."""
    from jev_common.version import source_version

    async with worker_client(worker_settings(worker_id="w-7")) as (client, service):
        response = await client.post("/v1/systemone", json=GOOD)
        assert response.status == 200 and response.headers["x-jev-worker"] == "w-7"
        assert response.headers["x-jev-revision"] == service.identity and service.identity.startswith("local:")
        assert response.headers["x-jev-code-version"] == source_version()
        assert source_version().startswith("src-") and len(source_version()) == 16
        models = (await (await client.get("/v1/models")).json())["models"]
        assert {(m["x_revision"], m["x_code_version"]) for m in models} == {(service.identity, source_version())}
        assert {m["x_modality"] for m in models} == {"text"}  # what the page offers for the state (no image upload)
        assert {m["x_readout"] for m in models} == {"label-tokens"}  # which readout answers
    async with worker_client(worker_settings(code_version="git-abc123")) as (client, _):
        response = await client.post("/v1/systemone", json=GOOD)
        assert response.headers["x-jev-code-version"] == "git-abc123"


async def test_health_waits_for_warmup(worker_settings):
    app = create_app(worker_settings())
    async with TestClient(TestServer(app)) as client:
        seen = set()
        for _ in range(400):
            response = await client.get("/health")
            seen.add(response.status)
            if response.status == 200:
                break
            await asyncio.sleep(0.05)
        assert 200 in seen
        body = await response.json()
        assert body["status"] in ("ok", "degraded") and body["detail"]["warmup_seconds"] > 0


async def test_over_capacity_gets_429_and_worker_recovers(worker_settings):
    async with worker_client(worker_settings(max_queue=2, batching=False)) as (client, _):
        bodies = [dict(copy.deepcopy(GOOD), question=f"Variant {i}?") for i in range(12)]
        responses = await asyncio.gather(*(client.post("/v1/systemone", json=b) for b in bodies))
        statuses = [r.status for r in responses]
        assert 429 in statuses and 200 in statuses, statuses
        rejected = next(r for r in responses if r.status == 429)
        assert envelope(await rejected.json()).type == "overloaded"
        assert rejected.headers["Retry-After"] == "1"
        response = await client.post("/v1/systemone", json=GOOD)
        assert response.status == 200


async def test_deadline_gives_504_and_worker_keeps_serving(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        with slow_engine(service.model.engine, 0.5):
            response = await client.post("/v1/systemone", json=dict(GOOD, deadline_s=0.1))
            assert response.status == 504
            assert envelope(await response.json()).type == "deadline_exceeded"
        await asyncio.sleep(0.6)
        response = await client.post("/v1/systemone", json=GOOD)
        assert response.status == 200


async def test_cache_stats_and_reset_counters_only(worker_settings):
    async with worker_client(worker_settings()) as (client, _):
        stats = CacheStats.model_validate(await (await client.get("/v1/cache/stats")).json())
        assert stats.levels["l1"].hits == 0 and stats.levels["l3"].misses == 0  # warmup is not counted
        for _ in range(3):
            await client.post("/v1/systemone", json=GOOD)
        stats = CacheStats.model_validate(await (await client.get("/v1/cache/stats")).json())
        assert stats.levels["l1"].hits == 2 and stats.levels["l1"].misses == 1
        assert stats.levels["l3"].hits == 2 and stats.levels["l3"].resident_bytes > 0
        resident = stats.levels["l3"].resident_bytes
        reset = CacheStats.model_validate(await (await client.post("/v1/cache/reset")).json())
        assert reset.levels["l1"].hits == 0 and reset.levels["l3"].hits == 0
        assert reset.levels["l3"].resident_bytes == resident  # entries stay, only counters reset
        response = await client.post("/v1/systemone", json=GOOD)
        assert response.headers["x-jev-cache"] == "l1=hit,l3=hit"


@pytest.mark.parametrize(
    "cache, header",
    [
        (CacheSettings(False, 1024, 1 << 20, 1 << 20), "l1=off,l3=off"),
        (CacheSettings(True, 0, 1 << 20, 1 << 20), "l1=off,l3=miss"),
        (CacheSettings(True, 1024, 1 << 20, 0), "l1=miss,l3=off"),
    ],
)
async def test_cache_switches(worker_settings, cache, header):
    async with worker_client(worker_settings(cache=cache)) as (client, _):
        response = await client.post("/v1/systemone", json=dict(GOOD, question="A fresh question?"))
        assert response.headers["x-jev-cache"] == header


async def test_l3_byte_budget_evicts(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        one_prefix = next(iter(service.caches.l3._entries.values()))[1]
        service.caches.l3.budget = int(one_prefix * 2.5)
        for i in range(4):
            await client.post("/v1/systemone", json=dict(GOOD, state={"text": f"State number {i}."}))
        stats = service.cache_stats().levels["l3"]
        assert stats.evictions >= 2 and stats.resident_bytes <= service.caches.l3.budget


async def test_metrics_exposition(worker_settings):
    async with worker_client(worker_settings(max_queue=7)) as (client, _):
        await client.post("/v1/systemone", json=GOOD)
        text = await (await client.get("/metrics")).text()
        for name in (
            "jev_worker_decision_seconds_bucket",
            "jev_worker_forward_seconds_count",
            "jev_worker_queue_depth",
            "jev_worker_cache_hits_total",
            "jev_worker_tokens_total",
        ):
            assert name in text, name
        assert sample_value(text, "jev_worker_http_requests_total", route="/v1/systemone", status="200") == 1
        assert sample_value(text, "jev_worker_queue_limit") == 7
        assert sample_value(text, "jev_worker_cache_resident_entries", level="l1") >= 1  # prepared prompts kept
        # every series names the model it serves (per-model rules and dashboards, deploy/prometheus)
        samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
        assert samples and all(s.labels.get("model") == "tiny-llama" for s in samples)
        # the cache index's reachability: nothing answers on the test's Redis port
        assert sample_value(text, "jev_worker_index_up") in (0, 1)
        for _ in range(100):
            text = await (await client.get("/metrics")).text()
            if sample_value(text, "jev_worker_index_up") == 0:
                break
            await asyncio.sleep(0.05)
        assert sample_value(text, "jev_worker_index_up") == 0 and sample_value(text, "jev_worker_index_errors_total")


async def test_resident_prefixes_are_registered_with_their_owner(worker_settings):
    import os
    import uuid

    from jev_common.index.routes import route_owners
    from jev_common.route_key import state_route_key
    from jev_common.schema import DecisionRequest

    redis_url = os.environ.get("JEV_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    worker_id = f"test-{uuid.uuid4().hex[:8]}"
    settings = worker_settings(redis_url=redis_url, worker_id=worker_id, worker_url="http://127.0.0.1:9999")
    async with worker_client(settings) as (client, service):
        body = dict(GOOD, state={"text": f"A state only this test uses: {worker_id}."})
        assert (await client.post("/v1/systemone", json=body)).status == 200
        request = DecisionRequest.model_validate(body)
        key = state_route_key(request.state.text, ())  # the state's route key: its prefix entered L3
        index = service.index_link.index

        async def warm() -> list:
            return await route_owners(index.connection, index.ns, key)

        owners = []
        for _ in range(50):  # registration is fire-and-forget on the event loop
            owners = await warm()
            if owners:
                break
            await asyncio.sleep(0.02)
        assert [(o.worker_id, o.url) for o in owners] == [(worker_id, "http://127.0.0.1:9999")]
        service.caches.l3.clear()  # eviction unregisters
        for _ in range(50):
            if not await warm():
                break
            await asyncio.sleep(0.02)
        assert await warm() == []


async def test_health_while_loading_says_how_far_along(worker_settings):
    """A loading worker's health names its stage (local_stack prints it), not just 'loading'."""
    import asyncio as _asyncio

    from aiohttp.test_utils import TestClient as _Client, TestServer as _Server

    from jev_worker.app import create_app as _create

    async with _Client(_Server(_create(worker_settings()))) as client:
        stages = set()
        for _ in range(400):
            body = await (await client.get("/health")).json()
            if body["detail"]["state"] != "loading":
                break
            if "stage" in body["detail"]:
                stages.add(body["detail"]["stage"])
            await _asyncio.sleep(0.005)
        assert body["detail"]["state"] == "ok" and "stage" not in body["detail"]
        from jev_worker.loading.load_progress import STEPS

        # "step k/n: <step> [detail] (t s in this step)", each a known step (or "starting"); n counts the steps this
        # load runs (a step it skips, such as measuring L3 reuse on a CPU, leaves the count)
        def known(stage: str) -> bool:
            step = rf"step (\d)/(\d): ({'|'.join(map(re.escape, STEPS))})( from \S+)? \(\d+ s in this step\)"
            found = re.fullmatch(step, stage)
            return stage == "starting" or (found is not None and int(found[1]) <= int(found[2]) <= len(STEPS))

        assert stages and all(known(s) for s in stages), stages


async def test_a_worker_told_there_is_no_index_is_healthy(worker_settings):
    """JEV_REDIS_URL=none, as the frontend and the preencoder take it: no index, not a 500 on /health."""
    from .worker_helpers import worker_client

    for url in ("none", "", "OFF"):
        async with worker_client(worker_settings(redis_url=url)) as (client, service):
            response = await client.get("/health")
            assert response.status == 200, await response.text()
            assert service.index_link.index.connection.url == ""
