"""Faults, on loopback with real processes where the fault needs one: a worker killed mid-load,
Redis stopped, a slow worker, over-capacity, and a fuzz pass over the request schema.

Every wait here is bounded by a count of attempts or an overall timeout, and nothing asserts on
how long anything took.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import signal
import string
import sys
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings, strategies as st

from jev_common.schema import KINDS, DecisionResponse, ErrorEnvelope, HealthResponse, SystemOneResponse
from jev_frontend.app import create_app as create_frontend
from jev_frontend.settings import Settings as FrontendSettings
from jev_worker.settings import CacheSettings
from tests.fakes.fake_worker import FakeWorker
from tests.fakes.net import free_port

from .worker_helpers import REQUESTS, STATE, slow_engine, worker_client

REPO = Path(__file__).resolve().parents[2]
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(REPO / "services"), str(REPO)]),
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}
TIMEOUT = aiohttp.ClientTimeout(total=30)
CHOICE = {"kind": "choice", "state": "The light is red.", "question": "What now?", "options": ["stop", "go on"]}


# --- helpers ------------------------------------------------------------------------------------------


def envelope_type(body: bytes) -> str:
    return ErrorEnvelope.model_validate_json(body).type


@contextlib.asynccontextmanager
async def frontend_client(backend_url: str, **overrides):
    app = create_frontend(FrontendSettings(backend_url=backend_url, **overrides))
    async with TestClient(TestServer(app, handler_cancellation=True), timeout=TIMEOUT) as client:
        yield client


async def stop_process(process: asyncio.subprocess.Process, sig: int = signal.SIGTERM) -> int:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            await asyncio.wait_for(process.wait(), 15)
        except TimeoutError:
            process.kill()
            await process.wait()
    return process.returncode


async def start_fake_worker(port: int, *args: str) -> asyncio.subprocess.Process:
    """`python -m tests.fakes.fake_worker` on a fixed port; returns once it prints its URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.fake_worker",
        "--port",
        str(port),
        *args,
        cwd=REPO,
        env=ENV,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode().strip()
    assert line == f"FAKE_WORKER_URL=http://127.0.0.1:{port}", line
    return process


async def start_real_worker(port: int, model_path: str, log: Path) -> asyncio.subprocess.Process:
    env = {
        **ENV,
        "JEV_WORKER_HOST": "127.0.0.1",
        "JEV_WORKER_PORT": str(port),
        "JEV_MODEL_PATH": model_path,
        "JEV_REDIS_URL": "redis://127.0.0.1:1/0",
        "JEV_WORKER_ID": "fault-test",
    }
    with open(log, "ab") as handle:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "jev_worker", cwd=REPO, env=env, stdout=handle, stderr=handle
        )


async def wait_status(
    client,
    path: str,
    want: int = 200,
    attempts: int = 600,
    pause: float = 0.1,
    process: asyncio.subprocess.Process | None = None,
    log: Path | None = None,
) -> None:
    """Poll GET path until it answers `want` (bounded by attempts)."""
    seen = []
    for _ in range(attempts):
        if process is not None and process.returncode is not None:
            pytest.fail(f"process exited with {process.returncode}: {log.read_text()[-2000:] if log else ''}")
        response = await client.get(path)
        seen.append(response.status)
        if response.status == want:
            return
        await asyncio.sleep(pause)
    pytest.fail(f"GET {path} never answered {want}; last statuses {seen[-5:]}")


