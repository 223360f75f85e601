"""Run a worker in-process on the tiny model and compute reference answers with a plain forward."""

from __future__ import annotations

import contextlib

import torch
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from jev_common.schema import DecisionRequest
from jev_worker.app import SERVICE, create_app
from jev_worker.request.legacy import legacy_rows, legacy_state_text
from tools.example_requests import REQUESTS, STATE  # noqa: F401 - re-exported for the tests


def record_forwards(engine) -> list[dict]:
    """Wrap the engine's backbone call; every forward's keyword arguments are appended to the list."""
    forwards: list[dict] = []
    original = engine.forwards.forward
    engine.forwards.forward = lambda **kw: forwards.append(kw) or original(**kw)
    return forwards


@contextlib.contextmanager
def slow_engine(engine, seconds: float):
    """Every model batch takes `seconds` longer while inside the block (on the model thread)."""
    import time

    original = engine.run

    def slow(items, groups):
        time.sleep(seconds)
        return original(items, groups)

    engine.run = slow
    try:
        yield
    finally:
        engine.run = original


@contextlib.asynccontextmanager
async def worker_client(settings):
    app = create_app(settings, wait_until_ready=True)
    async with TestClient(TestServer(app, handler_cancellation=True)) as client:
        service = app[SERVICE]
        assert service.state == "ok", service.error
        yield client, service


@torch.inference_mode()
def reference_row_probs(service, body: dict) -> list[list[float]]:
    """softmax(model(**inputs).logits[0, -1, label_ids]) in FP32 for every row of the prompt."""
    request = DecisionRequest.model_validate(body)
    rows, _ = legacy_rows(request, service.model.builder)
    prepared = service.model.builder.prepare(legacy_state_text(request, []), rows)
    model = service.model.loaded.model
    out = []
    for row, labels in zip(prepared.rows, prepared.row_labels):
        ids = torch.tensor([prepared.prefix_ids + row])
        logits = model(input_ids=ids).logits[0, -1].float()
        out.append(torch.softmax(logits[list(labels)], dim=-1).tolist())
    return out


def served_row_probs(body: dict, answer: dict) -> list[list[float]]:
    """The served answer re-expressed per row, to compare with reference_row_probs."""
    if body["kind"] == "set":
        return [[p, 1 - p] for p in answer["yes_probabilities"]]
    if body["kind"] == "noul":
        return [answer["probabilities"] + [answer["noul"]]]
    return [answer["probabilities"]]


def assert_close(a: list[list[float]], b: list[list[float]], tol: float = 1e-5) -> None:
    assert len(a) == len(b)
    for row_a, row_b in zip(a, b):
        assert len(row_a) == len(row_b)
        for x, y in zip(row_a, row_b):
            assert abs(x - y) <= tol, (row_a, row_b)


def prefixes_in_one_forward(forwards: list[dict]) -> int:
    """The most distinct prefixes whose rows shared one forward: packed (a 4D mask; rows after cached
    states differ in the prefix columns they see, whole sequences in their diagonal blocks), or a
    batch of padded rows (one per batch entry)."""
    best = 0
    for kw in forwards:
        mask = kw.get("attention_mask")
        ids = kw.get("input_ids")
        if mask is not None and mask.dim() == 4:
            rows = ids.shape[1]
            cached = mask.shape[-1] - rows
            region = mask[0, 0, :, :cached] if cached > 0 else mask[0, 0]
            best = max(best, len({int(r.nonzero()[0]) for r in region if r.any()}))
        elif ids is not None:
            best = max(best, ids.shape[0])
    return best


async def post_as_one_batch(client, service, bodies: list[dict], pilot: dict) -> list:
    """POST `bodies` so that they reach the model as one batch, however slow the machine: a `pilot`
    request (another state) holds the model thread for a second while they queue behind it."""
    import asyncio

    with slow_engine(service.model.engine, 1.0):
        first = asyncio.ensure_future(client.post("/v1/systemone", json=pilot))
        while not service.model.scheduler.running:  # until the pilot is on the model thread
            await asyncio.sleep(0.01)
        responses = await asyncio.gather(*(client.post("/v1/systemone", json=b) for b in bodies))
        await first
    return responses


def sample_value(text: str, name: str, **labels: str) -> float | None:
    """The sum of an exposition's samples named `name` whose labels include `labels` (None when there is none)."""
    values = [
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    ]
    return sum(values) if values else None
