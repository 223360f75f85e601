"""Prefix-aware routing vs round-robin over two worker replicas, in one run.

    PYTHONPATH=services:. python -m benchmarks.routing [--states 16 --repeats 6 --concurrency 4
        --l3-bytes 64M --model-path DIR --json out.json]

Starts two replicas of the embedded SmolLM2 (or `--model-path`, e.g. a tiny checkpoint) announcing
themselves in Redis, then two frontends over the same replicas: one with `JEV_ROUTING=prefix`, one
with `JEV_ROUTING=round_robin`. Each frontend gets the same workload shape on its own states (so
neither profits from the other's warm caches): `--states` states, each asked `--repeats` different
questions, in a shuffled order, at `--concurrency`. The L3 budget of each replica (`--l3-bytes`) is
set so that one replica holds about half the states: sharding states by where they are warm is what
lets two replicas cache twice as much. Prints decisions/s, p50/p95 and the replicas' L3 hit rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path

import aiohttp

from .loadgen import run_load
from .stack import Stack, get_json

TOPICS = [
    "invoice",
    "delivery",
    "password reset",
    "refund",
    "upgrade",
    "outage",
    "contract",
    "login",
    "shipping address",
    "discount",
    "data export",
    "API quota",
    "cancellation",
    "warranty",
    "billing cycle",
    "account merge",
    "two-factor",
    "webhook",
    "latency",
    "pricing",
]
QUESTIONS = [
    "Is the customer asking for money back?",
    "Is the customer angry?",
    "Does this need an engineer?",
    "Is the request urgent?",
    "Should sales be told?",
    "Is this a security issue?",
    "Is the customer a business?",
    "Will a template reply do?",
]


def state_text(run: str, i: int) -> str:
    topic = TOPICS[i % len(TOPICS)]
    return (
        f"[{run} ticket #{i}] Hello support, I am writing about my {topic}. Last week I contacted you twice "
        f"and the problem with the {topic} is still not solved; the reference number is {1000 + i}. I use the "
        f"product every day for my team of {5 + i} people, and this issue blocks our work on the {topic}. "
        "Please look at the history of this ticket and tell me what you will do and by when."
    )


def workload(run: str, states: int, repeats: int, seed: int) -> list[dict]:
    bodies = [
        {
            "model": "jev-latest",
            "state": state_text(run, i),
            "questions": {"q": {"type": "noul", "instructions": QUESTIONS[r % len(QUESTIONS)]}},
        }
        for i in range(states)
        for r in range(repeats)
    ]
    random.Random(seed).shuffle(bodies)
    return bodies


async def l3_totals(urls: list[str]) -> tuple[int, int]:
    hits = misses = 0
    for url in urls:
        l3 = (await get_json(url + "/v1/cache/stats"))["levels"]["l3"]
        hits, misses = hits + l3["hits"], misses + l3["misses"]
    return hits, misses


async def reset(urls: list[str]) -> None:
    async with aiohttp.ClientSession() as session:
        for url in urls:
            async with session.post(url + "/v1/cache/reset") as resp:
                resp.raise_for_status()


async def run(args: argparse.Namespace) -> dict:
    redis_url = f"redis://127.0.0.1:6379/{args.redis_db}"
    env = {
        "JEV_REDIS_URL": redis_url,
        "JEV_DEVICE": "cpu",
        "JEV_TORCH_THREADS": str(args.threads),
        "JEV_CACHE_L3_BYTES": args.l3_bytes,
        "JEV_WORKER_REGISTER_TTL_S": "5",
    }
    if args.model_path:
        env.update(JEV_MODEL_PATH=args.model_path, JEV_DTYPE="float32")
    results = {}
    with tempfile.TemporaryDirectory(prefix="jev-routing-bench-") as logs:
        async with Stack(logs) as stack:
            workers = [await stack.worker(name, **env) for name in ("r1", "r2")]
            await stack.wait_healthy(workers, timeout_s=args.start_timeout)
            urls = [w.url for w in workers]
            backends = ",".join(urls)
            # JEV_BACKEND_URL="" (set, empty): JEV_BACKENDS is the whole list
            fronts = {
                mode: await stack.frontend(
                    f"front-{mode}",
                    "",
                    JEV_BACKEND_URL="",
                    JEV_BACKENDS=backends,
                    JEV_ROUTING=mode,
                    JEV_REDIS_URL=redis_url,
                )
                for mode in ("prefix", "round_robin")
            }
            await stack.wait_healthy(list(fronts.values()), timeout_s=120)
            for mode, front in fronts.items():
                corpus = workload(mode, args.states, args.repeats, args.seed)
                await reset(urls)
                report = await run_load(
                    front.url,
                    corpus,
                    concurrency=args.concurrency,
                    requests=len(corpus),
                    timeout_s=120,
                    max_seconds=args.max_seconds,
                )
                hits, misses = await l3_totals(urls)
                results[mode] = {
                    "decisions_per_s": report.decisions_per_s,
                    "p50_ms": report.p50_ms,
                    "p95_ms": report.p95_ms,
                    "ok": report.ok,
                    "sent": report.sent,
                    "l3_hits": hits,
                    "l3_misses": misses,
                    "l3_hit_rate": hits / (hits + misses) if hits + misses else 0.0,
                }
    return results


def table(results: dict, args: argparse.Namespace) -> str:
    lines = [
        (
            f"routing over 2 replicas: {args.states} states x {args.repeats} questions, concurrency "
            f"{args.concurrency}, L3 {args.l3_bytes} per replica"
        ),
        "| routing | ok | decisions/s | p50 ms | p95 ms | L3 hit rate |",
        "|---|---|---|---|---|---|",
    ]
    for mode, r in results.items():
        lines.append(
            f"| {mode} | {r['ok']}/{r['sent']} | {r['decisions_per_s']:.2f} | {r['p50_ms']:.1f} | "
            f"{r['p95_ms']:.1f} | {r['l3_hit_rate']:.1%} ({r['l3_hits']}/{r['l3_hits'] + r['l3_misses']}) |"
        )
    if {"prefix", "round_robin"} <= set(results):
        p, rr = results["prefix"], results["round_robin"]
        lines.append(
            f"prefix-aware vs round-robin: x{p['decisions_per_s'] / rr['decisions_per_s']:.2f} decisions/s, "
            f"p50 {rr['p50_ms']:.1f} -> {p['p50_ms']:.1f} ms, L3 hit rate "
            f"{rr['l3_hit_rate']:.1%} -> {p['l3_hit_rate']:.1%}"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.routing", description=__doc__.split("\n")[0])
    parser.add_argument("--states", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--l3-bytes", default="64M", help="each replica's L3 budget (about half the states)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--model-path", default=None, help="a local checkpoint instead of the embedded SmolLM2")
    parser.add_argument("--redis-db", type=int, default=9)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-seconds", type=float, default=600)
    parser.add_argument("--start-timeout", type=float, default=300)
    parser.add_argument("--json", default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not 2 <= args.states <= 256 or not 1 <= args.repeats <= 64 or not 1 <= args.concurrency <= 64:
        parser.error("--states 2..256, --repeats 1..64, --concurrency 1..64")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = asyncio.run(run(args))
    print(table(results, args))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0 if all(r["ok"] == r["sent"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
