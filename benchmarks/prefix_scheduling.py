"""Prefix-aware scheduling vs first-come, side by side in one process (jev_worker/scheduling/scheduler.py,
JEV_SCHEDULE).

The workload is one where the order matters: more distinct prefixes (states) than L3 holds, and more rows waiting
than one batch takes, arrivals interleaved (state 0, 1, ..., S-1, 0, 1, ...). First-come fills each batch with
many prefixes and cycles L3 (an LRU smaller than the cycle misses every time); prefix-aware fills a batch with
one prefix's jobs and computes that prefix once. Each round sends the same shape of workload under both
policies, alternating which goes first, each with fresh state texts (no L1/L3 carry-over between arms).

    python -m benchmarks.prefix_scheduling [--tiny] [--states 12] [--per-state 6] [--l3-states 4] [--rounds 3]

Prints per arm and round: requests/s, L3 hit rate (of requests), worst and median wait; then the ratios; the CPU
is named. `--tiny` runs on a tiny random checkpoint (a smoke test of the run path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

from benchmarks.cpu_speed import cpu_description

WORDS = ("kettle", "lamp", "window", "door", "radio", "oven", "fan", "heater", "clock", "screen", "printer", "fridge")


def state_text(arm: str, round_: int, index: int, sentences: int) -> str:
    noun = WORDS[index % len(WORDS)]
    lines = [
        f"Report {arm}-{round_}-{index}: the {noun} in room {index} was checked at step {k}; "
        f"its reading was {(index * 7 + k * 3) % 97} and nothing else changed."
        for k in range(sentences)
    ]
    return " ".join(lines)


def request(state: str, n: int):
    from jev_common.schema import SystemOneRequest

    return SystemOneRequest.model_validate(
        {
            "model": "jev-latest",
            "state": state,
            "questions": {"q": {"type": "noul", "instructions": f"Is the reading above fifty? (ask {n})"}},
        }
    )


async def arm(service, policy: str, round_: int, args) -> dict:
    scheduler = service.model.scheduler
    scheduler.prefix_aware = policy == "prefix"
    l3 = service.caches.l3
    l3.clear()
    hits_before = l3.hits
    waits: list[float] = []
    outcomes: list[str] = []
    bodies = [
        request(state_text(policy, round_, s, args.sentences), n)
        for n in range(args.per_state)
        for s in range(args.states)
    ]  # interleaved arrivals

    async def one(body):
        started = time.perf_counter()
        _, headers = await service.systemone(body)
        waits.append(time.perf_counter() - started)
        outcomes.append(dict(part.split("=") for part in headers["x-jev-cache"].split(","))["l3"])

    started = time.perf_counter()
    await asyncio.gather(*(one(body) for body in bodies))
    elapsed = time.perf_counter() - started
    return {
        "policy": policy,
        "round": round_,
        "requests": len(bodies),
        "seconds": round(elapsed, 3),
        "requests_per_s": round(len(bodies) / elapsed, 2),
        "l3_hit_rate": round(outcomes.count("hit") / len(outcomes), 3),
        "l3_lookup_hits": l3.hits - hits_before,
        "worst_wait_s": round(max(waits), 3),
        "median_wait_s": round(statistics.median(waits), 3),
    }


async def run(args) -> list[dict]:
    from jev_worker.service import WorkerService
    from jev_worker.settings import WorkerSettings

    overrides = {
        "redis_url": "",  # no cache index: nothing to announce, no connection errors to print
        "register_ttl_s": 0.0,
        "max_batch_rows": args.batch_rows,
        "max_per_client": 0,
        "max_queue": 4096,
    }  # one caller sends the whole workload
    if args.tiny:
        from tools.tiny_checkpoints import make_tiny_text

        folder = tempfile.mkdtemp(prefix="jev-tiny-")
        make_tiny_text(folder)
        overrides.update(model_path=folder, dtype="float32")
    os.environ.setdefault("JEV_LOG_LEVEL", "warning")
    service = WorkerService(WorkerSettings.from_env(**overrides))
    await service.start()
    if service.state != "ok":
        raise SystemExit(f"worker did not start: {service.error}")
    try:
        l3 = service.caches.l3
        await service.systemone(request(state_text("probe", 0, 0, args.sentences), 0))
        one_state = max((l3.get(key).nbytes for key in l3.keys()), default=0)
        if not one_state:
            raise SystemExit("no prefix state was cached: this model reuses none (L3 off)")
        l3.budget = int(one_state * (args.l3_states + 0.5))  # holds --l3-states prefixes, fewer than --states
        rows = []
        for round_ in range(args.rounds):
            for policy in ("fifo", "prefix") if round_ % 2 == 0 else ("prefix", "fifo"):
                row = await arm(service, policy, round_, args)
                print(json.dumps(row), flush=True)
                rows.append(row)
        return rows
    finally:
        await service.stop()


def summary(rows: list[dict]) -> dict:
    def mean(policy, key):
        return statistics.mean(r[key] for r in rows if r["policy"] == policy)

    return {
        "throughput_ratio_prefix_over_fifo": round(
            mean("prefix", "requests_per_s") / mean("fifo", "requests_per_s"), 2
        ),
        "l3_hit_rate": {p: round(mean(p, "l3_hit_rate"), 3) for p in ("fifo", "prefix")},
        "worst_wait_s": {
            p: round(max(r["worst_wait_s"] for r in rows if r["policy"] == p), 3) for p in ("fifo", "prefix")
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random checkpoint (smoke)")
    parser.add_argument("--states", type=int, default=12, help="distinct prefixes (more than --l3-states)")
    parser.add_argument("--per-state", type=int, default=6, help="requests per prefix")
    parser.add_argument("--l3-states", type=int, default=4, help="how many prefix states L3 holds")
    parser.add_argument("--batch-rows", type=int, default=8, help="JEV_MAX_BATCH_ROWS")
    parser.add_argument("--sentences", type=int, default=6, help="sentences per state (prefix length)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    if args.states <= args.l3_states:
        parser.error("--states must exceed --l3-states (the workload is one where L3 cannot hold every prefix)")
    print(f"# CPU: {cpu_description()}", flush=True)
    rows = asyncio.run(run(args))
    print(json.dumps({"summary": summary(rows)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
