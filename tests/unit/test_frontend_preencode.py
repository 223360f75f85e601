"""`POST /v1/preencode` behind the one public edge: the frontend checks the caller's key, streams the body to the
preencoder within its cap with the internal token, and passes the answer back; the preencoder refuses callers
without the token."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from jev_common.assets import asset_key, asset_state
from jev_common.internal_auth import INTERNAL_TOKEN_HEADER
from jev_frontend.app import create_app
from jev_frontend.settings import Settings
from jev_preencoder.service import build_app
from jev_preencoder.settings import PreencoderSettings
from tests.fakes.fake_worker import FakeWorker
from tests.fakes.net import closed_port

from .vl_helpers import png_uri, request_line, tiny_encoder, tiny_vl_checkpoint

KEY, TOKEN = "k-caller", "t-internal"
TIMEOUT = aiohttp.ClientTimeout(total=30)


@contextlib.asynccontextmanager
async def serve(app: web.Application):
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def frontend(preencoder_url: str, **settings):
    async with FakeWorker() as worker_url:
        app = create_app(Settings(backend_url=worker_url, preencoder_url=preencoder_url, **settings))
        async with TestClient(TestServer(app), timeout=TIMEOUT) as client:
            yield client


class Recorder:
    """A preencoder stand-in: records what reached it (headers, the body as it arrived) and answers 200."""

    def __init__(self):
        self.headers: list[dict] = []
        self.bodies: list[bytes] = []
        self.first_chunk = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            self.first_chunk.set()
        self.bodies.append(bytes(body))
        return web.json_response({"results": [], "summary": {}, "received": len(body)})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/preencode", self.handle)
        return app


async def test_keys_checked_at_the_frontend_and_the_preencoder_takes_only_the_token(tmp_path):
    settings = PreencoderSettings(
        model_path=tiny_vl_checkpoint(),
        device="cpu",
        dtype="float32",
        asset_dir=str(tmp_path),
        redis_url="none",
        internal_tokens=(TOKEN,),
    )
    async with serve(build_app(settings, encoder=tiny_encoder())) as preencoder_url:
        async with frontend(preencoder_url, api_keys=(KEY,), internal_tokens=(TOKEN,)) as client:
            uri = png_uri(61)
            line = [request_line(uri)]
            assert (await client.post("/v1/preencode", json=line)).status == 403  # no key
            assert (
                await client.post("/v1/preencode", json=line, headers={"Authorization": "Bearer nope"})
            ).status == 401
            response = await client.post("/v1/preencode", json=line, headers={"Authorization": f"Bearer {KEY}"})
            assert response.status == 200, await response.text()
            data = await response.json()
            assert [r["status"] for r in data["results"]] == ["done"]
            assert asset_state(tmp_path, asset_key(uri)) == "complete"
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:  # the preencoder reached directly
            async with session.post(preencoder_url + "/v1/preencode", json=line) as direct:
                assert direct.status == 403 and (await direct.json())["detail"]["error_type"] == "authentication_error"
            async with session.post(
                preencoder_url + "/v1/preencode", json=line, headers={INTERNAL_TOKEN_HEADER: "guess"}
            ) as wrong:
                assert wrong.status == 401
            async with session.get(preencoder_url + "/health") as health:  # probes stay open
                assert health.status == 200


async def test_the_body_streams_through_decompressed_with_the_token_and_never_the_callers_credentials():
    recorder = Recorder()
    async with serve(recorder.app()) as url, frontend(url, api_keys=(KEY,), internal_tokens=(TOKEN,)) as client:
        released = asyncio.Event()

        async def body():
            yield b'[{"image": "data:image/png;base64,AAAA"}'
            # the preencoder must see the first chunk while the caller still sends: a frontend that buffered the
            # whole body first would wait here forever
            await asyncio.wait_for(recorder.first_chunk.wait(), 10)
            released.set()
            yield b", " + json.dumps({"image": "x" * 100_000}).encode() + b"]"

        response = await client.post(
            "/v1/preencode",
            data=body(),
            headers={"Authorization": f"Bearer {KEY}", INTERNAL_TOKEN_HEADER: "forged", "x-jev-deadline-s": "20"},
        )
        assert response.status == 200 and released.is_set()
        compressed = gzip.compress(b'{"image": "data:image/png;base64,BBBB"}')
        response = await client.post(
            "/v1/preencode",
            data=compressed,
            headers={"Authorization": f"Bearer {KEY}", "Content-Encoding": "gzip", "Content-Type": "application/json"},
        )
        assert response.status == 200
    first, second = recorder.headers
    assert first[INTERNAL_TOKEN_HEADER] == TOKEN and "Authorization" not in first
    assert first["x-jev-deadline-s"] == "20"
    assert json.loads(recorder.bodies[0])[1]["image"] == "x" * 100_000
    assert recorder.bodies[1] == b'{"image": "data:image/png;base64,BBBB"}'  # passed on decompressed
    assert "Content-Encoding" not in second and second["Content-Type"] == "application/json"


async def test_a_body_past_the_cap_is_413_in_the_error_shape_however_it_comes():
    recorder = Recorder()
    async with serve(recorder.app()) as url, frontend(url, max_preencode_bytes=50_000) as client:
        declared = await client.post("/v1/preencode", data=b"x" * 60_000)  # Content-Length says so: nothing sent
        assert declared.status == 413 and (await declared.json())["detail"]["error_type"] == "body_too_large"
        assert recorder.bodies == []

        async def chunked():
            for _ in range(10):
                yield b"y" * 10_000

        streamed = await client.post("/v1/preencode", data=chunked())  # found out while it streams
        assert streamed.status == 413 and (await streamed.json())["detail"]["error_type"] == "body_too_large"
        bomb = await client.post(
            "/v1/preencode", data=gzip.compress(b"z" * 200_000), headers={"Content-Encoding": "gzip"}
        )
        assert bomb.status == 413  # the cap is on what the body expands to
        assert all(len(body) <= 50_000 for body in recorder.bodies)  # nothing past the cap reached the preencoder
        ok = await client.post("/v1/preencode", data=b"w" * 40_000)
        assert ok.status == 200 and (await ok.json())["received"] == 40_000


async def test_without_a_preencoder_the_route_is_404_and_an_unreachable_one_502():
    async with frontend("") as client:
        response = await client.post("/v1/preencode", json=[])
        assert response.status == 404 and "JEV_PREENCODER_URL" in (await response.json())["detail"]["message"]
    with closed_port() as port:
        async with frontend(f"http://127.0.0.1:{port}") as client:
            response = await client.post("/v1/preencode", json=[{"image": "data:,"}])
            detail = (await response.json())["detail"]
            assert response.status == 502 and detail["error_type"] == "backend_unavailable"
            assert f"127.0.0.1:{port}" in detail["message"]
            metrics = await (await client.get("/metrics")).text()
            assert 'jev_frontend_backend_errors_total{endpoint="preencode",type="backend_unavailable"} 1.0' in metrics
            assert "jev_frontend_backend_up 0.0" not in metrics  # the worker is still up
