"""Bulk decisions: `jev batch` against a naive client loop, and what each does to interactive callers beside it.

The workload is a table's: `--states` states (support tickets of ~170 prompt tokens with the system prompt) and
`--questions` different questions about each, one request per question, in the order a table is labelled a column
at a time (every state's first question, then every state's second, ...): JSONL of OpenAI batch lines. Each arm gets
fresh state texts (nothing carried over in L1 or L3). The stack is the real one, as local processes on free ports:
a worker (the embedded model; `--tiny`: a tiny random checkpoint) and the frontend, every client through the
frontend. No API keys: every caller is one client (one address), the case of a batch and interactive callers on
the same key.

- `interactive`: `--interactive` closed-loop callers, each one request at a time (a fresh state, one question),
  for `--interactive-s` seconds, with nothing else running: their p50/p99 alone (measured twice, before and after
  the runs beside, pooled);
- `naive`: a client loop at `--naive-concurrency` (8) in file order, no bulk marking; `batch`: `jev batch INPUT -o
  OUTPUT` in its own process, its defaults (concurrency 16, window 2048, marked bulk). Each alone (decisions/s, L3 hit
  ratio of its answers), then each again over the first `--beside-states` states with the interactive callers
  running beside it until it ends (their p99 beside it);
- the bound: one capped bulk batch's duration D, the model time (the worker's `jev_worker_forward_seconds`) of as
  many bulk requests of new states as one bulk batch takes (JEV_BULK_MAX_ROWS / JEV_BULK_MAX_TOKENS), sent together
  to the idle stack, the longest of 5. The issue's bound: interactive p99 beside the batch <= p99 alone + D.

    python -m benchmarks.bulk [--tiny] [--states 200] [--questions 10] [--beside-states 60] [--interactive 4]
                              [--interactive-s 40] [--naive-concurrency 8] [--out benchmarks/out/bulk]

Prints one JSON line per arm, then a summary (ratios, the bound) and a markdown table; writes results.json under
--out. Exit status 0 when every request was answered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shutil
import signal
import sys
import time
from pathlib import Path

import aiohttp

from benchmarks.cpu_speed import cpu_description
from benchmarks.loadgen import percentile
from benchmarks.stack import REPO, Stack, get_text, service_env

QUESTIONS = [
    {"type": "noul", "instructions": "Is the customer asking for money back?"},
    {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"Billing": "payments, invoices, refunds", "Technical": None, "Sales": None},
    },
    {"type": "score", "instructions": "How urgent is this ticket?", "criteria": ["Low", "Medium", "High"]},
    {"type": "noul", "instructions": "Does the message mention a deadline?"},
    {
        "type": "choice",
        "instructions": "Which product is the ticket about?",
        "criteria": {"Router": None, "Laptop": None, "Phone": None, "Printer": None},
    },
    {"type": "noul", "instructions": "Is the customer a business?"},
    {"type": "score", "instructions": "How polite is the message?", "criteria": ["Rude", "Neutral", "Polite"]},
    {
        "type": "choice",
        "instructions": "Which register is the message in?",
        "criteria": {"Formal": None, "Casual": None},
    },
    {"type": "noul", "instructions": "Does the message give an order number?"},
    {
        "type": "choice",
        "instructions": "How does the customer want to be contacted?",
        "criteria": {"Email": None, "Phone": None, "Chat": None},
    },
]
PRODUCTS = ("router", "laptop", "phone", "printer", "tablet", "monitor")
ISSUES = ("was charged twice", "stopped working", "arrived damaged", "is missing a part", "keeps restarting")


def ticket(arm: str, index: int, sentences: int = 4) -> str:
    """A support ticket, different for every (arm, index), of about 130 tokens at 4 sentences."""
    product = PRODUCTS[index % len(PRODUCTS)]
    issue = ISSUES[(index // len(PRODUCTS)) % len(ISSUES)]
    head = (
        f"Ticket {arm}-{index} from customer {1000 + index * 7}: my {product} {issue} after the update on day "
        f"{index % 28 + 1}, and support has not answered for {index % 9 + 2} days."
    )
    lines = [head]
    for k in range(sentences - 1):
        lines.append(
            f"Note {k + 1}: order {90000 + index * 13 + k} was placed from branch {index % 17}; the {product} "
            f"was bought {k + index % 5 + 1} months ago and the warranty code is W{(index * 31 + k) % 997}."
        )
    return " ".join(lines)


def batch_lines(arm: str, states: int, questions: int) -> list[dict]:
    """One OpenAI batch line per (state, question), a column of the table at a time."""
    return [
        {
            "custom_id": f"{arm}-s{s}-q{q}",
            "method": "POST",
            "url": "/v1/systemone",
            "body": {"model": "jev-latest", "state": ticket(arm, s), "questions": {"q": QUESTIONS[q % len(QUESTIONS)]}},
        }
        for q in range(questions)
        for s in range(states)
    ]


def l3_outcome(headers) -> str:
    levels = dict(p.split("=", 1) for p in headers.get("x-jev-cache", "").split(",") if "=" in p)
    return levels.get("l3", "")


def l3_ratio(outcomes: list[str]) -> float | None:
    lookups = [o for o in outcomes if o in ("hit", "miss", "bypass")]
    return round(lookups.count("hit") / len(lookups), 3) if lookups else None


# ----- the clients -------------------------------------------------------------------------------------------------
async def naive(url: str, lines: list[dict], concurrency: int) -> dict:
    """A user's own loop: `concurrency` tasks take the next line of the file, in file order; no bulk marking."""
    queue = iter(lines)
    outcomes: list[str] = []
    failed = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failed
        for line in queue:
            async with session.post(url + "/v1/systemone", json=line["body"]) as response:
                await response.read()
                if response.status == 200:
                    outcomes.append(l3_outcome(response.headers))
                else:
                    failed += 1

    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {"answered": len(outcomes), "failed": failed, "wall_s": round(wall, 2), "l3_hit": l3_ratio(outcomes)}