async def worker_in_flight(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(url + "/metrics") as resp:
        for line in (await resp.text()).splitlines():
            if line.startswith("jev_worker_http_in_flight "):
                return float(line.split()[1]) - 1  # minus this scrape
    return 0.0


# --- worker killed mid-load -------------------------------------------------------------------------


async def test_fake_worker_killed_mid_load_gives_502_then_recovers():
    port = free_port()
    worker = await start_fake_worker(port, "--delay", "5")
    backend = f"http://127.0.0.1:{port}"
    try:
        async with frontend_client(backend, timeout_s=20) as client, aiohttp.ClientSession(timeout=TIMEOUT) as direct:
            in_flight = [
                asyncio.ensure_future(client.post("/v1/systemone", json=dict(CHOICE, request_id=str(i))))
                for i in range(6)
            ]
            for _ in range(300):  # until the worker holds all six (its own in-flight gauge says so)
                if await worker_in_flight(direct, backend) >= 6:
                    break
                await asyncio.sleep(0.05)
            else:
                pytest.fail("the six requests never reached the worker")
            worker.kill()  # SIGKILL: no graceful close, connections drop mid-request
            await worker.wait()
            for response in await asyncio.gather(*in_flight):
                assert response.status == 502
                assert envelope_type(await response.read()) == "backend_unavailable"
            for _ in range(5):  # while it is down: fast 502s, never a hang or a 500
                response = await client.post("/v1/systemone", json=CHOICE)
                assert response.status == 502 and envelope_type(await response.read()) == "backend_unavailable"
            response = await client.get("/health")
            assert response.status == 502 and envelope_type(await response.read()) == "backend_unavailable"

            worker = await start_fake_worker(port)  # back on the same port, no delay
            await wait_status(client, "/health")
            for i in range(10):
                response = await client.post("/v1/systemone", json=dict(CHOICE, request_id=f"after-{i}"))
                assert response.status == 200, await response.text()
                assert DecisionResponse.model_validate_json(await response.read()).request_id == f"after-{i}"
    finally:
        await stop_process(worker)


@pytest.mark.slow
async def test_real_worker_killed_under_load_then_restarted(tiny_text_dir, tmp_path):
    """python -m jev_worker on the tiny checkpoint, killed while clients keep sending through the frontend."""
    port = free_port()
    log = tmp_path / "worker.log"
    worker = await start_real_worker(port, tiny_text_dir, log)
    outcomes: list[tuple[str, int, str | None]] = []  # (phase when sent, status, envelope type)
    phase = "up"
    stop = asyncio.Event()

    async def client_loop(client, n: int) -> None:
        for i in range(n):  # bounded, whatever happens
            if stop.is_set():
                return
            body = dict(REQUESTS["choice"], question=f"Question {i % 7}: is the kettle hot?")
            sent_in = phase
            response = await client.post("/v1/systemone", json=body)
            raw = await response.read()
            outcomes.append((sent_in, response.status, None if response.status == 200 else envelope_type(raw)))
            if response.status != 200:
                await asyncio.sleep(0.02)

    def count(where: str, status: int) -> int:
        return sum(1 for p, s, _ in outcomes if p == where and s == status)

    async def until(predicate, attempts: int = 1500) -> None:
        for _ in range(attempts):
            if predicate():
                return
            await asyncio.sleep(0.02)
        pytest.fail(f"condition not reached; outcomes so far: {outcomes[-10:]}")

    try:
        async with frontend_client(f"http://127.0.0.1:{port}", timeout_s=20) as client:
            await wait_status(client, "/health", attempts=1200, process=worker, log=log)
            clients = [asyncio.ensure_future(client_loop(client, 3000)) for _ in range(3)]
            try:
                await asyncio.wait_for(until(lambda: count("up", 200) >= 10), 120)
                phase = "down"
                worker.kill()
                await worker.wait()
                await asyncio.wait_for(until(lambda: count("down", 502) >= 6), 60)
                worker = await start_real_worker(port, tiny_text_dir, log)
                phase = "restarting"
                await wait_status(client, "/health", attempts=1200, process=worker, log=log)
                phase = "back"
                await asyncio.wait_for(until(lambda: count("back", 200) >= 10), 120)
            finally:
                stop.set()
                await asyncio.gather(*clients)
    finally:
        await stop_process(worker)
    # sent while up: 200, or 502 when still in flight at the kill; sent after health came back: 200 only
    allowed = {
        "up": {(200, None), (502, "backend_unavailable")},
        "down": {(200, None), (502, "backend_unavailable")},
        "restarting": {(502, "backend_unavailable"), (503, "not_ready"), (200, None)},
        "back": {(200, None)},
    }
    for where, status, type_ in outcomes:
        assert (status, type_) in allowed[where], (where, status, type_)
    assert count("down", 502) >= 6 and count("back", 200) >= 10


# --- Redis stopped ----------------------------------------------------------------------------------


async def start_redis(port: int, workdir: Path) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        "redis-server",
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--dir",
        str(workdir),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    for _ in range(200):
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"PING\r\n")
            await writer.drain()
            answer = await asyncio.wait_for(reader.readline(), 2)
            writer.close()
            if answer.startswith(b"+PONG"):
                return process
        except (TimeoutError, OSError):
            pass
        assert process.returncode is None, "redis-server exited at start"
        await asyncio.sleep(0.05)
    await stop_process(process)
    pytest.fail(f"redis-server on port {port} never answered PING")


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
async def test_redis_stopped_worker_keeps_answering_and_reports_degraded_index(worker_settings, tmp_path):
    pytest.importorskip("jev_common.index")
    port = free_port()
    redis = await start_redis(port, tmp_path)
    try:
        settings = worker_settings(redis_url=f"redis://127.0.0.1:{port}/0")
        async with worker_client(settings) as (client, service):
            health = HealthResponse.model_validate(await (await client.get("/health")).json())
            assert health.status == "ok" and health.detail["index"]["status"] == "ok", health
            response = await client.post("/v1/systemone", json=REQUESTS["choice"])
            assert response.status == 200

            redis.kill()
            await redis.wait()
            response = await client.get("/health")
            health = HealthResponse.model_validate(await response.json())
            assert response.status == 200  # still serving: degraded, not down
            assert health.status == "degraded" and health.detail["index"]["status"] == "degraded"
            assert health.detail["index"]["reason"]
            for i, kind in enumerate(REQUESTS):  # new states: L3 misses, so the worker tries the index
                body = copy.deepcopy(REQUESTS[kind])
                body["state"]["text"] = f"{STATE} (variant {i} after Redis died)"
                response = await client.post("/v1/systemone", json=body)
                assert response.status == 200, await response.text()
                DecisionResponse.model_validate_json(await response.read())

            redis = await start_redis(port, tmp_path)  # back: health says ok again
            for _ in range(100):
                health = HealthResponse.model_validate(await (await client.get("/health")).json())
                if health.status == "ok":
                    break
                await asyncio.sleep(0.1)
            assert health.status == "ok" and health.detail["index"]["status"] == "ok", health
    finally:
        await stop_process(redis)


