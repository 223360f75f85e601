"""The internal credential between the frontend and its backends (jev_common/internal_auth.py): which callers a
backend serves, whose fairness key it honours, and the token file services share."""

from __future__ import annotations

import contextlib
import threading

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from jev_common.http import client_key, error_middleware
from jev_common.identity import CallerIdentity
from jev_common.internal_auth import (
    INTERNAL_TOKEN_HEADER,
    backend_guard,
    backend_headers,
    load_internal_tokens,
    matches,
)

TOKEN, OLD, KEY = "t-new", "t-old", "k-direct"


@contextlib.asynccontextmanager
async def backend(tokens=(), api_keys=()):
    async def who(request: web.Request) -> web.Response:
        return web.json_response({"client": client_key(request, CallerIdentity.for_tokens(tokens))})

    app = web.Application(
        middlewares=[error_middleware, backend_guard(tokens, api_keys, internal_prefixes=("/v1/cache/",))]
    )
    app.router.add_post("/v1/systemone", who)
    app.router.add_post("/v1/cache/reset", who)
    app.router.add_get("/health", who)
    async with TestClient(TestServer(app)) as client:
        yield client


async def call(client, path="/v1/systemone", **headers):
    response = await client.post(path, headers=headers) if path != "/health" else await client.get(path)
    return response.status, await response.json()


async def test_a_backend_with_tokens_serves_only_the_internal_credential():
    async with backend((TOKEN, OLD)) as client:
        status, body = await call(client)
        assert status == 403 and body["detail"]["error_type"] == "authentication_error"
        assert (await call(client, **{INTERNAL_TOKEN_HEADER: "wrong"}))[0] == 401
        assert (await call(client, Authorization="Bearer wrong"))[0] == 401
        for token in (TOKEN, OLD):  # both listed tokens are valid at once: rotation without downtime
            status, body = await call(client, **{INTERNAL_TOKEN_HEADER: token, "x-jev-client": "key:abc"})
            assert status == 200 and body["client"] == "key:abc"  # the frontend's fairness key is honoured
        status, body = await call(client, Authorization=f"Bearer {TOKEN}")  # an operator's form of it
        assert status == 200
        assert (await call(client, "/v1/cache/reset", **{INTERNAL_TOKEN_HEADER: TOKEN}))[0] == 200
        assert (await call(client, "/health"))[0] == 200  # probes stay open


async def test_a_direct_caller_cannot_pick_its_fairness_key_or_reach_cache_control():
    async with backend((TOKEN,), api_keys=(KEY,)) as client:
        status, body = await call(client, Authorization=f"Bearer {KEY}", **{"x-jev-client": "key:someone-else"})
        assert status == 200 and body["client"].startswith("key:") and body["client"] != "key:someone-else"
        assert (await call(client, "/v1/cache/reset", Authorization=f"Bearer {KEY}"))[0] == 403
        # a forged x-jev-client with no credential is refused before it is read
        assert (await call(client, **{"x-jev-client": "key:someone-else"}))[0] == 403


async def test_without_a_token_every_caller_is_served_and_trusted():
    async with backend() as client:
        status, body = await call(client, **{"x-jev-client": "key:abc"})
        assert status == 200 and body["client"] == "key:abc"
        assert (await call(client, "/v1/cache/reset"))[0] == 200
    async with backend(api_keys=(KEY,)) as client:  # a worker serving callers alone, by API key
        assert (await call(client))[0] == 403
        assert (await call(client, Authorization="Bearer nope"))[0] == 401
        assert (await call(client, "/v1/cache/reset", Authorization=f"Bearer {KEY}"))[0] == 200


def test_the_token_file_is_generated_once_and_shared(tmp_path):
    path = tmp_path / "secrets" / "internal-token"
    results: list[tuple[str, ...]] = []
    threads = [threading.Thread(target=lambda: results.append(load_internal_tokens((), str(path)))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(results)) == 1 and len(results[0]) == 1 and len(results[0][0]) == 64  # one token, all agree
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only
    assert not [p for p in path.parent.iterdir() if p.name != "internal-token"]  # no staging file left
    assert load_internal_tokens((TOKEN,), str(path)) == (TOKEN, results[0][0])  # listed first: the one sent
    path.write_text(f"{TOKEN}, {OLD}\n{OLD}\n")
    assert load_internal_tokens((), str(path)) == (TOKEN, OLD)


def test_the_frontend_sends_its_first_token_and_compares_in_constant_time():
    assert backend_headers((TOKEN, OLD)) == {INTERNAL_TOKEN_HEADER: TOKEN}
    assert backend_headers(()) == {}
    assert matches(OLD, (TOKEN, OLD)) and not matches("t-ne", (TOKEN,)) and not matches("", ())


@pytest.mark.parametrize("given", ["", " ", "Bearer", "Basic abc"])
async def test_malformed_credentials_are_missing_not_errors(given):
    async with backend((TOKEN,)) as client:
        assert (await call(client, Authorization=given))[0] == 403


def test_no_settings_repr_shows_a_key_or_a_token():
    from jev_common.recipe import load_recipe
    from jev_frontend.settings import Settings
    from jev_preencoder.settings import PreencoderSettings
    from jev_worker.settings import WorkerSettings

    for settings in (
        Settings(api_keys=("k-sec",), internal_tokens=("t-sec",)),
        WorkerSettings(recipe=load_recipe("smollm2-135m-cpu"), api_keys=("k-sec",), internal_tokens=("t-sec",)),
        PreencoderSettings(internal_tokens=("t-sec",)),
    ):
        assert "k-sec" not in repr(settings) and "t-sec" not in repr(settings)