SUMMARY = re.compile(r"jev batch: ([\d,]+) lines? in .*: ([\d,]+) answered.*?(?:, ([\d,]+) failed|, none failed)")
L3_SUMMARY = re.compile(r"L3 hit [\d.]+% \(([\d,]+) of ([\d,]+)\)")
RETRIES = re.compile(r"([\d,]+) retries")


def _count(text: str) -> int:
    return int(text.replace(",", ""))


async def jev_batch(url: str, lines: list[dict], folder: Path) -> dict:
    """`jev batch INPUT -o OUTPUT` as a user runs it (its own process, its defaults); its summary read back."""
    source = folder / f"{lines[0]['custom_id']}.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    output = source.with_suffix(".out.jsonl")
    env = service_env({"JEV_URL": url})
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "jev",
        "batch",
        str(source),
        "-o",
        str(output),
        cwd=str(REPO),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, stderr = await process.communicate()
    wall = time.perf_counter() - started
    said = stderr.decode(errors="replace")
    found = SUMMARY.search(said)
    if found is None:
        raise RuntimeError(f"jev batch exited {process.returncode} without its summary:\n{said[-2000:]}")
    l3 = L3_SUMMARY.search(said)
    retries = RETRIES.search(said)
    return {
        "answered": _count(found.group(2)),
        "failed": _count(found.group(3)) if found.group(3) else 0,
        "wall_s": round(wall, 2),
        "l3_hit": round(_count(l3.group(1)) / _count(l3.group(2)), 3) if l3 else None,
        "retries": _count(retries.group(1)) if retries else 0,
        "exit": process.returncode,
        "output_lines": len(output.read_text().splitlines()),
    }


