"""Host overhead: what the worker and the frontend add around the device, and whether a fast device waits for them.

    python -m benchmarks.host_overhead [--out benchmarks/out] [--requests 2000]
    python -m benchmarks.host_overhead --quick        # a smoke run (make test runs it): fewer requests, c=1 and 64

Workloads, each a worker started for it, with a frontend in front:
- `sim-1.5b`, `sim-7.35b`: the simulated device (`JEV_DEVICE=simulated JEV_BENCHMARK=1`, worker/engine/simulated.py)
  pricing Qwen2-1.5B or 7.35B-shaped forwards as measured on one H200, over the tiny random checkpoint's tokenizer
  and head; every request answers with its batches' device seconds (`x-jev-device-seconds`);
- `tiny`: the tiny random checkpoint's real forwards on this CPU.
For each, concurrency 1, 8, 64 and 256, straight to the worker and through the frontend, interleaved round by round
(worker, frontend, worker, ...) so that both see the same machine. The corpus is `mixed` (every question kind over
six states, System One's single-question form), cycled: after the first round L1 and L3 hit, as in steady traffic.
The worker's limits that would refuse one load generator are lifted (`JEV_MAX_PER_CLIENT`, `JEV_MAX_QUEUE`); keys
and rate limits are off.

Reported per row:
- `over device p50`: the p50 of (served latency - the request's device seconds): what the host adds. For the
  tiny checkpoint (a real CPU device, no measured wait) the served p50 minus the p50 forward time of a batch;
- `device busy`: seconds the device was busy (jev_worker_device_seconds) over wall time;
- `dec/s` and `limit`: decisions per second, and what the device would give busy all the time with the batches this
  run formed (decisions / device-busy seconds);
- `worker CPU/dec`: the worker process's CPU time (user + system, /proc) per decision.
The last line reads: host overhead at c=1: worker +X.XX ms, frontend +Y.YY ms over the device; device busy Z% at c=64
(X and Y on sim-1.5b at c=1, Z on sim-7.35b at the worker at c=64).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

from tests.fakes.net import free_port
from tools import stack_run
from tools.tiny_checkpoints import make_tiny_text

from .corpora import load_corpus
from .cpu_speed import cpu_description

REPO = Path(__file__).resolve().parents[1]
DEVICE_HEADER = "x-jev-device-seconds"
WORKLOADS = {
    "sim-1.5b": {"JEV_DEVICE": "simulated", "JEV_BENCHMARK": "1", "JEV_SIMULATED_SHAPES": "1.5b"},
    "sim-7.35b": {"JEV_DEVICE": "simulated", "JEV_BENCHMARK": "1", "JEV_SIMULATED_SHAPES": "7.35b"},
    "tiny": {"JEV_DEVICE": "cpu"},
}
CONCURRENCY = (1, 8, 64, 256)


@dataclass
class Row:
    workload: str
    target: str  # worker | frontend
    concurrency: int
    requests: int
    served_p50_ms: float
    over_device_p50_ms: float
    device_busy: float
    decisions_per_s: float
    device_limit_per_s: float | None
    worker_cpu_ms_per_decision: float
    batch_requests_mean: float


def worker_env(workload: str, checkpoint: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JEV_")}
    env.update(
        PYTHONPATH=f"{REPO / 'services'}:{REPO}",
        JEV_MODEL_PATH=str(checkpoint),
        JEV_DTYPE="float32",
        JEV_WORKER_HOST="127.0.0.1",
        JEV_WORKER_PORT=str(port),
        JEV_REDIS_URL="",
        JEV_WORKER_REGISTER_TTL_S="0",
        JEV_MAX_PER_CLIENT="4096",
        JEV_MAX_QUEUE="4096",
        JEV_LOG_LEVEL="WARNING",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        **WORKLOADS[workload],
    )
    return env


def frontend_env(worker_url: str, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JEV_")}
    env.update(
        PYTHONPATH=f"{REPO / 'services'}:{REPO}",
        JEV_FRONTEND_HOST="127.0.0.1",
        JEV_FRONTEND_PORT=str(port),
        JEV_BACKEND_URL=worker_url,
        JEV_FRONTEND_MAX_CONNECTIONS="1024",
        JEV_LOG_LEVEL="WARNING",
    )
    return env


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as response:
        text = await response.text()
    wanted = (
        "jev_worker_device_seconds_total",
        "jev_worker_forward_seconds_sum",
        "jev_worker_forward_seconds_count",
        "jev_worker_batch_requests_sum",
        "jev_worker_batch_requests_count",
    )
    out: dict[str, float] = {}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        name = series.split("{", 1)[0]  # summed over label sets (the worker labels its series with its model)
        if name in wanted:
            out[name] = out.get(name, 0.0) + float(value)
    return out


async def load(session: aiohttp.ClientSession, url: str, corpus: list[dict], requests: int, concurrency: int):
    """(served seconds, device seconds or None) per request, and the wall time."""
    results: list[tuple[float, float | None]] = []
    counter = iter(range(requests))

    async def client() -> None:
        for i in counter:
            started = time.perf_counter()
            async with session.post(url + "/v1/systemone", json=corpus[i % len(corpus)]) as response:
                await response.read()
                if response.status != 200:
                    raise RuntimeError(f"{url}: {response.status} {(await response.text())[:300]}")
                device = response.headers.get(DEVICE_HEADER)
            results.append((time.perf_counter() - started, float(device) if device is not None else None))

    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return results, time.perf_counter() - started


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


async def measure(workload, target, url, worker_url, worker_pid, corpus, requests, concurrency, session) -> Row:
    before_metrics, before_cpu = await scrape(session, worker_url), cpu_seconds(worker_pid)
    results, wall = await load(session, url, corpus, requests, concurrency)
    after_metrics, after_cpu = await scrape(session, worker_url), cpu_seconds(worker_pid)

    def delta(name: str) -> float:
        return after_metrics.get(name, 0.0) - before_metrics.get(name, 0.0)

    busy = delta("jev_worker_device_seconds_total")
    batches = delta("jev_worker_forward_seconds_count")
    served = [s for s, _ in results]
    if all(d is not None for _, d in results):
        over = [s - d for s, d in results]
    else:  # a real device: the batch's forward time stands for the wait
        over = [s - delta("jev_worker_forward_seconds_sum") / max(batches, 1) for s in served]
    return Row(
        workload=workload,
        target=target,
        concurrency=concurrency,
        requests=len(results),
        served_p50_ms=p50(served) * 1e3,
        over_device_p50_ms=p50(over) * 1e3,
        device_busy=busy / wall,
        decisions_per_s=len(results) / wall,
        device_limit_per_s=len(results) / busy if busy > 0 else None,
        worker_cpu_ms_per_decision=(after_cpu - before_cpu) / len(results) * 1e3,
        batch_requests_mean=delta("jev_worker_batch_requests_sum") / max(delta("jev_worker_batch_requests_count"), 1),
    )


async def run_workload(workload: str, checkpoint: Path, args, log_dir: Path) -> list[Row]:
    worker_port, frontend_port = free_port(), free_port()
    worker_url, frontend_url = f"http://127.0.0.1:{worker_port}", f"http://127.0.0.1:{frontend_port}"
    worker = stack_run.spawn(
        f"worker-{workload}",
        [sys.executable, "-m", "jev_worker"],
        worker_env(workload, checkpoint, worker_port),
        REPO,
        log_dir / f"worker-{workload}.log",
        worker_url,
    )
    procs = [worker]
    try:
        stack_run.wait_healthy(worker, worker_url + "/health", others=[], timeout_s=600, log=lambda *_: None)
        frontend = stack_run.spawn(
            f"frontend-{workload}",
            [sys.executable, "-m", "jev_frontend"],
            frontend_env(worker_url, frontend_port),
            REPO,
            log_dir / f"frontend-{workload}.log",
            frontend_url,
        )
        procs.append(frontend)
        stack_run.wait_healthy(frontend, frontend_url + "/health", others=[worker], timeout_s=120, log=lambda *_: None)
        corpus = load_corpus("mixed")
        rows: list[Row] = []
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            await load(session, worker_url, corpus, 2 * len(corpus), 1)  # warm L1 and L3
            await load(session, frontend_url, corpus, len(corpus), 1)
            for concurrency in args.concurrency:
                requests = max(args.requests, 4 * concurrency)
                parts = {"worker": [], "frontend": []}
                for _ in range(args.rounds):  # interleaved: both targets see the same machine
                    for target, url in (("worker", worker_url), ("frontend", frontend_url)):
                        parts[target].append(
                            await measure(
                                workload,
                                target,
                                url,
                                worker_url,
                                worker.pid,
                                corpus,
                                requests // args.rounds,
                                concurrency,
                                session,
                            )
                        )
                for measured in parts.values():
                    rows.append(merge(measured))
                    say(format_row(rows[-1]))
        return rows
    finally:
        stack_run.stop_all(procs, log=lambda *_: None)


def merge(rows: list[Row]) -> Row:
    """One row from the interleaved rounds: medians of the rounds' figures, requests added."""
    first = rows[0]
    fields = {}
    for name, value in asdict(first).items():
        if isinstance(value, float):
            values = [getattr(r, name) for r in rows if getattr(r, name) is not None]
            fields[name] = statistics.median(values) if values else None
        else:
            fields[name] = value
    fields["requests"] = sum(r.requests for r in rows)
    return Row(**fields)