# --- slow worker ------------------------------------------------------------------------------------


async def test_slow_worker_process_gives_504_at_the_frontend_deadline_then_serves(tmp_path):
    port = free_port()
    worker = await start_fake_worker(port, "--delay", "30")
    front_port = free_port()
    log = tmp_path / "frontend.log"
    with open(log, "wb") as handle:
        frontend = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "jev_frontend",
            cwd=REPO,
            stdout=handle,
            stderr=handle,
            env={
                **ENV,
                "JEV_FRONTEND_HOST": "127.0.0.1",
                "JEV_FRONTEND_PORT": str(front_port),
                "JEV_BACKEND_URL": f"http://127.0.0.1:{port}",
                "JEV_FRONTEND_TIMEOUT_S": "0.5",
            },
        )
    base = f"http://127.0.0.1:{front_port}"
    try:
        async with aiohttp.ClientSession(base_url=base, timeout=TIMEOUT) as session:
            for _ in range(600):
                assert frontend.returncode is None, log.read_text()[-2000:]
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get("/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)

            async def post(body):
                async with session.post("/v1/systemone", json=body) as resp:
                    return resp.status, await resp.read()

            answers = await asyncio.gather(*(post(dict(CHOICE, request_id=str(i))) for i in range(4)))
            for status, raw in answers:
                assert status == 504 and envelope_type(raw) == "backend_timeout"
                assert "within 0.5s" in ErrorEnvelope.model_validate_json(raw).message
            # a request's own deadline_s shortens the wait (plus the frontend's grace)
            status, raw = await post(dict(CHOICE, deadline_s=0.1))
            assert status == 504 and envelope_type(raw) == "backend_timeout"
            assert "deadline_s" in ErrorEnvelope.model_validate_json(raw).message
            # the worker speeds up: the same frontend serves again (timeouts left nothing stuck)
            async with (
                aiohttp.ClientSession(timeout=TIMEOUT) as direct,
                direct.post(f"http://127.0.0.1:{port}/fake/config", json={"delay_s": 0}) as resp,
            ):
                assert resp.status == 200
            for i in range(5):
                status, raw = await post(dict(CHOICE, request_id=f"fast-{i}"))
                assert status == 200, raw
        assert await stop_process(frontend) == 0, log.read_text()[-2000:]
    finally:
        await stop_process(frontend)
        await stop_process(worker)


async def test_slow_real_worker_deadline_passes_through_the_frontend(worker_settings):
    async with worker_client(worker_settings()) as (worker, service):
        async with frontend_client(str(worker.make_url("")).rstrip("/"), timeout_s=10) as client:
            with slow_engine(service.model.engine, 1.0):
                response = await client.post("/v1/systemone", json=dict(REQUESTS["choice"], deadline_s=0.2))
                assert response.status == 504
                # the worker's own deadline answer, or the frontend's if it came first: never a 500
                assert envelope_type(await response.read()) in ("deadline_exceeded", "backend_timeout")
            await wait_status(client, "/health", attempts=100)
            response = await client.post("/v1/systemone", json=REQUESTS["choice"])
            assert response.status == 200


async def test_a_client_leaving_the_frontend_stops_the_workers_forward(worker_settings):
    """The frontend's handler is cancelled on disconnect, which closes its call to the worker, whose handler is
    cancelled in turn: the forward stops at its next layer instead of running for nobody."""
    from .test_scheduler import abandoned, ask, leave_after, slow_layers, until

    async with worker_client(worker_settings()) as (worker, service):
        async with frontend_client(str(worker.make_url("")).rstrip("/"), timeout_s=30) as client:
            with slow_layers(service, 0.5):
                await leave_after(client, ask(), 0.3)
                await until(lambda: abandoned(service) == 1)
                await until(lambda: service.model.scheduler.depth == 0)
            assert (await client.post("/v1/systemone", json=ask(1))).status == 200


async def test_the_frontend_names_the_client_and_passes_the_deadline(worker_settings):
    """x-jev-client is the frontend's to set (a caller cannot pick another client's fairness share), and the
    caller's x-jev-deadline-s reaches the worker."""
    from .test_scheduler import ask

    async with worker_client(worker_settings()) as (worker, service):
        seen = []
        original = service.model.scheduler.submit

        async def spy(item, timeout_s, caller):
            seen.append((caller, timeout_s))
            return await original(item, timeout_s, caller)

        service.model.scheduler.submit = spy
        async with frontend_client(str(worker.make_url("")).rstrip("/"), timeout_s=30) as client:
            response = await client.post(
                "/v1/systemone", json=ask(), headers={"x-jev-client": "someone-else", "x-jev-deadline-s": "7"}
            )
            assert response.status == 200
        caller, timeout_s = seen[0]
        assert caller.client.startswith("addr:127.0.0.1") and 6 < timeout_s <= 7


# --- over capacity ----------------------------------------------------------------------------------


async def test_over_capacity_through_the_frontend_is_429_or_503_and_worker_stays_healthy(worker_settings):
    async with worker_client(worker_settings(max_queue=2, batching=False)) as (worker, service):
        async with frontend_client(str(worker.make_url("")).rstrip("/"), timeout_s=20, max_connections=8) as client:
            with slow_engine(service.model.engine, 0.05):
                bodies = [dict(copy.deepcopy(REQUESTS["choice"]), question=f"Variant {i}?") for i in range(24)]
                responses = await asyncio.gather(*(client.post("/v1/systemone", json=b) for b in bodies))
                statuses = [r.status for r in responses]
                assert set(statuses) <= {200, 429, 503}, statuses
                assert 200 in statuses and ({429, 503} & set(statuses)), statuses
                for response in responses:
                    raw = await response.read()
                    if response.status == 200:
                        DecisionResponse.model_validate_json(raw)
                    else:
                        assert envelope_type(raw) in ("overloaded", "queue_full")
                        if response.status == 429:
                            assert response.headers["Retry-After"] == "1"
            response = await client.get("/health")
            assert response.status == 200
            assert HealthResponse.model_validate(await response.json()).detail["state"] == "ok"
            assert service.model.scheduler.depth == 0
            for body in bodies[:3]:
                response = await client.post("/v1/systemone", json=body)
                assert response.status == 200


# --- fuzzing the request schema ---------------------------------------------------------------------

_text = st.text(max_size=40)
_scalar = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | _text
_json = st.recursive(
    _scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=12
)
_word = st.text(alphabet=string.ascii_letters + string.digits + " .,?!-'éß中🙂\n\t", min_size=1, max_size=30)


@st.composite
def _valid(draw) -> dict:
    kind = draw(st.sampled_from(KINDS))
    text = draw(st.text(min_size=1, max_size=120).filter(lambda t: t.strip()))
    if kind == "score":
        options = draw(
            st.lists(
                st.integers(-5, 100).map(str) | st.floats(-1e6, 1e6, allow_nan=False).map(repr),
                min_size=2,
                max_size=8,
                unique=True,
            )
        )
    elif kind == "span":
        text = draw(
            st.text(alphabet=string.ascii_lowercase + " ", min_size=12, max_size=80).filter(
                lambda t: len(set(t.split())) >= 2
            )
        )
        options = sorted(set(text.split()))[: draw(st.integers(2, 6))]
    else:
        options = draw(
            st.lists(_word.filter(lambda o: o.strip()), min_size=2, max_size=draw(st.integers(2, 26)), unique=True)
        )
    body = {
        "kind": kind,
        "state": draw(st.sampled_from([{"text": text}, text])),
        "question": draw(_word.filter(lambda q: q.strip())),
        "options": options,
    }
    if draw(st.booleans()):
        body["request_id"] = draw(st.text(max_size=220))
    if draw(st.booleans()):
        body["deadline_s"] = draw(st.floats(0.5, 600) | st.integers(-1, 700) | st.floats())
    return body


@st.composite
def _mutated(draw) -> object:
    body = draw(_valid())
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["drop", "replace", "add", "kind", "options", "state"]))
        if action == "drop" and body:
            body.pop(draw(st.sampled_from(sorted(body))))
        elif action == "replace" and body:
            body[draw(st.sampled_from(sorted(body)))] = draw(_json)
        elif action == "add":
            body[draw(_text)] = draw(_json)
        elif action == "kind":
            body["kind"] = draw(st.sampled_from([*KINDS, "rank", "", "CHOICE", None, 3]))
        elif action == "options":
            body["options"] = draw(st.lists(_text | _json, max_size=30))
        elif action == "state":
            body["state"] = draw(
                st.sampled_from(
                    [
                        {},
                        {"text": ""},
                        {"text": "   "},
                        {"image": "https://example.com/x.png"},
                        {"image": "data:image/png;base64,iVBORw0KGgo="},
                        {"text": "ok", "image": 5},
                        {"text": "ok", "extra": 1},
                        [],
                        "",
                        None,
                    ]
                )
            )
    return body


