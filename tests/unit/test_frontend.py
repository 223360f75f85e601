"""The frontend against the fake worker (and a scripted backend) on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from jev_common.schema import DecisionResponse, ErrorEnvelope
from jev_frontend.app import BACKEND, create_app
from jev_frontend.settings import Settings
from tests.fakes.fake_worker import FakeWorker
from tests.fakes.net import closed_port, free_port

REPO = Path(__file__).resolve().parents[2]
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)

CHOICE = {"kind": "choice", "state": "The light is red.", "question": "What now?", "options": ["stop", "go on"]}


@contextlib.asynccontextmanager
async def frontend(backend_url: str, **settings):
    app = create_app(Settings(backend_url=backend_url, **settings))
    async with TestClient(TestServer(app), timeout=CLIENT_TIMEOUT) as client:
        yield client


@pytest.fixture
async def fake():
    worker = FakeWorker()
    async with worker:
        yield worker


def envelope(body: bytes) -> ErrorEnvelope:
    return ErrorEnvelope.model_validate_json(body)


class ScriptedBackend:
    """A backend that records the raw bytes it gets and answers exactly what it is told. The frontend's own
    start-up look at its `GET /v1/models` (to name the model in its log) is counted apart, in `lookups`."""

    def __init__(self, status=200, body=b'{"ok":  true}\n', headers=()):
        self.status, self.body, self.headers = status, body, list(headers)
        self.received: list[tuple[bytes, dict]] = []
        self.delay_s = 0.0
        self.in_flight = self.max_in_flight = 0
        self.lookups = 0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if request.method == "GET" and request.path == "/v1/models":
                self.lookups += 1
            else:
                self.received.append((await request.read(), dict(request.headers)))
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            response = web.Response(status=self.status, body=self.body)
            for name, value in self.headers:
                response.headers.add(name, value)
            return response
        finally:
            self.in_flight -= 1

    @contextlib.asynccontextmanager
    async def serve(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        server = TestServer(app)
        await server.start_server()
        try:
            yield str(server.make_url("")).rstrip("/")
        finally:
            await server.close()


# --- pass-through -----------------------------------------------------------------------------------


async def test_forwards_original_bytes_and_passes_answer_through_unchanged():
    backend = ScriptedBackend(
        status=200,
        body=b'{"kind":"choice",   "weird": [1,2]}\n',
        headers=[
            ("Content-Type", "application/json"),
            ("x-jev-cache", "l1=hit,l3=miss"),
            ("X-Jev-Trace", "a"),
            ("X-Jev-Trace", "b"),
            ("x-other", "dropped"),
        ],
    )
    raw = b'{ "options": ["stop", "go on"],\n "question": "What now?", "kind": "choice", "state": "The light is red." }'
    async with backend.serve() as url, frontend(url) as client:
        resp = await client.post(
            "/v1/systemone",
            data=raw,
            headers={
                "Content-Type": "application/json",
                "x-jev-trace-id": "t1",
                "x-jev-client": "spoofed",
                "X-TypeSafe-Retry-Count": "1",
            },
        )
        body = await resp.read()
        assert resp.status == 200
        assert body == backend.body
        assert resp.headers["Content-Type"] == "application/json"
        assert resp.headers["x-jev-cache"] == "l1=hit,l3=miss"
        assert resp.headers.getall("x-jev-trace") == ["a", "b"]
        assert "x-other" not in resp.headers
    assert len(backend.received) == 1
    forwarded, headers = backend.received[0]
    assert forwarded == raw  # the original bytes, not a re-serialisation
    assert headers["x-jev-trace-id"] == "t1"  # x-jev-* pass through ...
    assert headers["x-jev-client"].startswith("addr:127.0.0.1")  # ... but the fairness key is the frontend's
    assert headers["X-TypeSafe-Retry-Count"] == "1"  # the SDK's retry headers too (a retry joins its work)


async def test_every_backend_call_carries_the_internal_token_and_never_the_callers():
    backend = ScriptedBackend()
    async with backend.serve() as url, frontend(url, internal_tokens=("t-new", "t-old")) as client:
        await client.post("/v1/systemone", json=CHOICE, headers={"x-jev-internal-token": "guessed"})
        await client.get("/v1/models")
        await client.get("/health")
    assert backend.lookups >= 1
    sent = [headers for _body, headers in backend.received]
    assert len(sent) >= 2 and all(h.get("x-jev-internal-token") == "t-new" for h in sent), sent
    async with backend.serve() as url, frontend(url) as client:  # no token here: nothing of the caller's passes
        await client.post("/v1/systemone", json=CHOICE, headers={"x-jev-internal-token": "guessed"})
    assert "x-jev-internal-token" not in backend.received[-1][1]


async def test_the_frontends_own_time_is_observed_apart_from_the_backends():
    backend = ScriptedBackend()
    backend.delay_s = 0.3
    async with backend.serve() as url, frontend(url) as client:
        response = await client.post("/v1/systemone", json=CHOICE)
        assert response.status == 200
        metrics = client.app[BACKEND].metrics
        overhead = metrics.overhead.collect()[0].samples
        count = next(s.value for s in overhead if s.name.endswith("_count"))
        total = next(s.value for s in overhead if s.name.endswith("_sum"))
    assert count == 1 and 0 < total < 0.3  # the 0.3 s the backend took is not the frontend's


async def test_decision_from_fake_worker_with_cache_header(fake):
    async with frontend(fake.url) as client:
        first = await client.post("/v1/systemone", json={**CHOICE, "request_id": "r1"})
        first_body = await first.read()
        second = await client.post("/v1/systemone", json={**CHOICE, "request_id": "r1"})
        second_body = await second.read()
    assert first.status == second.status == 200
    assert first.headers["x-jev-cache"] == "l1=miss"
    assert second.headers["x-jev-cache"] == "l1=hit"
    assert first.headers["x-jev-worker"] == "fake-0"
    one, two = DecisionResponse.model_validate_json(first_body), DecisionResponse.model_validate_json(second_body)
    assert one.request_id == "r1" and one.choice in CHOICE["options"]
    assert one.probabilities == two.probabilities
    assert one.usage.cached_tokens == 0 and two.usage.cached_tokens == two.usage.prompt_tokens > 0
    assert len(fake.requests) == 2


@pytest.mark.parametrize("status, type_", [(429, "overloaded"), (503, "unavailable"), (400, "bad_request")])
async def test_worker_errors_pass_through(fake, status, type_):
    fake.error_status = status
    async with frontend(fake.url) as client:
        resp = await client.post("/v1/systemone", json=CHOICE)
        body = await resp.read()
    assert resp.status == status
    assert envelope(body).type == type_
    assert "configured to answer" in envelope(body).message  # the worker's own envelope
    assert resp.headers["x-jev-worker"] == "fake-0"


async def test_retry_after_passes_through():
    backend = ScriptedBackend(
        status=429,
        body=b'{"detail": {"error_type": "overloaded", "message": "busy"}}',
        headers=[("Retry-After", "2"), ("x-jev-queue", "64")],
    )
    async with backend.serve() as url, frontend(url) as client:
        resp = await client.post("/v1/systemone", json=CHOICE)
        assert resp.status == 429
        assert await resp.read() == backend.body
        assert resp.headers["Retry-After"] == "2" and resp.headers["x-jev-queue"] == "64"


# --- health -----------------------------------------------------------------------------------------


async def test_health_healthy_passes_worker_body(fake):
    async with frontend(fake.url) as client:
        resp = await client.get("/health")
        body = await resp.json()
    async with aiohttp.ClientSession() as session, session.get(fake.url + "/health") as direct:
        assert body == await direct.json()  # unchanged: the upstream contract compares the two
    assert resp.status == 200
    assert body["status"] == "ok" and body["detail"]["fake"] is True


async def test_health_unhealthy_passes_worker_status(fake):
    fake.healthy = False
    async with frontend(fake.url) as client:
        resp = await client.get("/health")
        body = await resp.read()
    assert resp.status == 503
    assert envelope(body).type == "not_ready"


async def test_health_worker_down_is_502():
    with closed_port() as port:
        url = f"http://127.0.0.1:{port}"
        async with frontend(url) as client:
            resp = await client.get("/health")
            error = envelope(await resp.read())
    assert resp.status == 502
    assert error.type == "backend_unavailable" and url in error.message


async def test_health_slow_worker_is_504(fake):
    fake.health_delay_s = 3
    async with frontend(fake.url, timeout_s=0.3) as client:
        resp = await client.get("/health")
        error = envelope(await resp.read())
    assert resp.status == 504
    assert error.type == "backend_timeout" and fake.url in error.message


# --- routes -----------------------------------------------------------------------------------------


async def test_unknown_route_is_404_envelope(fake):
    async with frontend(fake.url) as client:
        resp = await client.get("/no/such/thing")
        error = envelope(await resp.read())
    assert resp.status == 404 and error.type == "not_found"


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/v1/chat/completions"),
        ("GET", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/generate"),
    ],
)
async def test_generation_routes_are_not_proxied(fake, method, path):
    async with frontend(fake.url) as client:
        resp = await client.request(method, path, json={"model": "x", "messages": [], "prompt": "hi"})
        error = envelope(await resp.read())
    assert resp.status == 404 and error.type == "not_found"
    assert "only" in error.message and "/v1/systemone" in error.message
    assert fake.received == 0


async def test_wrong_method_is_405_envelope(fake):
    async with frontend(fake.url) as client:
        get = await client.get("/v1/systemone")
        get_error = envelope(await get.read())
        post = await client.post("/health")
        post_error = envelope(await post.read())
    assert get.status == 405 and get_error.type == "method_not_allowed"
    assert post.status == 405 and post_error.type == "method_not_allowed"


# --- backend failures -------------------------------------------------------------------------------


async def test_worker_down_is_502_naming_the_backend():
    with closed_port() as port:
        url = f"http://127.0.0.1:{port}"
        async with frontend(url) as client:
            resp = await client.post("/v1/systemone", json=CHOICE)
            error = envelope(await resp.read())
            metrics = await (await client.get("/metrics")).text()
    assert resp.status == 502
    assert error.type == "backend_unavailable" and url in error.message
    assert 'jev_frontend_backend_errors_total{endpoint="systemone",type="backend_unavailable"} 1.0' in metrics


async def test_slow_worker_is_504(fake):
    fake.delay_s = 3
    async with frontend(fake.url, timeout_s=0.3) as client:
        resp = await client.post("/v1/systemone", json=CHOICE)
        error = envelope(await resp.read())
        metrics = await (await client.get("/metrics")).text()
    assert resp.status == 504
    assert error.type == "backend_timeout" and fake.url in error.message and "0.3s" in error.message
    assert 'jev_frontend_backend_errors_total{endpoint="systemone",type="backend_timeout"} 1.0' in metrics


async def test_request_deadline_shortens_the_backend_timeout(fake):
    fake.delay_s = 3
    async with frontend(fake.url, timeout_s=15) as client:
        resp = await client.post("/v1/systemone", json={**CHOICE, "deadline_s": 0.3})
        error = envelope(await resp.read())
    assert resp.status == 504
    assert error.type == "backend_timeout" and "deadline_s" in error.message


async def test_connection_pool_is_bounded():
    backend = ScriptedBackend()
    backend.delay_s = 0.05
    async with backend.serve() as url, frontend(url, max_connections=2) as client:
        answers = await asyncio.gather(*(client.post("/v1/systemone", json=CHOICE) for _ in range(12)))
        assert [a.status for a in answers] == [200] * 12
    assert len(backend.received) == 12
    assert backend.max_in_flight <= 2


async def test_client_session_closed_on_shutdown(fake):
    async with frontend(fake.url) as client:
        backend = client.app[BACKEND]
        session = backend.session
        assert (await client.get("/health")).status == 200
    assert session.closed
    assert backend._session is None


# --- validation at the edge -------------------------------------------------------------------------


async def test_oversize_body_is_413(fake):
    big = json.dumps({**CHOICE, "question": "x" * 4096}).encode()
    async with frontend(fake.url, max_body_bytes=1024) as client:
        sized = await client.post("/v1/systemone", data=big, headers={"Content-Type": "application/json"})
        sized_error = envelope(await sized.read())

        async def chunks():
            for start in range(0, len(big), 500):
                yield big[start : start + 500]

        chunked = await client.post("/v1/systemone", data=chunks(), headers={"Content-Type": "application/json"})
        chunked_error = envelope(await chunked.read())
        small = await client.post("/v1/systemone", json=CHOICE)
    assert sized.status == 413 and sized_error.type == "body_too_large"
    assert chunked.status == 413 and chunked_error.type == "body_too_large"
    assert small.status == 200
    assert fake.received == len(fake.requests) == 1


@pytest.mark.parametrize("raw", [b'{"kind": "choice", ', b"not json", b"\xff\xfe\x00garbage", b""])
async def test_malformed_json_is_422_like_fastapi(fake, raw):
    async with frontend(fake.url) as client:
        resp = await client.post("/v1/systemone", data=raw, headers={"Content-Type": "application/json"})
        error = envelope(await resp.read())
    assert resp.status == 422 and error.type == "validation_error" and "JSON" in error.message
    assert fake.received == 0


@pytest.mark.parametrize(
    "payload",
    [
        {**CHOICE, "options": "stop"},  # wrong type
        {**CHOICE, "question": 7},  # wrong type
        {**CHOICE, "deadline_s": "soon"},  # wrong type
        {**CHOICE, "options": []},  # empty options
        {**CHOICE, "options": ["stop", "stop"]},  # duplicate options
        {**CHOICE, "kind": "generate"},  # unknown kind
        {**CHOICE, "surprise": 1},  # unknown field
        ["not", "an", "object"],
    ],
    ids=[
        "options-str",
        "question-int",
        "deadline-str",
        "empty-options",
        "duplicate-options",
        "unknown-kind",
        "extra-field",
        "array",
    ],
)
async def test_invalid_request_is_422_and_never_forwarded(fake, payload):
    async with frontend(fake.url) as client:
        resp = await client.post("/v1/systemone", json=payload)
        error = envelope(await resp.read())
    assert resp.status == 422 and error.type == "validation_error"
    assert fake.received == 0


# --- metrics ----------------------------------------------------------------------------------------


async def test_metrics_own_counters_and_worker_appended(fake):
    async with frontend(fake.url) as client:
        assert (await client.post("/v1/systemone", json=CHOICE)).status == 200
        assert (await client.get("/nope")).status == 404
        resp = await client.get("/metrics")
        text = await resp.text()
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
    assert 'jev_frontend_http_requests_total{route="/v1/systemone",status="200"} 1.0' in text
    assert 'jev_frontend_http_requests_total{route="unmatched",status="404"} 1.0' in text
    assert 'jev_frontend_backend_request_seconds_count{endpoint="systemone"} 1.0' in text
    assert "jev_frontend_backend_up 1.0" in text
    assert 'jev_worker_decisions_total{kind="choice"} 1.0' in text
    assert text.index("jev_frontend_backend_up") < text.index("jev_worker_decisions_total")
    names = [family.name for family in text_string_to_metric_families(text)]
    assert len(names) == len(set(names))  # one valid exposition, no clashing families
    assert any(n.startswith("jev_worker_") for n in names) and any(n.startswith("jev_frontend_") for n in names)


async def test_metrics_without_worker_is_own_only_with_backend_down():
    with closed_port() as port:
        async with frontend(f"http://127.0.0.1:{port}") as client:
            resp = await client.get("/metrics")
            text = await resp.text()
    assert resp.status == 200
    assert "jev_frontend_backend_up 0.0" in text
    assert 'jev_frontend_backend_errors_total{endpoint="metrics",type="backend_unavailable"} 1.0' in text
    assert "jev_worker_" not in text
    list(text_string_to_metric_families(text))  # still a valid exposition


# --- settings ---------------------------------------------------------------------------------------


def test_settings_from_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("JEV_FRONTEND_", "JEV_ROUTING")) or name in (
            "JEV_BACKEND_URL",
            "JEV_BACKENDS",
            "JEV_DEFAULT_MODEL",
            "JEV_REDIS_URL",
        ):
            monkeypatch.delenv(name)
    assert Settings.from_env() == Settings()
    assert Settings().max_body_bytes == 16 << 20 and Settings().port == 8080
    monkeypatch.setenv("JEV_FRONTEND_HOST", "127.0.0.1")
    monkeypatch.setenv("JEV_FRONTEND_PORT", "9090")
    monkeypatch.setenv("JEV_BACKEND_URL", "http://worker:8000/")
    monkeypatch.setenv("JEV_FRONTEND_TIMEOUT_S", "2.5")
    monkeypatch.setenv("JEV_FRONTEND_MAX_BODY_BYTES", "1K")
    monkeypatch.setenv("JEV_FRONTEND_MAX_CONNECTIONS", "3")
    assert Settings.from_env() == Settings("127.0.0.1", 9090, "http://worker:8000", 2.5, 1024, 3)


@pytest.mark.parametrize(
    "name, value",
    [
        ("JEV_BACKEND_URL", "worker:8000"),
        ("JEV_FRONTEND_TIMEOUT_S", "0"),
        ("JEV_FRONTEND_MAX_CONNECTIONS", "0"),
        ("JEV_FRONTEND_PORT", "eighty"),
    ],
)
def test_settings_reject_bad_values(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name):
        Settings.from_env()


# --- as a process -----------------------------------------------------------------------------------


async def _stop(proc: asyncio.subprocess.Process) -> int:
    if proc.returncode is None:
        proc.terminate()
        try:
            return await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise
    return proc.returncode


async def test_python_m_jev_frontend_serves_health(tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'services'}{os.pathsep}{REPO}"}
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.fakes.fake_worker",
        "--port",
        "0",
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    frontend_proc = None
    log = tmp_path / "frontend.log"
    try:
        line = (await asyncio.wait_for(worker.stdout.readline(), 30)).decode().strip()
        assert line.startswith("FAKE_WORKER_URL=http://127.0.0.1:"), line
        port = free_port()
        with open(log, "wb") as log_file:
            frontend_proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "jev_frontend",
                cwd=REPO,
                stdout=log_file,
                stderr=log_file,
                env={
                    **env,
                    "JEV_FRONTEND_HOST": "127.0.0.1",
                    "JEV_FRONTEND_PORT": str(port),
                    "JEV_BACKEND_URL": line.split("=", 1)[1],
                },
            )
        base = f"http://127.0.0.1:{port}"
        status = None
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            for _ in range(300):  # up to ~30 s for the interpreter to start
                assert frontend_proc.returncode is None, log.read_text()
                try:
                    async with session.get(base + "/health") as resp:
                        status = resp.status
                        break
                except aiohttp.ClientError:
                    await asyncio.sleep(0.1)
            assert status == 200, log.read_text()
            async with session.post(base + "/v1/systemone", json=CHOICE) as resp:
                assert resp.status == 200 and resp.headers["x-jev-cache"] == "l1=miss"
        assert await _stop(frontend_proc) == 0, log.read_text()  # SIGTERM: a clean stop
        assert '"logger": "jev_frontend"' in log.read_text()  # JSON logs via setup_logging
    finally:
        if frontend_proc is not None:
            with contextlib.suppress(Exception):
                await _stop(frontend_proc)
        await _stop(worker)


async def test_start_up_log_names_the_single_backends_model(fake, caplog):
    """JEV_BACKEND_URL alone (the cpu profile): the frontend polls nothing, yet its start-up line names the model
    the worker serves (its /v1/models), not `(its model not known yet)`."""
    caplog.set_level("INFO", logger="jev_frontend")
    async with frontend(fake.url) as client:
        assert (await client.get("/health")).status == 200
    line = next(r.getMessage() for r in caplog.records if "frontend proxying to" in r.getMessage())
    assert f"fake-worker at {fake.url}" in line, line
