"""benchmarks.loadgen against the fake worker: report structure, counts, ordered percentiles; loopback only."""

from __future__ import annotations

import json

import pytest

from benchmarks.corpora import BUILTIN, load_corpus
from benchmarks.loadgen import NotLoopback, check_loopback, main, merge_reports, percentile, run_load
from benchmarks.suite import Run, WorkerDelta, effect, markdown_table, plot_concurrency, text_table
from tests.fakes.fake_worker import FakeWorker


def test_percentile_interpolates_like_numpy():
    values = [1.0, 2.0, 3.0, 4.0]
    assert percentile(values, 0) == 1.0 and percentile(values, 100) == 4.0
    assert percentile(values, 50) == 2.5
    assert abs(percentile(values, 95) - 3.85) < 1e-12
    assert percentile([], 50) is None and percentile([7.0], 99) == 7.0


@pytest.mark.parametrize(
    "url",
    [
        "http://10.0.0.1:8080",
        "http://example.com/",
        "https://8.8.8.8",
        "ftp://127.0.0.1/",
        "http://192.168.1.2:8000/v1/systemone",
        "127.0.0.1:8080",
    ],
)
def test_refuses_non_loopback_targets(url):
    with pytest.raises(NotLoopback):
        check_loopback(url)
    assert main(["--url", url, "--requests", "1"]) == 2


def test_accepts_loopback_and_appends_the_endpoint():
    assert check_loopback("http://127.0.0.1:8080") == "http://127.0.0.1:8080/v1/systemone"
    assert check_loopback("http://127.0.0.2:1/") == "http://127.0.0.2:1/v1/systemone"
    assert check_loopback("http://[::1]:9/v1/systemone") == "http://[::1]:9/v1/systemone"
    assert check_loopback("http://localhost:8080").endswith(":8080/v1/systemone")


def test_builtin_corpora_are_valid_requests():
    from benchmarks.corpora import SYSTEM_ONE
    from jev_common.schema import DecisionRequest, SystemOneRequest

    for name in [*BUILTIN, *SYSTEM_ONE]:
        corpus = load_corpus(name)
        assert len(corpus) >= 8
        for body in corpus:
            (SystemOneRequest if "questions" in body else DecisionRequest).model_validate(body)
    ordered, cyclic = load_corpus("ordered"), load_corpus("ordered-cyclic")
    assert [dict(b, x_coherence="cyclic") for b in ordered] == cyclic  # the same requests, the mode asked
    assert len({json.dumps(b["questions"]["choice0"]["criteria"]) for b in ordered}) > len(
        {b["state"] for b in ordered}
    )
    shared = load_corpus("shared-prefix")
    assert len({b["state"]["text"] for b in shared}) == 3  # few states, many questions
    assert all(b["kind"] == "set" and len(b["options"]) >= 5 for b in load_corpus("set"))


def _check_report(report, requests, concurrency):
    assert report.sent == report.ok == requests and report.statuses == {"200": requests}
    assert report.concurrency == concurrency and len(report.latencies_ms) == requests
    assert 0 < report.p50_ms <= report.p95_ms <= report.p99_ms <= report.max_ms
    assert report.decisions_per_s > 0 and report.wall_s > 0 and not report.stopped_early


async def test_loadgen_against_fake_worker_pooled_and_per_request_sessions():
    fake = FakeWorker()
    corpus = load_corpus("mixed")
    async with fake as url:
        pooled = await run_load(url, corpus, concurrency=4, requests=20, warmup=2)
        _check_report(pooled, 20, 4)
        assert pooled.pooled
        fresh = await run_load(url + "/", corpus, concurrency=2, requests=20, pooled=False)
        _check_report(fresh, 20, 2)
        assert not fresh.pooled
    assert fake.received == 42  # 2 warm-ups + 2 x 20, nothing more
    sent_ids = [r["request_id"] for r in fake.requests[2:22]]
    assert sorted(sent_ids) == sorted(corpus[i % len(corpus)]["request_id"] for i in range(20))
    merged = merge_reports([pooled, fresh])
    assert merged.sent == merged.ok == 40 and merged.statuses == {"200": 40}
    assert merged.p50_ms <= merged.p95_ms <= merged.p99_ms
    assert abs(merged.wall_s - (pooled.wall_s + fresh.wall_s)) < 1e-9


async def test_loadgen_offset_continues_through_the_corpus():
    fake = FakeWorker()
    corpus = load_corpus("shared-prefix")
    async with fake as url:
        report = await run_load(url, corpus, requests=5, offset=22)
    assert report.ok == 5
    assert [r["request_id"] for r in fake.requests] == [corpus[i % len(corpus)]["request_id"] for i in range(22, 27)]


async def test_loadgen_counts_errors_by_status_and_envelope_type():
    async with FakeWorker(error_status=429) as url:
        report = await run_load(url, load_corpus("mixed"), concurrency=3, requests=9)
    assert report.sent == 9 and report.ok == 0 and report.statuses == {"429": 9}
    assert report.error_types == {"overloaded": 9}
    assert report.p50_ms is None and report.decisions_per_s == 0


async def test_loadgen_reports_unreachable_target_as_transport_errors():
    from tests.fakes.net import closed_port

    with closed_port() as port:
        report = await run_load(f"http://127.0.0.1:{port}", load_corpus("mixed"), requests=3, timeout_s=5)
    assert report.statuses == {"transport": 3} and report.ok == 0


def test_cli_writes_json_report(tmp_path, capsys):
    import asyncio
    import threading

    fake = FakeWorker()
    loop = asyncio.new_event_loop()
    url = loop.run_until_complete(fake.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        corpus = tmp_path / "corpus.jsonl"
        corpus.write_text("# one request\n" + json.dumps(load_corpus("set")[0]) + "\n\n", encoding="utf-8")
        out = tmp_path / "report.json"
        code = main(
            ["--url", url, "--requests", "5", "--concurrency", "2", "--corpus", str(corpus), "--json", str(out)]
        )
    finally:
        asyncio.run_coroutine_threadsafe(fake.stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    saved = json.loads(out.read_text())
    assert printed["ok"] == saved["ok"] == 5 and len(saved["latencies_ms"]) == 5
    assert "latencies_ms" not in printed
    assert fake.received == 5 and {r["kind"] for r in fake.requests} == {"set"}


async def test_table_and_plot_from_runs(tmp_path):
    async with FakeWorker() as url:
        reports = [await run_load(url, load_corpus("mixed"), concurrency=c, requests=8) for c in (1, 2)]
    runs = [
        Run(
            group="concurrency",
            variant=f"concurrency {c}",
            path="worker",
            worker="A",
            corpus="mixed",
            concurrency=c,
            report=r,
            delta=WorkerDelta(l3_hits=3, l3_misses=1, batches=4, batch_requests=8, batch_rows=8),
            baseline=(c == 1),
        )
        for c, r in zip((1, 2), reports)
    ]
    runs[1].effect = effect(runs[1], runs[0])
    assert runs[1].effect["throughput_ratio"] > 0 and "p50_delta_ms" in runs[1].effect
    md = markdown_table(runs)
    assert md.count("\n") == 3 and "| concurrency | concurrency 2 |" in md and "75%" in md and "baseline" in md
    assert "2.00" in text_table(runs)
    png = plot_concurrency(runs, tmp_path / "plot.png", "test")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
