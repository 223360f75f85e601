"""`python -m benchmarks.gpu_check --small` (CPU, tiny Qwen2, FP32) runs end to end and every check passes:
the GPU check had rotted once because nothing ran it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.gpu_check import CHECKS

REPO = Path(__file__).resolve().parents[2]


def test_small_dry_run_passes_every_check(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'services'}:{REPO}", JEV_REDIS_URL="")
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--small",
            "--out",
            str(tmp_path / "out"),
            "--work",
            str(tmp_path / "work"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    elapsed = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    report = (tmp_path / "out" / "gpu_report.md").read_text(encoding="utf-8")
    results = json.loads((tmp_path / "out" / "gpu_results.json").read_text(encoding="utf-8"))
    checks = results["correctness"]["checks"]
    for name in CHECKS:
        mine = [c for c in checks if c["check"] == name]
        assert mine and all(c["passed"] for c in mine), (name, mine)
        assert f"| {name} |" in report
    assert results["benchmark"]["runs"], "the HTTP benchmark part did not run"
    coherence = {r["variant"]: r for r in results["benchmark"]["runs"] if r["group"] == "coherence"}
    assert set(coherence) == {"x_coherence off", "x_coherence cyclic"}  # what the mode costs on the GPU
    assert all(r["report"]["ok"] == r["report"]["sent"] > 0 for r in coherence.values())
    assert "x_coherence cyclic" in report
    assert elapsed < 120, f"--small took {elapsed:.0f} s; keep it short for `make test`"
