"""Bounds before compute (jev_worker/prompt/bounds.py) and chunked prefill (engine.chunked_forward): a prompt past the
model's limit is a 422 naming the limit and the count, megabytes are refused before tokenising, and a prompt
prefilled in chunks is answered exactly as in one pass."""

from __future__ import annotations

import resource

import pytest
import torch

from jev_common.schema import MAX_CONTENT_CHARS
from jev_worker.prompt.bounds import CHARS_PER_TOKEN, PromptBounds, positions_of
from jev_worker.settings import CacheSettings

from .worker_helpers import (
    REQUESTS,
    assert_close,
    record_forwards,
    reference_row_probs,
    served_row_probs,
    worker_client,
)

CACHE_OFF = CacheSettings(False, 1024, 64 << 20, 64 << 20)
LIMIT = 4096  # the tiny checkpoint's max_position_embeddings


def envelope(state: str, instructions: str = "Is it on?") -> dict:
    return {"model": "jev-latest", "state": state, "questions": {"q": {"type": "noul", "instructions": instructions}}}


def messages(body: dict) -> str:
    detail = body["detail"]
    return " ".join(d["msg"] for d in detail) if isinstance(detail, list) else detail["message"]


@pytest.mark.parametrize("cache", [True, False], ids=["l3", "no-cache"])
@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_chunked_prefill_answers_as_one_pass(worker_settings, kind, cache):
    body = REQUESTS[kind]
    settings = worker_settings(prefill_chunk_tokens=3, **({} if cache else {"cache": CACHE_OFF}))
    async with worker_client(settings) as (client, service):
        forwards = record_forwards(service.model.engine)
        chunks = []
        original = service.model.engine.forwards.backbone_forward
        service.model.engine.forwards.backbone_forward = lambda **kw: chunks.append(kw) or original(**kw)
        response = await client.post("/v1/systemone", json=body)
        assert response.status == 200, await response.text()
        assert_close(served_row_probs(body, await response.json()), reference_row_probs(service, body))
        longest = max(
            (kw.get("input_ids") if kw.get("input_ids") is not None else kw["inputs_embeds"]).shape[1]
            for kw in forwards
        )
        assert longest > 3  # some forward was longer than a chunk ...
        assert max(kw["input_ids"].shape[1] for kw in chunks) <= 3  # ... and ran in chunks


def test_positions_of_reads_text_config():
    class Config:
        max_position_embeddings = None
        text_config = type("T", (), {"max_position_embeddings": 262144})()

    assert positions_of(Config()) == 262144
    assert positions_of(object()) is None


def test_the_familys_own_limit_wins_over_positions():
    config = type("C", (), {"max_position_embeddings": 8192})()
    for family in (1024, 32768):
        bounds = PromptBounds.of(config, type("B", (), {"max_length": family, "cuts_state": False})())
        assert bounds.tokens == family and bounds.family_refuses
    plain = PromptBounds.of(config, type("B", (), {"max_length": None, "cuts_state": False})())
    assert plain.tokens == 8192 and not plain.family_refuses


async def test_megabytes_refused_before_compute_and_the_worker_still_answers(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        calls = []
        original = service.model.engine.run
        service.model.engine.run = lambda items, groups: calls.append(items) or original(items, groups)
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        one_mb = await client.post("/v1/systemone", json=envelope("word " * 200_000))
        assert one_mb.status == 422
        text = messages(await one_mb.json())
        assert f"{LIMIT:,} tokens" in text and "1,000,000 characters" in text
        five_mb = await client.post("/v1/systemone", json=envelope("x" * 5_000_000))
        assert five_mb.status == 422 and f"{MAX_CONTENT_CHARS:,}" in messages(await five_mb.json())
        five_mb_q = await client.post("/v1/systemone", json=envelope("short state", "y" * 5_000_000))
        assert five_mb_q.status == 422 and "instructions" in messages(await five_mb_q.json())
        assert calls == []  # no forward ran for any of them
        small = await client.post("/v1/systemone", json=envelope("The lamp is on."))
        assert small.status == 200
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 512 * 1024  # KiB: no runaway


async def test_token_count_over_the_limit_is_refused_naming_both(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        # under the character cap, over the token limit: counted, refused before the forward
        state = " ".join(f"w{i}" for i in range(LIMIT))
        assert len(state) < LIMIT * CHARS_PER_TOKEN
        response = await client.post("/v1/systemone", json=envelope(state))
        assert response.status == 422
        text = messages(await response.json())
        assert f"at most {LIMIT:,}" in text and "tokens" in text
        health = await (await client.get("/health")).json()
        assert health["detail"]["max_prompt_tokens"] == LIMIT


def test_chunked_forward_cuts_masks_and_positions():
    from transformers import DynamicCache

    from jev_worker.engine.forwards import chunked_forward

    seen = []

    def forward(**kw):
        seen.append(kw)
        cache = kw["past_key_values"]
        layer = cache.layers[0]
        n = kw["input_ids"].shape[1]
        keys = torch.zeros(1, 1, n, 2)
        if layer.keys is None or not layer.is_initialized:
            layer.lazy_initialization(keys, keys)
        cache.update(keys, keys, 0)
        return torch.arange(n, dtype=torch.float32).view(1, n, 1) + kw["position_ids"][0, 0]

    ids = torch.arange(7).view(1, 7)
    positions = torch.arange(7).view(1, 7) + 10
    mask = torch.ones(1, 1, 7, 9, dtype=torch.bool)  # two tokens of past, seven new
    cache = DynamicCache()
    past = torch.zeros(1, 1, 2, 2)
    cache.update(past, past, 0)
    out = chunked_forward(
        forward,
        {"input_ids": ids, "position_ids": positions, "attention_mask": mask, "past_key_values": cache},
        3,
        "past_key_values",
        DynamicCache,
    )
    assert [kw["input_ids"].shape[1] for kw in seen] == [3, 3, 1]
    assert [tuple(kw["attention_mask"].shape[-2:]) for kw in seen] == [(3, 5), (3, 8), (1, 9)]
    assert [int(kw["position_ids"][0, 0]) for kw in seen] == [10, 13, 16]
    assert out.shape == (1, 7, 1)