def say(line: str) -> None:
    print(line, flush=True)


def format_row(row: Row) -> str:
    limit = f"{row.device_limit_per_s:8.0f}" if row.device_limit_per_s else "       -"
    return (
        f"| {row.workload:9} | {row.target:8} | {row.concurrency:4} | {row.served_p50_ms:8.2f} | "
        f"{row.over_device_p50_ms:+8.2f} | {row.device_busy * 100:5.1f}% | {row.decisions_per_s:8.0f} | {limit} | "
        f"{row.worker_cpu_ms_per_decision:7.3f} | {row.batch_requests_mean:5.1f} |"
    )


HEADER = (
    "| workload  | target   |    c | p50 ms   | over dev | busy   | dec/s    | limit    | CPU/dec | batch |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def summary(rows: list[Row]) -> str:
    def pick(workload: str, target: str, concurrency: int) -> Row | None:
        return next((r for r in rows if (r.workload, r.target, r.concurrency) == (workload, target, concurrency)), None)

    worker, frontend = pick("sim-1.5b", "worker", 1), pick("sim-1.5b", "frontend", 1)
    busy = pick("sim-7.35b", "worker", 64)
    if worker is None or frontend is None or busy is None:
        return "host overhead: the summary's rows were not measured (sim-1.5b at c=1, sim-7.35b at c=64)"
    return (
        f"host overhead at c=1: worker +{worker.over_device_p50_ms:.2f} ms, frontend "
        f"+{frontend.over_device_p50_ms:.2f} ms over the device; "
        f"device busy {busy.device_busy * 100:.0f}% at c=64"
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.host_overhead", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "out")
    parser.add_argument("--requests", type=int, default=2000, help="requests per concurrency and target")
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds per concurrency")
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--concurrency", nargs="+", type=int, default=list(CONCURRENCY))
    parser.add_argument("--quick", action="store_true", help="smoke run: 200 requests, c=1 and 64, two rounds")
    args = parser.parse_args(argv)
    if args.quick:
        args.requests, args.rounds, args.concurrency = 200, 2, [1, 64]
        args.workloads = [w for w in args.workloads if w.startswith("sim-")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    checkpoint = args.out / "tiny-checkpoint"
    if not (checkpoint / "config.json").exists():
        make_tiny_text(checkpoint)
    say(f"host overhead on {cpu_description()}")
    say(HEADER)
    rows: list[Row] = []
    for workload in args.workloads:
        rows += asyncio.run(run_workload(workload, checkpoint, args, args.out / "host-overhead-logs"))
    (args.out / "host_overhead.json").write_text(
        json.dumps({"cpu": cpu_description(), "rows": [asdict(r) for r in rows]}, indent=1) + "\n"
    )
    say(summary(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
