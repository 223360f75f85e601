"""CLM's own server for tests/unit/families/test_clm.py, on loopback, with a fake encoder under it.

- `upstream_clm_server`: CLM's own System One server, `clm.server.create_app` over `clm.engine.Engine`,
  `clm.embedder.Embedder` and `clm.heads.HeadPair` from the PyPI package contrastive-lm 0.1.0 (the version the
  `clm` stage of images/cpu.Dockerfile installs; requirements-dev-nodeps.txt), run by uvicorn in a thread.
  Nothing of CLM is rewritten here: its request parsing, texts, heads, softmax and answer shapes are its own.
- `embeddings_app`: the only stand-in, for the Qwen3-8B encoder CLM calls (OpenAI `/v1/embeddings`, base64
  float32 as vLLM's pooling runner answers `encoding_format: base64`; `GET /v1/models` for CLM's health):
  each text's vector is a fixed function of the text (`embedding`), `prompt_tokens` its word count.
  `control["delay"]` makes it slow (and so CLM).
- `make_tiny_clm_head`: a random head in CLM's checkpoint layout (`CLM_v0.1-8B.pt`), which CLM's HeadPair loads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import math
import socket
import threading

import torch
from aiohttp import web

HIDDEN = 16  # the encoder's width (Qwen3-8B: 4096)


def embedding(text: str) -> torch.Tensor:
    """The fake encoder: a fixed random vector per text (seeded by its sha256), FP32."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed))


def make_tiny_clm_head(path, seed: int, width: int = 12, projection: int = 8) -> str:
    """CLM's checkpoint layout (contrastive-lm 0.1.0 `clm/heads.py` `HeadPair._load`): {cfg, state_head,
    action_head, logit_scale}, each head an MLP `inp` (hidden -> width), GELU, `out` (width -> projection_dim)
    at depth 2."""
    generator = torch.Generator().manual_seed(seed)

    def head() -> dict:
        return {
            "inp.weight": torch.randn(width, HIDDEN, generator=generator) * 0.3,
            "inp.bias": torch.randn(width, generator=generator) * 0.1,
            "out.weight": torch.randn(projection, width, generator=generator) * 0.3,
            "out.bias": torch.randn(projection, generator=generator) * 0.1,
        }

    torch.save(
        {
            "cfg": {
                "width": width,
                "depth": 2,
                "projection_dim": projection,
                "activation": "gelu",
                "hidden_size": HIDDEN,
            },
            "state_head": head(),
            "action_head": head(),
            "logit_scale": torch.tensor(math.log(12.0)),
        },
        path,
    )
    return str(path)


def project(head: dict, x: torch.Tensor) -> torch.Tensor:
    """One CLM head (depth 2) on L2-normalised encoder vectors, L2-normalised."""
    hidden = torch.nn.functional.gelu(x @ head["inp.weight"].T + head["inp.bias"])
    return torch.nn.functional.normalize(hidden @ head["out.weight"].T + head["out.bias"], dim=-1)


def embeddings_app(requests: list, control: dict) -> web.Application:
    async def embed(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        await asyncio.sleep(control.get("delay", 0))
        data = [
            {
                "index": i,
                "object": "embedding",
                "embedding": base64.b64encode(embedding(text).numpy().tobytes()).decode(),
            }
            for i, text in enumerate(body["input"])
        ]
        return web.json_response({"data": data, "usage": {"prompt_tokens": sum(len(t.split()) for t in body["input"])}})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "qwen3-8b"}]})

    app = web.Application()
    app.router.add_post("/v1/embeddings", embed)
    app.router.add_get("/v1/models", models)
    return app


class UpstreamClm:
    """CLM's own app under uvicorn in a thread: `url`, `calls` (each `Engine.answer` call's arguments, as CLM's
    handler parsed them from the body it was sent) and `stop()`."""

    def __init__(self, head: str, embeddings_url: str):
        import uvicorn
        from clm.embedder import Embedder
        from clm.engine import Engine
        from clm.server import create_app

        # the arguments clm-serve's main() passes; action_cache "0": no vector arena, so usage counts every text
        self.engine = Engine(
            Embedder(embeddings_url, "qwen3-8b", max_tokens=2048), checkpoint=head, device="cpu", action_cache="0"
        )
        self.calls: list[dict] = []
        answer = self.engine.answer
        self.engine.answer = lambda state, questions, model, temperature: (
            self.calls.append({"state": state, "questions": questions, "model": model, "temperature": temperature})
            or answer(state, questions, model, temperature)
        )
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        config = uvicorn.Config(
            create_app(self.engine, ui=False),
            lifespan="off",
            loop="asyncio",
            log_level="warning",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]}, daemon=True)

    async def start(self) -> UpstreamClm:
        self._thread.start()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("CLM's server did not start")
            await asyncio.sleep(0.02)
        return self

    async def stop(self) -> None:
        self._server.should_exit = True
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 10)
        self._socket.close()


@contextlib.asynccontextmanager
async def upstream_clm_server(head: str, embeddings_url: str):
    server = await UpstreamClm(head, embeddings_url).start()
    try:
        yield server
    finally:
        await server.stop()
