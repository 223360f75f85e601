"""tools/compare_with_backend against the fake worker and a real frontend (loopback)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from jev_common.schema import KINDS, DecisionRequest
from jev_frontend.app import create_app
from jev_frontend.settings import Settings
from tests.fakes.fake_worker import FakeWorker
from tests.fakes.net import closed_port
from tools.compare_with_backend import DEFAULT_CORPUS, Answer, compare, compare_rows, diff_answers, main

VALID = [r for r in DEFAULT_CORPUS if not r["request_id"].startswith("invalid")]


@contextlib.asynccontextmanager
async def real_frontend(backend_url: str):
    server = TestServer(create_app(Settings(backend_url=backend_url, timeout_s=10)))
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


@pytest.fixture
async def stack():
    worker = FakeWorker()
    async with worker as worker_url, real_frontend(worker_url) as frontend_url:
        yield worker, worker_url, frontend_url


def test_default_corpus_covers_every_kind_and_one_invalid_request():
    assert {r["kind"] for r in DEFAULT_CORPUS} == set(KINDS)
    for request in DEFAULT_CORPUS:
        if request["request_id"].startswith("invalid"):
            with pytest.raises(ValidationError):
                DecisionRequest.model_validate(request)
        else:
            DecisionRequest.model_validate(request)


async def test_frontend_matches_worker(stack):
    worker, worker_url, frontend_url = stack
    assert await compare(worker_url, frontend_url, DEFAULT_CORPUS) == []
    # worker, frontend (forwarded), worker again for each valid request; the invalid one never reaches it
    assert len(worker.requests) == 3 * len(VALID)


async def test_compares_with_the_second_worker_answer(stack):
    """The first send warms the fake's cache: comparing with it would flag usage.cached_tokens."""
    _worker, worker_url, frontend_url = stack
    rows = await compare_rows(worker_url, frontend_url, VALID[:2])
    for row in rows:
        assert row.mismatches == []
        assert row.worker_first.body["usage"]["cached_tokens"] == 0
        assert row.frontend.body["usage"]["cached_tokens"] > 0
        assert diff_answers(row.index, row.request, row.worker_first, row.frontend)[0].field == "usage"


async def test_wrong_frontend_is_detected(stack):
    _worker, worker_url, _frontend_url = stack
    async with FakeWorker(logit_scale=-1.0) as wrong_url:
        mismatches = await compare(worker_url, wrong_url, DEFAULT_CORPUS)
    by_request: dict[str, set[str]] = {}
    for m in mismatches:
        by_request.setdefault(m.request_id, set()).add(m.field)
    assert set(by_request) == {r["request_id"] for r in VALID}  # the invalid one still agrees (422 both)
    assert all("probabilities" in fields for fields in by_request.values())
    assert "choice" in by_request["choice-1"] and "score" in by_request["score-1"]
    assert "yes_probabilities" in by_request["set-1"] and "selected" in by_request["set-1"]


async def test_usage_difference_alone_is_detected(stack):
    _worker, worker_url, _frontend_url = stack
    async with FakeWorker(cache=False) as uncached_url:
        mismatches = await compare(worker_url, uncached_url, VALID)
    assert {m.field for m in mismatches} == {"usage"}
    assert len(mismatches) == len(VALID)


async def test_status_and_transport_mismatches_are_detected(stack):
    _worker, worker_url, _frontend_url = stack
    async with FakeWorker(error_status=503) as failing_url:
        failing = await compare(worker_url, failing_url, VALID[:2])
    assert [(m.field, m.worker, m.frontend) for m in failing] == [("status", 200, 503)] * 2
    with closed_port() as port:
        down = await compare(worker_url, f"http://127.0.0.1:{port}", VALID[:1])
    assert len(down) == 1 and down[0].field == "status" and down[0].worker == 200
    assert "ClientConnectorError" in down[0].frontend


def test_diff_tolerance_and_ignored_fields():
    request = VALID[0]
    base = {
        "request_id": "choice-1",
        "kind": "choice",
        "model": "m",
        "probabilities": [0.25, 0.75],
        "choice_index": 1,
        "choice": "accelerate",
        "noul": None,
        "score": None,
        "span": None,
        "yes_probabilities": None,
        "selected": None,
        "usage": {"prompt_tokens": 9, "cached_tokens": 9},
        "elapsed_seconds": 0.5,
    }
    near = {**base, "probabilities": [0.25 + 1e-9, 0.75 - 1e-9], "elapsed_seconds": 7.0}
    far = {**base, "probabilities": [0.2501, 0.7499]}
    short = {**base, "probabilities": [0.25]}
    assert diff_answers(0, request, Answer(200, base), Answer(200, near)) == []
    assert [m.field for m in diff_answers(0, request, Answer(200, base), Answer(200, far))] == ["probabilities"]
    assert [m.field for m in diff_answers(0, request, Answer(200, base), Answer(200, short))] == ["probabilities"]
    err = {"detail": {"error_type": "overloaded", "message": "a"}}
    assert (
        diff_answers(
            0, request, Answer(429, err), Answer(429, {"detail": {"error_type": "overloaded", "message": "b"}})
        )
        == []
    )
    other = {"detail": {"error_type": "queue_full", "message": "a"}}
    assert [m.field for m in diff_answers(0, request, Answer(429, err), Answer(429, other))] == ["error.type"]


async def test_cli_table_summary_and_exit_codes(stack, tmp_path, capsys):
    _worker, worker_url, frontend_url = stack
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("# two requests\n" + "\n".join(json.dumps(r) for r in VALID[:2]) + "\n\n")
    rc = await asyncio.to_thread(main, ["--worker", worker_url, "--frontend", frontend_url, "--corpus", str(corpus)])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "choice-1" in out and "summary: 2 requests, 2 match, 0 mismatch" in out

    async with FakeWorker(logit_scale=-1.0) as wrong_url:
        rc = await asyncio.to_thread(main, ["--worker", worker_url, "--frontend", wrong_url, "--corpus", str(corpus)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "MISMATCH" in out and "summary: 2 requests, 0 match, 2 mismatch" in out

    rc = await asyncio.to_thread(main, ["--worker", worker_url, "--frontend", frontend_url])  # built-in corpus
    out = capsys.readouterr().out
    assert rc == 0, out
    assert f"summary: {len(DEFAULT_CORPUS)} requests, {len(DEFAULT_CORPUS)} match" in out


def test_cli_bad_corpus_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "choice"}\n[1, 2]\n')
    assert main(["--worker", "http://127.0.0.1:1", "--frontend", "http://127.0.0.1:1", "--corpus", str(bad)]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    assert (
        main(
            [
                "--worker",
                "http://127.0.0.1:1",
                "--frontend",
                "http://127.0.0.1:1",
                "--corpus",
                str(tmp_path / "missing.jsonl"),
            ]
        )
        == 2
    )