async def interactive(url: str, callers: int, until, arm: str) -> dict:
    """`callers` closed-loop callers, one request at a time each (a fresh state, one question), until `until()`."""
    latencies: list[float] = []
    failed = 0

    async def caller(session: aiohttp.ClientSession, c: int) -> None:
        nonlocal failed
        rng = random.Random(c)
        i = 0
        while not until():
            body = {
                "model": "jev-latest",
                "state": ticket(f"{arm}-i{c}", i),
                "questions": {"q": QUESTIONS[rng.randrange(len(QUESTIONS))]},
            }
            started = time.perf_counter()
            async with session.post(url + "/v1/systemone", json=body) as response:
                await response.read()
            if response.status == 200:
                latencies.append(time.perf_counter() - started)
            else:
                failed += 1
            i += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await asyncio.gather(*(caller(session, c) for c in range(callers)))
    return {"answered": len(latencies), "failed": failed, "latencies": latencies}


def latency_figures(latencies: list[float]) -> dict:
    ordered = sorted(latencies)
    return {
        "requests": len(ordered),
        "p50_ms": round(1000 * percentile(ordered, 50), 1) if ordered else None,
        "p99_ms": round(1000 * percentile(ordered, 99), 1) if ordered else None,
        "max_ms": round(1000 * ordered[-1], 1) if ordered else None,
    }


async def for_seconds(url: str, callers: int, seconds: float, arm: str) -> dict:
    end = time.monotonic() + seconds
    return await interactive(url, callers, lambda: time.monotonic() >= end, arm)


async def beside(url: str, callers: int, bulk, arm: str) -> tuple[dict, dict]:
    """The bulk client and the interactive callers together, the callers until the bulk client ends."""
    finished = asyncio.Event()

    async def bulk_then_stop():
        try:
            return await bulk
        finally:
            finished.set()

    result, calls = await asyncio.gather(bulk_then_stop(), interactive(url, callers, finished.is_set, arm))
    return result, calls


