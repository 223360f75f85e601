"""Stand-ins for CLM's two servers, on loopback, for tests/unit/families/test_clm.py.

- an OpenAI-compatible embeddings server (`POST /v1/embeddings`, base64 float32 as vLLM's pooling
  runner answers `encoding_format: base64`; `GET /v1/models`): each text's vector is a fixed function
  of the text (`embedding`), `prompt_tokens` its word count;
- CLM's own server as `clm-serve` 0.1.0 (PyPI contrastive-lm) speaks it: `GET /health` ->
  `{ok, embedder}`, `POST /v1/systemone` `{state, model, questions, temperature}` -> `{model, answers,
  usage}` with answers in TypeSafe's shape (its own confidence, a legend object for score), 502 when the
  embeddings server cannot be reached. It scores as CLM does, with a head in CLM's checkpoint layout
  (`make_tiny_clm_head`). `control` makes it slow (`delay`) or answer garbage (`garble`).
"""
from __future__ import annotations

import asyncio
import base64
import hashlib
import math

import aiohttp
import torch
from aiohttp import web

HIDDEN = 16  # the encoder's width (Qwen3-8B: 4096)


def embedding(text: str) -> torch.Tensor:
    """The stub encoder: a fixed random vector per text (seeded by its sha256), FP32."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return torch.randn(HIDDEN, generator=torch.Generator().manual_seed(seed))


def make_tiny_clm_head(path, seed: int, width: int = 12, projection: int = 8) -> str:
    """CLM's checkpoint layout (`CLM_v0.1-8B.pt`): {cfg, state_head, action_head, logit_scale}, each head
    an MLP `inp` (hidden -> width), GELU, `out` (width -> projection_dim) at depth 2."""
    generator = torch.Generator().manual_seed(seed)

    def head() -> dict:
        return {"inp.weight": torch.randn(width, HIDDEN, generator=generator) * 0.3,
                "inp.bias": torch.randn(width, generator=generator) * 0.1,
                "out.weight": torch.randn(projection, width, generator=generator) * 0.3,
                "out.bias": torch.randn(projection, generator=generator) * 0.1}

    torch.save({"cfg": {"width": width, "depth": 2, "projection_dim": projection, "activation": "gelu",
                        "hidden_size": HIDDEN},
                "state_head": head(), "action_head": head(), "logit_scale": torch.tensor(math.log(12.0))},
               path)
    return str(path)


def project(head: dict, x: torch.Tensor) -> torch.Tensor:
    """One CLM head (depth 2) on L2-normalised encoder vectors, L2-normalised."""
    hidden = torch.nn.functional.gelu(x @ head["inp.weight"].T + head["inp.bias"])
    return torch.nn.functional.normalize(hidden @ head["out.weight"].T + head["out.bias"], dim=-1)


def embeddings_app(requests: list) -> web.Application:
    async def embed(request: web.Request) -> web.Response:
        body = await request.json()
        requests.append(body)
        data = [{"index": i, "object": "embedding",
                 "embedding": base64.b64encode(embedding(text).numpy().tobytes()).decode()}
                for i, text in enumerate(body["input"])]
        return web.json_response({"data": data, "usage": {"prompt_tokens": sum(len(t.split()) for t in body["input"])}})

    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "qwen3-8b"}]})

    app = web.Application()
    app.router.add_post("/v1/embeddings", embed)
    app.router.add_get("/v1/models", models)
    return app


def _text(value) -> str:
    """CLM's to_text for the flat values these tests send (strings, or None)."""
    return "" if value is None else str(value)


def _candidates(question: dict) -> tuple[list[str], list[str]]:
    """CLM 0.1.0's schema.candidates: (option keys, the text the action head embeds for each)."""
    criteria, instructions = question.get("criteria"), _text(question.get("instructions")).strip()
    if question["type"] == "choice":
        return list(criteria), [_text(v) if v not in (None, "") else k for k, v in criteria.items()]
    if question["type"] == "score":
        return [str(i) for i in range(len(criteria))], [_text(c) for c in criteria]
    texts = []
    for key in ("false", "true"):
        given = (criteria or {}).get(key)
        if given in (None, ""):
            given = (f"Yes. This is true: {instructions}" if key == "true" else
                     f"No. This is false: {instructions}") if instructions else key
        texts.append(f"{key}: {_text(given)}")
    return ["false", "true"], texts


def clm_app(checkpoint: str, embeddings_url: str, control: dict) -> web.Application:
    state = torch.load(checkpoint, weights_only=True)
    scale = float(state["logit_scale"].exp())

    async def embed(session: aiohttp.ClientSession, texts: list[str]) -> tuple[torch.Tensor, int]:
        try:
            async with session.post(embeddings_url + "/v1/embeddings",
                                    json={"model": "qwen3-8b", "input": texts, "encoding_format": "base64"}) as r:
                body = await r.json()
        except aiohttp.ClientError as exc:
            raise web.HTTPBadGateway(text=f'{{"detail": "embedder unreachable at {embeddings_url}: {exc}"}}',
                                     content_type="application/json") from None
        rows = [torch.frombuffer(bytearray(base64.b64decode(d["embedding"])), dtype=torch.float32) for d in body["data"]]
        return torch.nn.functional.normalize(torch.stack(rows), dim=-1), body["usage"]["prompt_tokens"]

    async def health(_request: web.Request) -> web.Response:
        try:
            async with aiohttp.ClientSession() as session, session.get(embeddings_url + "/v1/models") as r:
                up = r.status == 200
        except aiohttp.ClientError:
            up = False
        return web.json_response({"ok": True, "embedder": up, "models": ["clm-latest", "clm-raw"]})

    async def systemone(request: web.Request) -> web.Response:
        body = await request.json()
        control.setdefault("requests", []).append(body)
        await asyncio.sleep(control.get("delay", 0))
        temperature, answers, tokens = float(body.get("temperature", 1.0)), {}, 0
        async with aiohttp.ClientSession() as session:
            for qid, question in body["questions"].items():
                instructions = _text(question.get("instructions")).strip()
                context = _text(body["state"]).strip()
                keys, texts = _candidates(question)
                vectors, spent = await embed(session, [f"{context}\n\n{instructions}" if instructions else context]
                                             + texts)
                tokens += spent
                z_state = project(state["state_head"], vectors[:1])[0]
                z_options = project(state["action_head"], vectors[1:])
                probs = torch.softmax(scale * (z_options @ z_state) / temperature, -1).tolist()
                dist = dict(zip(keys, probs))
                if question["type"] == "noul":
                    answers[qid] = {"type": "noul", "noul": dist["true"]}
                    continue
                answers[qid] = {"type": question["type"], "probabilities": dist, "confidence": 0.5,
                                "choice": max(dist, key=dist.get)}
                if question["type"] == "score":
                    answers[qid].update(score=sum(i * p for i, p in enumerate(probs)),
                                        legend={str(i): c for i, c in enumerate(question["criteria"])})
        if control.get("garble"):
            first = next(iter(answers.values()))
            first["probabilities"] = {"nonsense": 1.0}
        return web.json_response({"model": body["model"], "answers": answers,
                                  "usage": {"billing_units": len(answers), "input_tokens": tokens, "output_tokens": 0}})

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/systemone", systemone)
    return app