def _encode(value: object) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


BODIES = st.one_of(
    _valid().map(_encode),
    _mutated().map(_encode),
    _json.map(_encode),
    st.binary(max_size=120),
    st.text(max_size=120).map(lambda t: t.encode("utf-8", "surrogatepass")),
)


def _check_answer(status: int, raw: bytes) -> None:
    assert status != 500, raw
    if status == 200:
        if b'"answers"' in raw:
            assert SystemOneResponse.model_validate_json(raw).answers
        else:
            answer = DecisionResponse.model_validate_json(raw)
            assert len(answer.probabilities) >= 2
    else:
        assert 400 <= status < 600, status
        ErrorEnvelope.model_validate_json(raw)  # always the envelope


def _fuzz(post) -> Counter:
    """Run the fuzz pass; returns the count of answers by status."""
    seen: Counter = Counter()

    @settings(
        max_examples=150,
        deadline=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
    )
    @given(raw=BODIES)
    def check(raw: bytes) -> None:
        status, answer = post(raw)
        seen[status] += 1
        _check_answer(status, answer)

    check()
    return seen


async def _post_raw(client, raw: bytes) -> tuple[int, bytes]:
    response = await client.post("/v1/systemone", data=raw, headers={"Content-Type": "application/json"})
    return response.status, await response.read()