# ----- the bound ---------------------------------------------------------------------------------------------------
async def forward_seconds(worker_url: str) -> tuple[float, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = await get_text(worker_url + "/metrics")
    values = {}
    for family in text_string_to_metric_families(text):
        if family.name == "jev_worker_forward_seconds":
            for sample in family.samples:
                values[sample.name] = sample.value
    return values.get("jev_worker_forward_seconds_sum", 0.0), values.get("jev_worker_forward_seconds_count", 0.0)


async def capped_bulk_batch_s(url: str, worker_url: str, rows: int, tokens: int, repeats: int = 5) -> dict:
    """The model time of one capped bulk batch of new states: as many bulk requests as the caps let one batch take
    (rows, and tokens counted from one probe's input_tokens), sent together to the idle stack; the longest of
    `repeats`."""
    headers = {"x-jev-priority": "bulk"}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:

        async def ask(state: str) -> dict:
            body = {"model": "jev-latest", "state": state, "questions": {"q": QUESTIONS[1]}}
            async with session.post(url + "/v1/systemone", json=body, headers=headers) as response:
                response.raise_for_status()
                return await response.json()

        probe = await ask(ticket("probe", 0))
        per_request = max(1, probe["usage"]["input_tokens"])
        take = max(1, min(rows, tokens // per_request if tokens else rows))
        runs = []
        for r in range(repeats):
            before = await forward_seconds(worker_url)
            await asyncio.gather(*(ask(ticket(f"probe{r}", s)) for s in range(take)))
            after = await forward_seconds(worker_url)
            runs.append({"seconds": round(after[0] - before[0], 4), "batches": int(after[1] - before[1])})
    return {
        "requests": take,
        "tokens_per_request": per_request,
        "runs": runs,
        "seconds": max(run["seconds"] for run in runs),
    }


def bulk_caps() -> dict:
    """What one bulk batch may take on the worker started here (it reads this environment): rows and tokens, as
    the scheduler's budget for a bulk batch (0 tokens: unbounded)."""
    from jev_common.recipe import load_recipe
    from jev_worker.settings import ENV

    recipe = load_recipe(ENV["JEV_RECIPE"].get())
    rows = min(ENV["JEV_BULK_MAX_ROWS"].get(), ENV["JEV_MAX_BATCH_ROWS"].get(recipe.batching.max_batch_rows))
    tokens = [t for t in (ENV["JEV_BULK_MAX_TOKENS"].get(), ENV["JEV_MAX_BATCH_TOKENS"].get()) if t]
    return {"rows": rows, "tokens": min(tokens, default=0)}


# ----- the run -----------------------------------------------------------------------------------------------------
def bulk_row(arm: str, result: dict) -> dict:
    answered, wall = result["answered"], result["wall_s"]
    return {"arm": arm, **result, "decisions_per_s": round(answered / wall, 2) if wall else None}


async def run(args) -> dict:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = {"JEV_REDIS_URL": "redis://127.0.0.1:1/0", "JEV_WORKER_REGISTER_TTL_S": "0", "JEV_LOG_LEVEL": "warning"}
    if args.torch_threads:
        env["JEV_TORCH_THREADS"] = str(args.torch_threads)
    if args.l3_bytes:
        env["JEV_CACHE_L3_BYTES"] = args.l3_bytes
    if args.tiny:
        from tools.tiny_checkpoints import make_tiny_text

        env["JEV_MODEL_PATH"] = str(make_tiny_text(out / "tiny-checkpoint"))
        env["JEV_DTYPE"] = "float32"
    rows = []
    async with Stack(out / "logs") as stack:
        worker = await stack.worker("worker", **env)
        front = await stack.frontend("frontend", worker.url, JEV_REDIS_URL=env["JEV_REDIS_URL"])
        await stack.wait_healthy()
        url = front.url
        health = worker.health
        bulk_env = bulk_caps()
        await naive(url, batch_lines("warm", 2, 2), 2)  # first forwards (allocator, kernels) out of the way
        bound = await capped_bulk_batch_s(url, worker.url, bulk_env["rows"], bulk_env["tokens"])
        print(json.dumps({"capped_bulk_batch": bound}), flush=True)
        folder = out / "files"  # the tables and jev batch's outputs
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        alone_latencies: list[float] = []

        async def interactive_alone(tag: str) -> None:
            calls = await for_seconds(url, args.interactive, args.interactive_s / 2, f"alone{tag}")
            alone_latencies.extend(calls["latencies"])
            row = {"arm": f"interactive alone ({tag})", **latency_figures(calls["latencies"])}
            print(json.dumps(row), flush=True)

        await interactive_alone("1")
        for name in ("batch", "naive") if not args.naive_first else ("naive", "batch"):
            lines = batch_lines(f"{name}-beside", args.beside_states, args.questions)
            client = jev_batch(url, lines, folder) if name == "batch" else naive(url, lines, args.naive_concurrency)
            result, calls = await beside(url, args.interactive, client, f"{name}-beside")
            row = bulk_row(f"{name} + interactive", result) | {
                "interactive": latency_figures(calls["latencies"]),
                "interactive_failed": calls["failed"],
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
        await interactive_alone("2")
        for name in ("naive", "batch") if not args.naive_first else ("batch", "naive"):
            lines = batch_lines(name, args.states, args.questions)
            result = await (
                jev_batch(url, lines, folder) if name == "batch" else naive(url, lines, args.naive_concurrency)
            )
            row = bulk_row(name, result)
            print(json.dumps(row), flush=True)
            rows.append(row)
    alone = latency_figures(alone_latencies)
    return {
        "cpu": cpu_description(),
        "model": "tiny" if args.tiny else "smollm2-135m-cpu",
        "worker": {k: health.get("detail", {}).get(k) for k in ("recipe", "checkpoint", "serving")},
        "torch_threads": args.torch_threads or "default",
        "l3_bytes": args.l3_bytes or "recipe",
        "args": vars(args),
        "loadavg_end": round(os.getloadavg()[0], 1),
        "bulk_caps": bulk_env,
        "capped_bulk_batch": bound,
        "interactive_alone": alone,
        "rows": rows,
        "summary": summarize(rows, alone, bound["seconds"]),
    }


def summarize(rows: list[dict], alone: dict, bound_s: float) -> dict:
    by_arm = {row["arm"]: row for row in rows}
    batch, naive_ = by_arm["batch"], by_arm["naive"]
    limit_ms = alone["p99_ms"] + 1000 * bound_s if alone["p99_ms"] is not None else None
    beside_batch = by_arm["batch + interactive"]["interactive"]["p99_ms"]
    return {
        "throughput_ratio_batch_over_naive": round(batch["decisions_per_s"] / naive_["decisions_per_s"], 2),
        "l3_hit": {"batch": batch["l3_hit"], "naive": naive_["l3_hit"]},
        "interactive_p99_ms": {
            "alone": alone["p99_ms"],
            "beside batch": beside_batch,
            "beside naive": by_arm["naive + interactive"]["interactive"]["p99_ms"],
        },
        "bound_ms": round(limit_ms, 1) if limit_ms is not None else None,
        "within_bound": beside_batch is not None and limit_ms is not None and beside_batch <= limit_ms,
    }


def markdown(result: dict) -> str:
    head = "| arm | lines | dec/s | L3 hit | interactive p50 / p99 ms beside |\n|---|---|---|---|---|"
    lines = [head]
    for row in result["rows"]:
        beside_ = row.get("interactive")
        figures = f"{beside_['p50_ms']} / {beside_['p99_ms']}" if beside_ else "-"
        lines.append(f"| {row['arm']} | {row['answered']} | {row['decisions_per_s']} | {row['l3_hit']} | {figures} |")
    alone = result["interactive_alone"]
    lines.append(f"| interactive alone | {alone['requests']} | - | - | {alone['p50_ms']} / {alone['p99_ms']} |")
    return "\n".join(lines)


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random checkpoint and a small workload (smoke)")
    parser.add_argument("--states", type=int, default=None, help="states of the alone runs (default 200; tiny 8)")
    parser.add_argument("--questions", type=int, default=None, help="questions per state (default 10; tiny 3)")
    parser.add_argument("--beside-states", type=int, default=None, help="states of the runs beside (60; tiny 4)")
    parser.add_argument("--interactive", type=int, default=4, help="closed-loop interactive callers")
    parser.add_argument(
        "--interactive-s", type=float, default=None, help="seconds of interactive callers alone (40; tiny 1)"
    )
    parser.add_argument("--naive-concurrency", type=int, default=8)
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="the worker's JEV_TORCH_THREADS (0: its default, every CPU)"
    )
    parser.add_argument(
        "--l3-bytes", help="the worker's JEV_CACHE_L3_BYTES (default the recipe's, 512M: about 65 of these prefixes)"
    )
    parser.add_argument("--naive-first", action="store_true", help="run the naive client before jev batch")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "out" / "bulk"))
    args = parser.parse_args(argv)
    for name, full, tiny in (
        ("states", 200, 8),
        ("questions", 10, 3),
        ("beside_states", 60, 4),
        ("interactive_s", 40.0, 1.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, tiny if args.tiny else full)
    print(f"# CPU: {cpu_description()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops the stack's processes too, as Ctrl-C does
    started = time.perf_counter()
    result = asyncio.run(run(args))
    result["wall_s"] = round(time.perf_counter() - started, 1)
    Path(args.out, "results.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({"summary": result["summary"], "wall_s": result["wall_s"]}), flush=True)
    print(markdown(result), flush=True)
    failed = sum(row["failed"] for row in result["rows"]) + sum(
        row.get("interactive_failed", 0) for row in result["rows"]
    )
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
