"""Soak: the stack (a frontend with rate limits on, routing to a worker, Redis) under steady mixed load at a share of
its measured capacity for a long time, with hostile requests and disconnecting clients mixed in; per window, what
would show a leak: RSS and open file descriptors of every service process, the tasks alive on each service's event
loop (`jev_<service>_asyncio_tasks`), the keys in the stack's Redis db, and the answered decisions' p50/p99.

    python -m benchmarks.soak                         # 60 minutes at 70% of capacity, 5-minute windows
    python -m benchmarks.soak --minutes 20 --window-minutes 2 --model tiny

The worker's caches are sized to fill during warm-up (`--l1-max`, `--l3-bytes`): 40% of the mix are states never
seen before, and a server that has run for a while has full caches. A cache still filling grows the worker's RSS and
the index's route keys (one per resident prefix) by design, which is not a leak; each window also shows the caches'
fill (`worker.l1_entries`, `worker.l3_mb`), so what grows beyond full caches stands out.

First the capacity: decisions/s of the same mix (without the hostile and disconnecting share) from closed-loop
clients for `--capacity-s`. Then open-loop arrivals (Poisson) at `--load` x capacity. The first window is warm-up;
each measure is "flat" when its last window is within 5% (`--flat-pct`) of the first window after warm-up (a measure
that only counts, such as file descriptors, may also move by 2 for noise). Exit status 1 when any request failed (a
500, a 5xx to a hostile request, an answer lost) or a resource (RSS, FDs, tasks, Redis keys) grew; latency that is not
flat is reported, not failed (a shared machine's neighbours move it).
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import os
import random
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fuzz_api import cpu_model
from benchmarks.loadgen import percentile
from benchmarks.stack import Stack, get_json, get_text
from jev_frontend.buckets import KEY_PREFIX

EMBEDDED = "smollm2-135m-cpu"
RESOURCES = ("rss_mb", "fds", "asyncio_tasks")  # per service process
FLAT_SLACK_COUNT = 2  # a count (FDs, tasks, keys) may move by this much and still be flat
TIMEOUT = aiohttp.ClientTimeout(total=120)
WORDS = [
    "lamp",
    "kettle",
    "door",
    "window",
    "invoice",
    "refund",
    "train",
    "river",
    "coffee",
    "ticket",
    "printer",
    "garden",
]


# ----- the mix ---------------------------------------------------------------------------------------------------
def decision(rng: random.Random) -> dict:
    """A valid request: envelope or single-question form, each question type, states often repeated (L1/L3 hits)
    and sometimes new."""
    repeated = rng.random() < 0.6
    words = [rng.choice(WORDS) for _ in range(rng.randint(3, 40))]
    state = f"state {rng.randint(0, 30)}: the lamp is on." if repeated else " ".join(words) + f" #{rng.random()}"
    kind = rng.choice(("noul", "choice", "score", "set", "single"))
    if kind == "single":
        return {"kind": "choice", "state": state, "question": "Which one?", "options": ["yes", "no", "maybe"]}
    question = {
        "noul": {"type": "noul", "instructions": "Is it on?"},
        "choice": {"type": "choice", "instructions": "Which?", "criteria": {w: None for w in WORDS[:4]}},
        "score": {"type": "score", "instructions": "How bright?", "criteria": ["dark", "dim", "bright"]},
        "set": {"type": "set", "criteria": {"on": "the lamp is on", "warm": "it is warm"}},
    }[kind]
    return {"model": "jev-latest", "state": state, "questions": {"q": question}}


def hostile(rng: random.Random) -> tuple[bytes, dict[str, str]]:
    """A request that must be refused with a 4xx in the API's shape, never a 5xx or a hang."""
    good = json.dumps(decision(rng)).encode()
    choice = rng.randrange(9)
    if choice == 0:
        return b'{"model": "jev-latest", "state": "x", "questions": {', {"Content-Type": "application/json"}
    if choice == 1:
        return good, {"Content-Type": "application/json", "Content-Encoding": "gzip"}  # says gzip, is not
    if choice == 2:
        return gzip.compress(good), {"Content-Type": "application/json", "Content-Encoding": "br"}  # not decoded
    if choice == 3:
        body = {"model": "jev-latest", "state": "x", "questions": {"q": {"type": "score", "criteria": ["a", 1e400]}}}
        return json.dumps(body).replace("Infinity", "1" + "0" * 5000).encode(), {"Content-Type": "application/json"}
    if choice == 4:  # a lone surrogate: valid JSON text, no valid Unicode
        return json.dumps(decision(rng) | {"state": "odd \ud800 text"}).encode(), {"Content-Type": "text/json"}
    if choice == 5:
        return b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--", {"Content-Type": "multipart/form-data; b=1"}
    if choice == 6:
        return good, {"Content-Type": "application/json", "x-jev-deadline-s": rng.choice(["-1", "nan", "1e999"])}
    if choice == 7:
        return b"[" * 100_000, {"Content-Type": "application/json"}
    return good, {"Content-Type": "application/xml"}


