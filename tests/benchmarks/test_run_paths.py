"""Every documented benchmark's real run path, at its smallest settings on the tiny checkpoint (or the embedded
model where the benchmark is about it): a benchmark that crashes fails the suite. `--help` alone proves
nothing: `make bench-peers` crashed 4 s in for weeks while its `--help` passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jev_common.logs import PROGRESS_BARS_OFF
from tools.stack_run import is_progress_bar

REPO = Path(__file__).resolve().parents[2]


NOISE = ("ConnectionError", "Connect call failed")  # an index the smoke run never asked for, unreachable


def run(module: str, *args: str, timeout: float = 240) -> str:
    """The benchmark's stdout; it must exit 0 and print nothing a user need not act on: no progress bars, no
    connection errors (issue 49: `prefix_scheduling --tiny` printed ten `ConnectionError ... 127.0.0.1:1` lines)."""
    env = dict(
        os.environ,
        PYTHONPATH=f"{REPO / 'services'}:{REPO}",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_VERBOSITY="error",
    )
    for switch in PROGRESS_BARS_OFF:  # as a user's shell has it (a test in this process may have set it)
        env.pop(switch, None)
    done = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{module} {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    noise = [
        line[:200]
        for line in (done.stdout + done.stderr).splitlines()
        if is_progress_bar(line) or any(word in line for word in NOISE)
    ]
    assert not noise, f"{module} {' '.join(args)} printed what no user acts on:\n" + "\n".join(noise[:10])
    return done.stdout


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_text

    return str(make_tiny_text(tmp_path_factory.mktemp("bench-tiny")))


def test_run_all_tiny(tmp_path):
    out = run(
        "benchmarks.run_all",
        "--model",
        "tiny",
        "--requests",
        "1",
        "--rounds",
        "1",
        "--groups",
        "l3,batching",
        "--out",
        str(tmp_path),
    )
    assert "l3" in out


def test_questions_per_request_tiny(tmp_path):
    run(
        "benchmarks.questions_per_request",
        "--model",
        "tiny",
        "--states",
        "1",
        "--questions",
        "2",
        "--rounds",
        "1",
        "--out",
        str(tmp_path),
    )


def test_routing_smallest(tiny_model, tmp_path):
    report = tmp_path / "routing.json"
    run(
        "benchmarks.routing",
        "--model-path",
        tiny_model,
        "--states",
        "2",
        "--repeats",
        "1",
        "--concurrency",
        "1",
        "--max-seconds",
        "60",
        "--json",
        str(report),
    )
    assert json.loads(report.read_text())


def test_reliability_tiny():
    """As docs/benchmarks.md writes it (`--tiny`, no sizes): the tiny checkpoint's sizes, so the disconnecting
    client's choice is answered or left, not refused for options the tiny vocabulary cannot label; every part it
    runs passes (run() asserts exit 0), and jevcompat, whose 255-option question the 4,096-token checkpoint cannot
    read, is skipped with the reason."""
    lines = [
        json.loads(line)
        for line in run("benchmarks.reliability", "--tiny", "--skip", "sdk").splitlines()
        if line.startswith("{")
    ]
    parts = {line["part"]: line for line in lines}
    assert all(line["ok"] for name, line in parts.items() if name != "jevcompat"), lines
    assert parts["bounds"]["result"]["1MB state"]["status"] == 422
    assert parts["bounds"]["result"]["small after"]["status"] == 200
    assert parts["disconnect"]["result"]["client"] != 422, parts["disconnect"]
    assert (
        parts["clients"]["result"]["clients"] == 2 and parts["clients"]["result"]["computed_is_answered_plus_unwanted"]
    )
    assert "4,096" in parts["jevcompat"]["skipped"] and "result" not in parts["jevcompat"]


def test_peers_reference_and_our_arm(tiny_model, tmp_path):
    """The peers benchmark's Reference (its checkpoint resolved as the worker resolves it: build_serving) and
    its ours arm, on the tiny checkpoint (the embedded model's two loads take about 2 minutes on a slow 2-core
    CPU), without building llama.cpp (the peer arms need benchmarks/peers/.venv)."""
    out = run(
        "benchmarks.peers",
        "--quick",
        "--rounds",
        "1",
        "--arms",
        "ours",
        "--cells",
        "single@1,8q@1",
        "--model-path",
        tiny_model,
        "--max-seconds",
        "5",
        "--out",
        str(tmp_path),
        timeout=400,
    )
    assert "agreement" in out and (tmp_path / "peers.json").is_file()


def test_prefix_scheduling_tiny():
    out = run(
        "benchmarks.prefix_scheduling",
        "--tiny",
        "--states",
        "4",
        "--per-state",
        "2",
        "--l3-states",
        "2",
        "--rounds",
        "1",
    )
    summary = json.loads(out.strip().splitlines()[-1])["summary"]
    assert set(summary["l3_hit_rate"]) == {"fifo", "prefix"}


def test_bulk_tiny(tmp_path):
    """benchmarks.bulk as docs/benchmarks.md writes it (`--tiny`): the real stack on the tiny checkpoint, `jev batch`
    in its own process and the naive client, each alone and beside interactive callers, every request answered."""
    out = run("benchmarks.bulk", "--tiny", "--out", str(tmp_path), timeout=300)
    lines = out.strip().splitlines()
    summary = json.loads(next(line for line in lines if line.startswith('{"summary"')))["summary"]
    assert summary["throughput_ratio_batch_over_naive"] > 0 and set(summary["l3_hit"]) == {"batch", "naive"}
    assert summary["interactive_p99_ms"]["beside batch"] is not None and summary["bound_ms"] is not None
    result = json.loads((tmp_path / "results.json").read_text())
    batch = next(row for row in result["rows"] if row["arm"] == "batch")
    assert batch["exit"] == 0 and batch["answered"] == batch["output_lines"] == 24


def test_cpu_speed_tiny():
    """cpu_speed's run path (its child processes, quiet and busy, the table) on a tiny checkpoint with one
    configuration: its smallest real run loads the embedded model once per configuration (214 s)."""
    out = run("benchmarks.cpu_speed", "--tiny", "--lengths", "16,32", "--rounds", "1", "--reps", "1")
    assert "| torch | 1 | passive |" in out and "tok/s" in out


def test_peers_profile_ours_tiny(tmp_path, tiny_model):
    """peers_profile's run path: our arm started as benchmarks.peers starts it, one cell's load while py-spy
    samples the worker, the summary written; on a tiny checkpoint for a few seconds."""
    out = run(
        "benchmarks.peers_profile",
        "--arm",
        "ours",
        "--workload",
        "single",
        "--concurrency",
        "1",
        "--seconds",
        "6",
        "--ours-env",
        f"JEV_MODEL_PATH={tiny_model}",
        "--ours-env",
        "JEV_DTYPE=float32",
        "--out",
        str(tmp_path),
    )
    assert "inclusive share of samples" in out
    summary = json.loads(next(tmp_path.glob("profile-ours-single-c1.json")).read_text())
    assert summary["samples"] > 0 and summary["requests_ok"] > 0


def test_coherence_tiny():
    """benchmarks.coherence's run path: a tiny checkpoint given a position prior by tools.calibrate_prior, a worker,
    jevbench's plan answered in every x_coherence mode (interleaved), labelled accuracy on two cases, the tables;
    over jevbench's one-case `examples` suite."""
    pytest.importorskip("jevbench")
    out = run("benchmarks.coherence", "--tiny", "--suite", "examples", "--domains", "all", "--accuracy-cases", "2")
    assert all(f"| {mode} | " in out for mode in ("uniform answerer", "off", "cyclic", "prior"))
    assert "requests outside the plan" not in out and "unlike the worker's" not in out


def test_readout_accuracy_tiny(tmp_path):
    """benchmarks.readout_accuracy's run path: a worker per readout on the tiny checkpoint, both labelled sets (two
    cases each), the reversed-order pass, the timing passes at concurrency 1 and 8, the table and results.json."""
    pytest.importorskip("jevbench")
    out = run("benchmarks.readout_accuracy", "--tiny", "--cases", "2", "--timing-requests", "2", "--out", str(tmp_path))
    for name in ("uniform answerer", "label-tokens", "scores-raw", "scores-pmi"):
        assert out.count(f"| {name} | ") == 2, out
    result = json.loads((tmp_path / "results.json").read_text())
    assert set(result["sets"]) == {"jevbench", "everyday"}
    pmi = result["sets"]["everyday"]["readouts"]["scores-pmi"]
    assert pmi["tv_max"] <= 1e-6  # option scoring is free of the options' order on any checkpoint
    assert [t["concurrency"] for t in pmi["timing"]] == [1, 8]
