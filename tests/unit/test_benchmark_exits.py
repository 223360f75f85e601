"""Benchmarks honest about failures: a part that ran and failed makes the command exit non-zero, a part that
cannot apply is skipped with its reason; each decision checked here on a simulated outcome (no model)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from benchmarks import coherence, peers, peers_profile, reliability
from benchmarks.stack import NOT_INHERITED, service_env

BOUNDS_OK = {
    "rss_mb_before": 400.0,
    "1MB state": {"status": 422, "seconds": 0.1},
    "5MB state": {"status": 422, "seconds": 0.1},
    "5MB instructions": {"status": 422, "seconds": 0.1},
    "small after": {"status": 200, "seconds": 0.1},
    "rss_mb_after": 400.0,
}
CLIENTS_OK = {"statuses": {"200": 5, "429": 3, "left": 2}, "computed_is_answered_plus_unwanted": True, "counters": {}}


def test_reliability_judges_what_broke_not_what_measured_badly():
    assert reliability.judge("bounds", BOUNDS_OK) == []
    assert reliability.judge("bounds", {**BOUNDS_OK, "1MB state": {"status": 504, "seconds": 30}}) == [
        "1MB state: answered 504"
    ]
    assert reliability.judge("bounds", {**BOUNDS_OK, "small after": {"status": "left", "seconds": 60}})
    assert reliability.judge("disconnect", {"client": "left", "idle_after_disconnect_s": 0.5}) == []
    assert reliability.judge("disconnect", {"client": 500, "idle_after_disconnect_s": 0.5})
    assert reliability.judge("disconnect", {"client": "left", "idle_after_disconnect_s": float("inf")})
    timed_out = {"caller_got": "TypeSafeAPITimeoutError", "load": "quiet"}  # the SDK's budget: a measurement
    assert reliability.judge("sdk", [timed_out, {"caller_got": "answer (Billing)", "load": "one core busy"}]) == []
    assert reliability.judge("sdk", [{"caller_got": "TypeSafePermissionDeniedError", "load": "quiet"}])
    assert reliability.judge("clients", CLIENTS_OK) == []
    assert reliability.judge("clients", {**CLIENTS_OK, "statuses": {"200": 5, "500": 1}})
    assert reliability.judge("clients", {**CLIENTS_OK, "computed_is_answered_plus_unwanted": False})
    assert reliability.judge("jevcompat", {"exit": 0, "verdict": "pass", "MUST": "32/32"}) == []
    assert reliability.judge("jevcompat", {"exit": 1, "verdict": "fail", "MUST": "31/32"})


@pytest.mark.parametrize(
    "lines, code",
    [
        ([{"part": "bounds", "ok": True, "result": {}}, {"part": "jevcompat", "skipped": "too long"}], 0),
        ([{"part": "bounds", "ok": True, "result": {}}, {"part": "clients", "ok": False, "failed": ["5xx"]}], 1),
    ],
)
def test_reliability_exits_1_when_a_part_it_ran_failed(monkeypatch, capsys, lines, code):
    async def simulated(args):
        return lines

    monkeypatch.setattr(reliability, "run", simulated)
    assert reliability.main(["--tiny"]) == code
    err = capsys.readouterr().err
    if code:
        assert "# FAILED clients: 5xx" in err
    else:
        assert "# skipped jevcompat: too long" in err and "FAILED" not in err


@contextlib.asynccontextmanager
async def answering(status: int, body: object, delay_s: float = 0.0):
    async def handle(request: web.Request) -> web.Response:
        assert request.headers[reliability.INTERNAL_TOKEN_HEADER] == reliability.TOKEN
        await asyncio.sleep(delay_s)
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_post("/v1/systemone", handle)
    server = TestServer(app)
    await server.start_server()
    try:
        yield str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


async def test_jevcompat_is_skipped_only_where_its_largest_question_is_refused_as_too_long(monkeypatch):
    too_long = {"detail": [{"loc": ["body"], "msg": "prompt too long: 4,589 tokens; at most 4,096", "type": "x"}]}
    async with answering(422, too_long) as url:
        assert "4,096" in await reliability.jevcompat_applies(url)
    async with answering(422, {"detail": [{"loc": ["body"], "msg": "something else", "type": "x"}]}) as url:
        assert await reliability.jevcompat_applies(url) is None  # another refusal: the suite runs and says so
    async with answering(200, {"answers": {}}) as url:
        assert await reliability.jevcompat_applies(url) is None
    monkeypatch.setattr(reliability, "PROBE_S", 0.2)
    async with answering(200, {}, delay_s=1.0) as url:
        assert await reliability.jevcompat_applies(url) is None  # computing it: the model reads it


def test_coherence_fails_a_mode_whose_figures_cannot_be_trusted():
    class Report:
        def __init__(self, errors):
            self.errors = errors

    def result(live=(), errors=(), mismatch=0):
        return {
            "reports": {m: (Report(list(errors) if m == "cyclic" else []), list(live)) for m in coherence.MODES},
            "cost": {m: {"mismatch": mismatch if m == "prior" else 0} for m in coherence.MODES},
        }

    assert coherence.failures(result()) == []
    assert [f.split(":")[0] for f in coherence.failures(result(errors=["boom"]))] == ["cyclic"]
    assert [f.split(":")[0] for f in coherence.failures(result(mismatch=2))] == ["prior"]
    assert len(coherence.failures(result(live=["k"]))) == len(coherence.MODES)


def test_a_profile_of_unanswered_requests_fails():
    good = {"arm": "ours", "workload": "single", "concurrency": 1, "requests_ok": 4, "requests_sent": 4, "samples": 9}
    assert peers_profile.failures([good]) == []
    assert peers_profile.failures([{**good, "requests_ok": 3}])
    assert peers_profile.failures([{**good, "samples": 0}])
    assert peers_profile.failures([{**good, "requests_ok": 0, "requests_sent": 0}])


def test_peers_exits_1_when_a_cell_had_errors(monkeypatch, tmp_path):
    facts = {"date_utc": "d", "commit": "c", "cpu": "x", "nproc": 2, "cpus_usable": 2, "mem_gib": 1}

    async def simulated(args):
        return {"rows": [], "facts": facts, "agreement_totals": {}, "errors": errors}

    monkeypatch.setattr(peers, "run_benchmark", simulated)
    monkeypatch.setattr(peers, "plot", lambda *a: None)
    errors = {}
    assert peers.main(["--arms", "ours", "--out", str(tmp_path)]) == 0
    errors = {"single@1:ours": {"503": 2}}
    assert peers.main(["--arms", "ours", "--out", str(tmp_path)]) == 1
    assert json.loads((tmp_path / "peers.json").read_text())["errors"] == errors


def test_benchmark_services_take_credentials_and_limits_only_when_given(monkeypatch):
    for name in NOT_INHERITED:
        monkeypatch.setenv(name, "from-the-shell")
    env = service_env({"JEV_INTERNAL_TOKENS": "given"})
    assert env["JEV_INTERNAL_TOKENS"] == "given"
    assert not (set(NOT_INHERITED) - {"JEV_INTERNAL_TOKENS"}) & set(env)
    assert env["PATH"] == os.environ["PATH"]
