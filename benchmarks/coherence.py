"""Coherence mode off vs `cyclic` (the request's x_coherence) on jevbench, side by side in one run on the embedded
model: option-order invariance, its cost, and whether it only flattens answers.

    python -m benchmarks.coherence [--relations option_permutation] [--suite jevbench-mini] [--tiny]

One worker (`python -m jev_worker`, the embedded SmolLM2 unless `--tiny`) answers jevbench's requests for the
selected relations (its own fixed test plan: the same requests for every mode) once per mode; each mode's requests
carry `x_coherence`. Per mode: tests within jevbench's tolerance (0.05) and the mean deviation per relation, the
seconds and prompt tokens per answer, and the mean top probability of the choice answers (a mode that only
flattens answers shows as a lower top probability). Needs `jevbench` (requirements-dev).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from benchmarks.cpu_speed import cpu_description

REPO = Path(__file__).resolve().parents[1]
MODES = ("off", "cyclic")


class Worker:
    def __init__(self, tiny: bool):
        from tests.fakes.net import free_port

        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JEV_")}
        env.update(PYTHONPATH=f"{REPO / 'services'}:{REPO}", JEV_WORKER_HOST="127.0.0.1", JEV_WORKER_PORT=str(self.port),
                   JEV_REDIS_URL="redis://127.0.0.1:1/0", JEV_WORKER_REGISTER_TTL_S="0", JEV_LOG_LEVEL="warning",
                   TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        if tiny:
            from tools.tiny_checkpoints import make_tiny_text

            env.update(JEV_MODEL_PATH=str(make_tiny_text(Path(tempfile.mkdtemp(prefix="jev-coherence-")) / "tiny")),
                       JEV_DTYPE="float32")
        self.process = subprocess.Popen([sys.executable, "-m", "jev_worker"], env=env, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{self.port}"
        for _ in range(600):
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise RuntimeError("the worker did not become ready")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


class Mode:
    """jevbench's model: POST each (state, questions) with this mode; counts time, tokens and top probabilities."""

    def __init__(self, url: str, mode: str):
        self.url, self.mode = url, mode
        self.seconds, self.tokens, self.answers, self.tops = 0.0, 0, 0, []

    def __call__(self, state, questions) -> dict:
        body = json.dumps({"model": "jev-latest", "state": state, "questions": questions,
                           "x_coherence": self.mode}).encode()
        request = urllib.request.Request(self.url + "/v1/systemone", data=body,
                                         headers={"content-type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as answer:
            reply = json.loads(answer.read())
        self.seconds += time.perf_counter() - started
        self.tokens += reply["usage"]["input_tokens"]
        self.answers += len(reply["answers"])
        self.tops += [max(a["probabilities"].values()) for a in reply["answers"].values() if a.get("type") == "choice"]
        return reply["answers"]


def run(args) -> list[dict]:
    import jevbench as jb
    from jevbench.results import card

    worker = Worker(args.tiny)
    rows = []
    try:
        for mode in MODES:
            model = Mode(worker.url, mode)
            started = time.perf_counter()
            report = jb.evaluate(jb.from_callable(model), suite=args.suite, relations=args.relations, cache=None)
            wall = time.perf_counter() - started
            checks = {c["relation"]: c for c in card(report.result)}
            for relation in args.relations:
                check = checks.get(relation, {})
                row = {"mode": mode, "relation": relation, "tests": check.get("n"),
                       "within_tolerance": (check["n"] - check["violations"]) if check else None,
                       "mean_deviation": round(check["mean_deviation"], 4) if check else None,
                       "score": report.relations.get(relation), "answers": model.answers,
                       "seconds_per_answer": round(model.seconds / max(1, model.answers), 4),
                       "prompt_tokens_per_answer": round(model.tokens / max(1, model.answers), 1),
                       "mean_top_probability": round(statistics.mean(model.tops), 4) if model.tops else None,
                       "wall_s": round(wall, 1), "errors": len(report.errors)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    finally:
        worker.stop()
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| mode | relation | within tolerance | mean deviation | s / answer | prompt tokens / answer | "
             "mean top p |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['relation']} | {r['within_tolerance']}/{r['tests']} | {r['mean_deviation']} | "
                     f"{r['seconds_per_answer']} | {r['prompt_tokens_per_answer']} | {r['mean_top_probability']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coherence", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="jevbench-mini")
    parser.add_argument("--relations", type=lambda s: [r for r in s.split(",") if r], default=["option_permutation"])
    parser.add_argument("--tiny", action="store_true", help="a tiny random checkpoint (smoke)")
    args = parser.parse_args(argv)
    print(f"# CPU: {cpu_description()}", flush=True)
    rows = run(args)
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