# ----- measuring -------------------------------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def labelled(text: str, name: str, **labels: str) -> float | None:
    """The sample of `name` whose labels include `labels`."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return None


@dataclass
class Window:
    index: int
    started: float
    samples: dict[str, list[float]] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)

    def add(self, name: str, value: float | None) -> None:
        if value is not None:
            self.samples.setdefault(name, []).append(value)

    def row(self) -> dict:
        lat = sorted(self.latencies)
        row = {name: sum(values) / len(values) for name, values in sorted(self.samples.items())}
        row["p50_ms"] = (percentile(lat, 50) or 0) * 1000
        row["p99_ms"] = (percentile(lat, 99) or 0) * 1000
        row["answered"] = len(lat)
        return row


@dataclass
class Soak:
    url: str  # the frontend
    services: dict  # name -> benchmarks.stack.Service
    redis_url: str
    rate: float
    hostile_share: float
    disconnect_share: float
    rng: random.Random
    key_patterns: tuple[str, ...]
    windows: list[Window] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    outcomes: Counter = field(default_factory=Counter)

    async def run(self, seconds: float, window_s: float, sample_s: float) -> None:
        self.windows = [Window(0, time.monotonic())]
        stop = time.monotonic() + seconds
        async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
            sampler = asyncio.ensure_future(self._sample(session, window_s, sample_s, stop))
            pending: set[asyncio.Task] = set()
            next_at = time.monotonic()
            while time.monotonic() < stop:
                next_at += self.rng.expovariate(self.rate)
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
                task = asyncio.ensure_future(self._one(session))
                pending.add(task)
                task.add_done_callback(pending.discard)
            if pending:
                await asyncio.wait(pending, timeout=150)
            await sampler

    async def _one(self, session: aiohttp.ClientSession) -> None:
        roll = self.rng.random()
        if roll < self.hostile_share:
            body, headers = hostile(self.rng)
            status = await self._send(session, body, headers, "hostile")
            if status is not None and not 400 <= status < 500:
                self.failures.append(f"hostile request answered {status}: {body[:120]!r} {headers}")
            return
        body, headers = json.dumps(decision(self.rng)).encode(), {"Content-Type": "application/json"}
        if roll < self.hostile_share + self.disconnect_share:
            try:  # a client that leaves before its answer
                async with asyncio.timeout(self.rng.uniform(0.001, 0.05)):
                    await self._send(session, body, headers, "disconnected")
            except TimeoutError:
                self.outcomes["disconnected"] += 1
            return
        started = time.perf_counter()
        status = await self._send(session, body, headers, "decision")
        if status == 200:
            self.windows[-1].latencies.append(time.perf_counter() - started)

    async def _send(self, session, body: bytes, headers: dict, what: str) -> int | None:
        try:
            async with session.post(self.url + "/v1/systemone", data=body, headers=headers) as resp:
                payload = await resp.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            if what != "disconnected":
                self.failures.append(f"{what}: no answer: {type(exc).__name__}: {exc}")
            return None
        self.outcomes[f"{what} {resp.status}"] += 1
        self.windows[-1].outcomes[f"{what} {resp.status}"] += 1
        if resp.status >= 500 or (what == "decision" and resp.status not in (200, 429)):
            self.failures.append(f"{what} answered {resp.status}: {payload[:200]!r}")
        return resp.status

    async def _keys(self, client) -> int:
        """The stack's keys: its worker's namespace in the cache index and the rate limits' buckets (the db is shared
        with whatever else runs on this Redis, which is not counted)."""
        total = 0
        for pattern in self.key_patterns:
            async for _ in client.scan_iter(match=pattern, count=1000):
                total += 1
        return total

    async def _sample(self, session, window_s: float, sample_s: float, stop: float) -> None:
        import redis.asyncio as redis

        client = redis.Redis.from_url(self.redis_url)
        try:
            while True:
                now = time.monotonic()
                window = self.windows[-1]
                for name, service in self.services.items():
                    pid = service.process.pid
                    window.add(f"{name}.rss_mb", rss_mb(pid))
                    window.add(f"{name}.fds", open_fds(pid))
                    text = await get_text(service.url + "/metrics", timeout_s=30)
                    window.add(f"{name}.asyncio_tasks", labelled(text, f"jev_{name}_asyncio_tasks"))
                    if name == "frontend":
                        window.add("frontend.affinity_entries", labelled(text, "jev_frontend_route_affinity_entries"))
                    if name == "worker":
                        l3 = labelled(text, "jev_worker_cache_resident_bytes", level="l3")
                        window.add("worker.l3_mb", None if l3 is None else l3 / 2**20)
                        window.add("worker.l1_entries", labelled(text, "jev_worker_cache_resident_entries", level="l1"))
                window.add("redis_keys", await self._keys(client))
                if now >= stop:
                    return
                if now - window.started >= window_s:
                    self.windows.append(Window(len(self.windows), now))
                await asyncio.sleep(min(sample_s, max(0.0, stop - time.monotonic())))
        finally:
            await client.aclose()


def judge(rows: list[dict], flat_pct: float, warmup: int) -> dict[str, dict]:
    """Per measure: its value in the first window after warm-up and in the last, the growth, and whether it is flat."""
    if len(rows) <= warmup:
        return {}
    base, last = rows[warmup], rows[-1]
    out = {}
    for name in base:
        if name == "answered" or name not in last:
            continue
        grew = last[name] - base[name]
        pct = 100.0 * grew / base[name] if base[name] else (0.0 if grew == 0 else float("inf"))
        counted = name.endswith(("fds", "asyncio_tasks", "redis_keys"))
        flat = pct < flat_pct or (counted and grew <= FLAT_SLACK_COUNT)
        out[name] = {
            "first": round(base[name], 2),
            "last": round(last[name], 2),
            "growth_pct": round(pct, 1),
            "flat": flat,
        }
    return out


def table(rows: list[dict], window_s: float) -> str:
    names = list(rows[0]) if rows else []
    head = "| window (min) | " + " | ".join(names) + " |"
    lines = [head, "|" + "---|" * (len(names) + 1)]
    for i, row in enumerate(rows):
        span = f"{i * window_s / 60:g}-{(i + 1) * window_s / 60:g}"
        lines.append(f"| {span} | " + " | ".join(f"{row.get(n, 0):.1f}" for n in names) + " |")
    return "\n".join(lines)


# ----- capacity ----------------------------------------------------------------------------------------------------
async def capacity(url: str, seconds: float, concurrency: int, rng: random.Random) -> float:
    """Decisions/s of the valid mix from `concurrency` closed-loop clients."""
    done = 0
    stop = time.monotonic() + seconds

    async def client(session):
        nonlocal done
        while time.monotonic() < stop:
            async with session.post(url + "/v1/systemone", json=decision(rng)) as resp:
                await resp.read()
                done += resp.status == 200

    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return done / (time.monotonic() - started)


# ----- the stack ---------------------------------------------------------------------------------------------------
async def start(stack: Stack, args, out: Path) -> tuple[dict, str]:
    env = dict(JEV_DEVICE="cpu", JEV_REDIS_URL=args.redis_url, JEV_TORCH_THREADS=str(args.torch_threads))
    if args.model == "tiny":
        from tools.tiny_checkpoints import make_tiny_text

        env |= dict(
            JEV_RECIPE=EMBEDDED,
            JEV_MODEL_PATH=str(make_tiny_text(out / "tiny-checkpoint", seed=43)),
            JEV_DTYPE="float32",
        )
    # one caller (this process) sends everything: its share of the queue may be the whole queue
    env |= dict(JEV_MAX_QUEUE="512", JEV_MAX_PER_CLIENT="512")
    env |= dict(JEV_CACHE_L1_MAX=str(args.l1_max), JEV_CACHE_L3_BYTES=args.l3_bytes)  # full within the warm-up
    worker, frontend = await stack.worker_and_frontend(
        {**env, "JEV_WORKER_ID": f"soak-{secrets.token_hex(4)}"},
        # rate limits on (buckets in Redis, headers on every answer), never reached
        dict(JEV_REDIS_URL=args.redis_url, JEV_RATE_LIMITS="default=100000000:0"),
        worker_timeout_s=600,
    )
    return {"frontend": frontend, "worker": worker}, frontend.url


async def _run(args, out: Path) -> dict:
    rng = random.Random(args.seed)
    async with Stack(out / "logs") as stack:
        services, url = await start(stack, args, out)
        measured = await capacity(url, args.capacity_s, args.capacity_concurrency, rng)
        rate = max(0.5, measured * args.load)
        print(f"capacity {measured:.1f} decisions/s; soaking at {rate:.1f}/s for {args.minutes:g} min", flush=True)
        health = await get_json(services["worker"].url + "/health")
        patterns = (f"jev:{health['detail']['index']['namespace']}:*", KEY_PREFIX + "*", "jev:worker:soak-*")
        soak = Soak(url, services, args.redis_url, rate, args.hostile, args.disconnect, rng, patterns)
        await soak.run(args.minutes * 60, args.window_minutes * 60, args.sample_s)
        exits = {name: service.process.returncode for name, service in services.items()}
    rows = [w.row() for w in soak.windows if w.samples]
    verdicts = judge(rows, args.flat_pct, args.warmup_windows)
    died = {name: code for name, code in exits.items() if code is not None}
    return {
        "cpu": cpu_model(),
        "model": args.model,
        "minutes": args.minutes,
        "window_minutes": args.window_minutes,
        "capacity_per_s": round(measured, 2),
        "rate_per_s": round(rate, 2),
        "windows": rows,
        "flat": verdicts,
        "outcomes": dict(soak.outcomes),
        "failures": soak.failures[:50] + [f"{name} exited {code} during the soak" for name, code in died.items()],
        "failure_count": len(soak.failures) + len(died),
        "table": table(rows, args.window_minutes * 60),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--window-minutes", type=float, default=5.0)
    parser.add_argument("--sample-s", type=float, default=10.0, help="how often resources are read")
    parser.add_argument("--load", type=float, default=0.7, help="share of the measured capacity (default 0.7)")
    parser.add_argument("--capacity-s", type=float, default=60.0)
    parser.add_argument("--capacity-concurrency", type=int, default=8)
    parser.add_argument("--hostile", type=float, default=0.1, help="share of hostile requests")
    parser.add_argument("--disconnect", type=float, default=0.05, help="share of clients that leave early")
    parser.add_argument("--flat-pct", type=float, default=5.0)
    parser.add_argument("--warmup-windows", type=int, default=1)
    parser.add_argument("--model", choices=("tiny", "smollm2"), default="smollm2")
    parser.add_argument("--l1-max", type=int, default=1024, help="the worker's L1 entries (full within the warm-up)")
    parser.add_argument("--l3-bytes", default="16M", help="the worker's L3 budget (full within the warm-up)")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--redis-url", default=os.environ.get("JEV_SOAK_REDIS_URL", "redis://127.0.0.1:6379/14"))
    parser.add_argument("--out", help="folder for logs and results.json (default: a temporary one)")
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="jev-soak-"))
    out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(_run(args, out))
    (out / "results.json").write_text(json.dumps(result, indent=2) + "\n")
    print(result["table"])
    for name, verdict in result["flat"].items():
        print(
            f"{name}: {verdict['first']} -> {verdict['last']} ({verdict['growth_pct']:+.1f}%) "
            f"{'flat' if verdict['flat'] else 'NOT FLAT'}"
        )
    for failure in result["failures"]:
        print("FAILED:", failure)
    print(json.dumps({k: result[k] for k in ("cpu", "capacity_per_s", "rate_per_s", "outcomes", "failure_count")}))
    print(f"results: {out / 'results.json'}")
    grew = [n for n, v in result["flat"].items() if not v["flat"] and not n.startswith(("p50", "p99"))]
    return 1 if result["failure_count"] or grew else 0


if __name__ == "__main__":
    sys.exit(main())