def test_fuzz_frontend_with_fake_worker():
    loop = asyncio.new_event_loop()
    fake = FakeWorker()
    stack = contextlib.AsyncExitStack()
    try:
        url = loop.run_until_complete(stack.enter_async_context(fake))
        client = loop.run_until_complete(stack.enter_async_context(frontend_client(url, timeout_s=10)))
        seen = _fuzz(lambda raw: loop.run_until_complete(_post_raw(client, raw)))
        print("frontend fuzz statuses", dict(seen))
        assert seen[200] > 0 and seen[422] > 0, seen  # the pass covered both sides
        assert fake.received > 0  # valid bodies did reach the worker
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()


def test_fuzz_real_worker_on_tiny_checkpoint(worker_settings):
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    cache = CacheSettings(True, 256, 1 << 20, 16 << 20)
    try:
        client, service = loop.run_until_complete(
            stack.enter_async_context(worker_client(worker_settings(cache=cache, max_body_bytes=1 << 20)))
        )
        seen = _fuzz(lambda raw: loop.run_until_complete(_post_raw(client, raw)))
        print("worker fuzz statuses", dict(seen))
        assert seen[200] > 0 and seen[422] > 0, seen
        stats = service.cache_stats().levels["l1"]
        assert stats.hits + stats.misses > 0  # some bodies were valid and decided
        assert service.state == "ok"
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()
