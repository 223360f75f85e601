"""What tracing costs (jev_common.tracing), off and on.

    python -m benchmarks.tracing [--rounds 4] [--requests 40] [--hooks 100000] [--json OUT]

1. **hooks**: the per-request tracing hooks with tracing off (the frontend's route and proxy hooks, the worker's
   timeline recorder, one attribute test each: no middleware is installed) timed in a loop, in ns per request.
2. **end to end**: two stacks of real processes on loopback (python -m jev_worker on the tiny checkpoint and
   python -m jev_frontend routing to it), one with tracing off, one on (exporting every span over OTLP/HTTP to a
   receiver in this process, flushed every 0.2 s); rounds of sequential decisions alternate between them
   (off, on, off, on, ...), so both see the same machine load. Prints each mode's median and p90 latency and the
   on/off ratio.

Loopback only; nothing reaches the network. Figures: benchmarks/RESULTS.md ("Tracing").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.stack import Stack
from jev_common.timeline import Timeline
from jev_common.tracing import Tracing
from jev_frontend.tracing import FrontendSpans
from jev_worker.telemetry.tracing import WorkerSpans

MODEL = "smollm2-135m-cpu"


class _Backend:
    url, load = "http://127.0.0.1:1", 0


def hooks_ns(iterations: int) -> float:
    """ns per request of every tracing hook a decision passes, tracing off."""
    frontend, worker = FrontendSpans(Tracing("bench", env={})), WorkerSpans(Tracing("bench", env={}))
    timeline, backend, headers = Timeline(), _Backend(), {}
    timeline.add("parse", 0.0, 1.0)
    started = time.perf_counter_ns()
    for _ in range(iterations):
        with frontend.routing(MODEL) as routing:
            routing.chose("cold", backend)
        with frontend.proxy(backend.url, "POST", "/v1/systemone", headers) as proxy:
            proxy.answered(200)
        worker.record(timeline)
    return (time.perf_counter_ns() - started) / iterations


def empty_loop_ns(iterations: int) -> float:
    """ns per iteration of a loop doing one function call: the machine's speed, for scale."""

    def nothing(_x):
        return None

    started = time.perf_counter_ns()
    for i in range(iterations):
        nothing(i)
    return (time.perf_counter_ns() - started) / iterations


async def _stack(services: Stack, name: str, checkpoint: str, env: dict[str, str]):
    worker = await services.worker(
        f"{name}-worker",
        JEV_RECIPE=MODEL,
        JEV_MODEL_PATH=checkpoint,
        JEV_DEVICE="cpu",
        JEV_DTYPE="float32",
        JEV_REDIS_URL="none",
        JEV_TORCH_THREADS="1",
        **env,
    )
    frontend = await services.frontend(f"{name}-frontend", worker.url, JEV_BACKENDS=f"{MODEL}={worker.url}", **env)
    return frontend


async def end_to_end(rounds: int, requests: int, log_dir: Path) -> dict:
    from tests.fakes.otlp_receiver import OtlpReceiver
    from tools.tiny_checkpoints import make_tiny_text

    checkpoint = str(make_tiny_text(log_dir / "tiny"))
    latencies: dict[str, list[float]] = {"off": [], "on": []}
    async with OtlpReceiver() as receiver, Stack(log_dir / "logs") as services:
        on_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "200"}
        fronts = {
            "off": await _stack(services, "off", checkpoint, {}),
            "on": await _stack(services, "on", checkpoint, on_env),
        }
        await services.wait_healthy(timeout_s=600)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def decide(mode: str, i: int) -> float:
                body = {
                    "model": MODEL,
                    "state": f"Ticket {i}: the invoice was charged twice.",  # a new state each time: L3 misses
                    "questions": {"q": {"type": "noul", "instructions": "Is a refund asked for?"}},
                }
                sent = time.perf_counter()
                async with session.post(fronts[mode].url + "/v1/systemone", json=body) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
                return time.perf_counter() - sent

            for mode in ("off", "on"):  # warm both
                for i in range(3):
                    await decide(mode, -1 - i)
            for r in range(rounds):
                for mode in ("off", "on") if r % 2 == 0 else ("on", "off"):
                    for i in range(requests):
                        latencies[mode].append(await decide(mode, r * requests + i))
        await asyncio.sleep(0.5)
        spans = len(receiver.spans)
    out = {}
    for mode, values in latencies.items():
        values.sort()
        out[mode] = {
            "requests": len(values),
            "median_ms": round(statistics.median(values) * 1e3, 3),
            "p90_ms": round(values[int(0.9 * (len(values) - 1))] * 1e3, 3),
        }
    out["on_over_off_median"] = round(out["on"]["median_ms"] / out["off"]["median_ms"], 3)
    out["spans_received"] = spans
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per mode (default 4)")
    parser.add_argument("--requests", type=int, default=40, help="sequential decisions per round (default 40)")
    parser.add_argument("--hooks", type=int, default=100_000, help="iterations of the off hooks (default 100000)")
    parser.add_argument("--no-stacks", action="store_true", help="the hooks only (no processes started)")
    parser.add_argument("--json", help="write the report here too")
    args = parser.parse_args(argv)
    report: dict = {
        "hooks_off_ns_per_request": round(hooks_ns(args.hooks), 1),
        "one_call_ns": round(empty_loop_ns(args.hooks), 1),
    }
    print(
        f"tracing off: the hooks of one decision take {report['hooks_off_ns_per_request']:.0f} ns "
        f"(one empty function call: {report['one_call_ns']:.0f} ns)",
        flush=True,
    )
    if not args.no_stacks:
        with tempfile.TemporaryDirectory(prefix="jev-bench-tracing-") as tmp:
            report["end_to_end"] = asyncio.run(end_to_end(args.rounds, args.requests, Path(tmp)))
        e2e = report["end_to_end"]
        for mode in ("off", "on"):
            m = e2e[mode]
            print(f"tracing {mode:>3}: {m['requests']} decisions, median {m['median_ms']} ms, p90 {m['p90_ms']} ms")
        print(f"on/off median latency: x{e2e['on_over_off_median']} ({e2e['spans_received']} spans received)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
