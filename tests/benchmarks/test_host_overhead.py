"""benchmarks.host_overhead's smoke run (`--quick`, what make test affords): the simulated devices at c=1 and c=64,
straight to the worker and through the frontend, ending on the summary line the issue asks for. No figure is
judged here: the figures are the benchmark's (docs/benchmarks.md, RESULTS.md)."""

from __future__ import annotations

import json
import re

from .test_run_paths import run


def test_quick_run_measures_every_row_and_ends_on_the_summary(tmp_path):
    out = run("benchmarks.host_overhead", "--quick", "--out", str(tmp_path), timeout=600)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"host overhead at c=1: worker \+-?\d+\.\d\d ms, frontend \+-?\d+\.\d\d ms over the device; "
        r"device busy \d+% at c=64",
        last,
    ), last
    rows = json.loads((tmp_path / "host_overhead.json").read_text())["rows"]
    measured = {(r["workload"], r["target"], r["concurrency"]) for r in rows}
    assert measured == {(w, t, c) for w in ("sim-1.5b", "sim-7.35b") for t in ("worker", "frontend") for c in (1, 64)}
    for row in rows:
        assert row["requests"] >= 200 and row["device_busy"] > 0 and row["worker_cpu_ms_per_decision"] > 0, row
        assert row["device_limit_per_s"] >= row["decisions_per_s"], row  # never faster than the device allows
