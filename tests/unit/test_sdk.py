"""The official client, typesafe-sdk, against the real frontend and worker (in process, on loopback):
sync and async clients, every answer type, several questions per request, zstd bodies, API keys, and
an image question sent over multipart to the tiny VL checkpoint after the preencoder prepared it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import gzip
from dataclasses import replace

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestServer
from backports import zstd
from typesafe_sdk import (
    AsyncTypeSafeClient,
    Choice,
    Image,
    Noul,
    Score,
    TypeSafeAuthenticationError,
    TypeSafeClient,
    TypeSafeUnprocessableEntityError,
)

from jev_frontend.app import create_app as create_frontend
from jev_frontend.settings import Settings as FrontendSettings
from jev_worker.app import SERVICE, create_app

STATE = (
    "Hi, I was charged twice for my March invoice (order #4471) and the refund I was promised last week "
    "still hasn't arrived. I've emailed three times. Please fix this today or I will dispute the charge. "
) * 6
KEY = "sdk-test-key"
TOKEN = "internal-test-token"


def questions():
    return {
        "refund": Noul(instructions="Is the customer asking for money back?"),
        "team": Choice(
            instructions="Which team should handle this ticket?",
            criteria={"Billing": "Payments, invoices, refunds", "Technical": None, "Sales": "Pricing"},
        ),
        "anger": Score(instructions="How frustrated is the customer?", criteria=["Calm", "Frustrated", "Very angry"]),
    }


@contextlib.asynccontextmanager
async def stack(settings, api_keys: tuple[str, ...] = (), internal_tokens: tuple[str, ...] = ()):
    """A worker and a frontend in front of it, both real servers on loopback ports: the callers' keys on the
    frontend, the internal token on both (the documented configuration)."""
    worker_app = create_app(replace(settings, internal_tokens=internal_tokens), wait_until_ready=True)
    worker = TestServer(worker_app)
    await worker.start_server()
    assert worker_app[SERVICE].state == "ok", worker_app[SERVICE].error
    front = TestServer(
        create_frontend(
            FrontendSettings(
                backend_url=str(worker.make_url("")).rstrip("/"), api_keys=api_keys, internal_tokens=internal_tokens
            )
        )
    )
    await front.start_server()
    try:
        yield str(front.make_url("")).rstrip("/"), str(worker.make_url("")).rstrip("/"), worker_app[SERVICE]
    finally:
        await front.close()
        await worker.close()


def check_answers(response) -> dict:
    assert 0 <= response.nouls["refund"].noul <= 1
    team = response.choices["team"]
    assert set(team.probabilities) == {"Billing", "Technical", "Sales"}
    assert team.choice == max(team.probabilities, key=team.probabilities.get)
    anger = response.scores["anger"]
    assert set(anger.probabilities) == {0, 1, 2} and anger.legend == {0: "Calm", 1: "Frustrated", 2: "Very angry"}
    assert anger.score == pytest.approx(sum(i * p for i, p in anger.probabilities.items()), abs=1e-6)
    assert response.usage.input_tokens > 0 and response.usage.output_tokens == 0
    return {
        "refund": response.nouls["refund"].noul,
        "team": dict(team.probabilities),
        "anger": dict(anger.probabilities),
    }


async def test_sdk_async_and_sync_clients_with_a_key_and_zstd(worker_settings):
    async with stack(worker_settings(), api_keys=(KEY,), internal_tokens=(TOKEN,)) as (base, worker, service):
        async with AsyncTypeSafeClient(api_key=KEY, base_url=base, timeout=60) as client:
            assert client._config.compression == "zstd"  # bodies over 1 KiB go out zstd-compressed
            first = check_answers(await client.system_one(state=STATE, questions=questions()))
            models = await client.models.list()
            assert {m.name for m in models.models} == {service.recipe.name, "jev-latest"}

        def sync_call():
            with TypeSafeClient(api_key=KEY, base_url=base, timeout=60, compression=False) as client:
                return check_answers(client.system_one(state=STATE, questions=questions(), model=service.recipe.name))

        second = await asyncio.to_thread(sync_call)
        assert second["refund"] == pytest.approx(first["refund"], abs=1e-5)
        for option, p in first["team"].items():
            assert second["team"][option] == pytest.approx(p, abs=1e-5)

        async with AsyncTypeSafeClient(api_key="wrong", base_url=base, timeout=60) as client:
            with pytest.raises(TypeSafeAuthenticationError):
                await client.system_one(state="x", questions={"q": Noul(instructions="y?")})
        async with ClientSession() as http:  # no key at all
            async with http.post(
                base + "/v1/systemone",
                json={"model": "jev-latest", "state": "x", "questions": {"q": {"type": "noul", "instructions": "y?"}}},
            ) as response:
                assert response.status == 403
                assert (await response.json())["detail"]["error_type"] == "authentication_error"
            async with http.get(base + "/health") as response:  # health and metrics stay open
                assert response.status == 200
            # the worker serves the frontend only: the caller's own key does not open it, the internal token does
            for headers, status in (
                ({}, 403),
                ({"Authorization": f"Bearer {KEY}"}, 401),
                ({"x-jev-internal-token": TOKEN}, 200),
            ):
                async with http.post(
                    worker + "/v1/systemone",
                    headers=headers,
                    json={
                        "model": "jev-latest",
                        "state": "x",
                        "questions": {"q": {"type": "noul", "instructions": "y?"}},
                    },
                ) as response:
                    assert response.status == status, await response.text()


async def test_compressed_bodies_answer_like_plain_ones(worker_settings):
    body = {"model": "jev-latest", "state": STATE, "questions": {"q": {"type": "noul", "instructions": "Refund?"}}}
    import json

    raw = json.dumps(body).encode()
    async with stack(worker_settings(max_body_bytes=4096)) as (base, worker, _service), ClientSession() as http:
        answers = []
        for encoding, data in (("identity", raw), ("zstd", zstd.compress(raw)), ("gzip", gzip.compress(raw))):
            headers = {"Content-Type": "application/json"}
            if encoding != "identity":
                headers["Content-Encoding"] = encoding
            for url in (base, worker):
                async with http.post(url + "/v1/systemone", data=data, headers=headers) as response:
                    assert response.status == 200, await response.text()
                    assert response.headers["x-typesafe-request-id"].startswith("req_")
                    answers.append((await response.json())["answers"]["q"]["noul"])
        assert max(answers) - min(answers) < 1e-5
        # the body cap applies to what the body expands to: a small zstd bomb is refused, not inflated
        bomb = zstd.compress(json.dumps(dict(body, state="x" * 50_000)).encode())
        assert len(bomb) < 4096
        async with http.post(
            worker + "/v1/systemone",
            data=bomb,
            headers={"Content-Type": "application/json", "Content-Encoding": "zstd"},
        ) as response:
            assert response.status == 413
        async with http.post(
            worker + "/v1/systemone",
            data=b"not zstd at all",
            headers={"Content-Type": "application/json", "Content-Encoding": "zstd"},
        ) as response:
            assert 400 <= response.status < 500


async def test_sdk_image_question_over_multipart(tmp_path):
    """The SDK sends the image bytes as a multipart part; the worker names it sha256(bytes), the key the
    preencoder gave the same image, and answers from the prepared embeddings (no pixels decoded)."""
    from jev_common.assets import asset_key
    from jev_common.recipe import load_recipe
    from jev_worker.settings import CacheSettings, WorkerSettings

    from .vl_helpers import png_uri, request_line, tiny_encoder, tiny_vl_checkpoint

    recipe = load_recipe()
    model = recipe.model.model_copy(
        update={
            "hub_repo": "test/tiny-qwen2-vl",
            "revision": "local",
            "source": "hub",
            "gguf_file": None,
            "architecture": "Qwen2VLForConditionalGeneration",
            "modality": "vision-language",
            "dtype": "float32",
        }
    )
    recipe = recipe.model_copy(update={"name": "tiny-qwen2-vl", "model": model})
    assets = tmp_path / "assets"
    uri = png_uri(5)
    summary = await tiny_encoder().encode_lines([request_line(uri)], str(assets), None)
    assert summary.done == 1
    image_bytes = base64.b64decode(uri.split(",", 1)[1])
    settings = WorkerSettings(
        recipe=recipe,
        model_path=tiny_vl_checkpoint(),
        device="cpu",
        dtype="float32",
        redis_url="redis://127.0.0.1:1/0",
        asset_dir=str(assets),
        worker_id="sdk-vl",
        cache=CacheSettings(True, 1024, 64 << 20, 64 << 20),
    )
    async with stack(settings) as (base, _worker, service):
        async with AsyncTypeSafeClient(api_key="unused", base_url=base, timeout=60) as client:
            image = Image(image_bytes)
            qs = {
                "shape": Choice(instructions="Which shape is drawn?", criteria={"a square": None, "a circle": None}),
                "striped": Noul(instructions="Is it striped?"),
            }
            first = await client.system_one(state=["A drawing:", image], questions=qs)
            again = await client.system_one(state=["A drawing:", Image(image_bytes)], questions=qs)
            assert set(first.choices["shape"].probabilities) == {"a square", "a circle"}
            assert again.nouls["striped"].noul == pytest.approx(first.nouls["striped"].noul, abs=1e-5)
            assert service.model.assets.stats().hits >= 1  # the second request's image came from L2
            with pytest.raises(TypeSafeUnprocessableEntityError) as info:
                await client.system_one(state=Image(base64.b64decode(png_uri(6).split(",", 1)[1])), questions=qs)
            assert info.value.status == 422 and "preencoder" in str(info.value)
            assert asset_key(png_uri(6)) in str(info.value.body)
