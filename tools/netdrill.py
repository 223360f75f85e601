"""Failure drills across hosts on one machine: network namespaces as hosts, joined by a bridge in a namespace of
its own (nothing here can reach past the namespaces this tool makes), addresses in 198.18.0.0/24 (RFC 2544's
benchmarking range). Redis on one host, two frontends, three workers on a tiny checkpoint, the client on its own.

    sudo python -m tools.netdrill [--drills kill9,sigterm,redis,cut,slow,frontend] [--json out.json]

Each drill runs a bounded open-loop request stream (Poisson arrivals at `--rate` per second, as many independent
clients make) against both frontends (the client retries as typesafe-sdk does: two
retries, backoff from 0.5 s doubling to 5 s with 25 % jitter, on connection errors, timeouts, 408, 429 and 5xx,
Retry-After honoured; attempts alternate between the frontends as a load balancer in front of them would) for a
`before` phase, injects the fault, holds it for `during`, recovers, and measures `after`. Per drill: requests
failed after retries, attempts that failed, time to reroute (from the fault until every live frontend has the
victim out of rotation, or the index rebuilt for the Redis drill), and p50/p99 latency per phase.

1. kill9: worker host w1 dies under load: `kill -9` of every process in its namespace and its link down (a
   powered-off host answers nothing, not even a reset), back after the fault phase.
2. sigterm: SIGTERM to worker w2 (a rolling update: it drains, the frontends retry its 503s elsewhere), then a
   new w2 starts.
3. redis: Redis killed and restarted empty after 3 s: requests keep being answered, the index is rebuilt.
4. cut: w3's link down for the fault phase (a partition), then up again.
5. slow: 200 ms added per chunk and 5 % of connections reset on the path to w3 (tools/fault_proxy.py; this kernel
   has no netem): the other workers' p99 is reported beside w3's.
6. frontend: `kill -9` of frontend fe1; the client's retries reach fe2; fe1 restarts after the fault phase.

Needs root (network namespaces), `ip`, and `redis-server`; every namespace and process it made is removed at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NET = "198.18.0"
HOSTS = {"redis": 2, "w1": 11, "w2": 12, "w3": 13, "fe1": 21, "fe2": 22, "client": 30}
WORKERS = ("w1", "w2", "w3")
FRONTENDS = ("fe1", "fe2")
PROXY_PORT = 8001  # w3 is announced behind the fault proxy (drill 5)
CLONE_NEWNET = 0x40000000
DRILLS = ("kill9", "sigterm", "redis", "cut", "slow", "frontend")


def addr(host: str) -> str:
    return f"{NET}.{HOSTS[host]}"


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(argv, check=check, capture_output=True, text=True)


class Topology:
    """Namespaces `<prefix>-<host>`, each with eth0 on a bridge in `<prefix>-sw`."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.switch = f"{prefix}-sw"

    def ns(self, host: str) -> str:
        return f"{self.prefix}-{host}"

    def up(self) -> None:
        self.down()
        sh("ip", "netns", "add", self.switch)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        for host in HOSTS:
            ns = self.ns(host)
            sh("ip", "netns", "add", ns)
            sh(
                "ip",
                "link",
                "add",
                f"{self.prefix}h{HOSTS[host]}",
                "type",
                "veth",
                "peer",
                "name",
                f"{self.prefix}p{HOSTS[host]}",
            )
            sh("ip", "link", "set", f"{self.prefix}h{HOSTS[host]}", "netns", ns, "name", "eth0")
            sh("ip", "link", "set", f"{self.prefix}p{HOSTS[host]}", "netns", self.switch)
            sh("ip", "-n", self.switch, "link", "set", f"{self.prefix}p{HOSTS[host]}", "master", "br0", "up")
            sh("ip", "-n", ns, "addr", "add", f"{addr(host)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def link(self, host: str, up: bool) -> None:
        sh("ip", "-n", self.switch, "link", "set", f"{self.prefix}p{HOSTS[host]}", "up" if up else "down")

    def pids(self, host: str) -> list[int]:
        done = sh("ip", "netns", "pids", self.ns(host), check=False)
        return [int(p) for p in done.stdout.split()]

    def kill(self, host: str, sig: int = signal.SIGKILL) -> None:
        # never this process: it lives in the client's namespace
        for pid in [p for p in self.pids(host) if p != os.getpid()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def spawn(self, host: str, argv: list[str], env: dict, log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            return subprocess.Popen(
                ["ip", "netns", "exec", self.ns(host), *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def enter(self, host: str) -> None:
        """This process (its only thread so far) joins the host's network namespace."""
        libc = ctypes.CDLL(None, use_errno=True)
        fd = os.open(f"/var/run/netns/{self.ns(host)}", os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns failed")
        finally:
            os.close(fd)

    def down(self) -> None:
        for host in [*HOSTS, "sw"]:
            if Path(f"/var/run/netns/{self.ns(host)}").exists():
                self.kill(host)
                sh("ip", "netns", "del", self.ns(host), check=False)


class Stack:
    def __init__(self, topo: Topology, work: Path, model_dir: str):
        self.topo = topo
        self.work = work
        self.model_dir = model_dir
        self.procs: dict[str, subprocess.Popen] = {}
        self.proxy_control = work / "proxy.json"
        self.proxy_control.write_text("{}")
        python = sys.executable
        base = {k: v for k, v in os.environ.items() if not k.startswith("JEV_")}
        self.env = {
            **base,
            "PYTHONPATH": f"{REPO / 'services'}:{REPO}",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "JEV_LOG_LEVEL": "warning",
            "OMP_NUM_THREADS": "1",
        }
        self.redis_url = f"redis://{addr('redis')}:6379/0"
        self.commands = {
            "redis": (
                [
                    shutil.which("redis-server") or "redis-server",
                    "--bind",
                    "0.0.0.0",
                    "--port",
                    "6379",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--protected-mode",
                    "no",
                ],
                {},
            ),
            **{
                w: (
                    [python, "-m", "jev_worker"],
                    {
                        "JEV_WORKER_HOST": "0.0.0.0",
                        "JEV_WORKER_PORT": "8000",
                        "JEV_MODEL_PATH": model_dir,
                        "JEV_DTYPE": "float32",
                        "JEV_DEVICE": "cpu",
                        "JEV_TORCH_THREADS": "1",
                        "JEV_WORKER_ID": w,
                        "JEV_WORKER_URL": (f"http://{addr(w)}:{PROXY_PORT}" if w == "w3" else f"http://{addr(w)}:8000"),
                        "JEV_WORKER_REGISTER_TTL_S": "3",
                        "JEV_SHUTDOWN_GRACE_S": "5",
                        "JEV_REDIS_URL": self.redis_url,
                        "JEV_ASSET_DIR": str(work / "assets"),
                    },
                )
                for w in WORKERS
            },
            **{
                fe: (
                    [python, "-m", "jev_frontend"],
                    {
                        "JEV_FRONTEND_HOST": "0.0.0.0",
                        "JEV_FRONTEND_PORT": "8080",
                        "JEV_FRONTEND_DISCOVERY": "1",
                        "JEV_DEFAULT_MODEL": "smollm2-135m-cpu",
                        "JEV_REDIS_URL": self.redis_url,
                        "JEV_FRONTEND_HEALTH_INTERVAL_S": "0.5",
                        "JEV_FRONTEND_TIMEOUT_S": "20",
                    },
                )
                for fe in FRONTENDS
            },
            "proxy": (
                [
                    python,
                    "-m",
                    "tools.fault_proxy",
                    "--listen",
                    f"0.0.0.0:{PROXY_PORT}",
                    "--upstream",
                    "127.0.0.1:8000",
                    "--control",
                    str(self.proxy_control),
                ],
                {},
            ),
        }
        self.hosts = {"proxy": "w3"}

    def start(self, name: str) -> None:
        argv, extra = self.commands[name]
        self.procs[name] = self.topo.spawn(
            self.hosts.get(name, name), argv, {**self.env, **extra}, self.work / f"{name}.log"
        )

    def signal(self, name: str, sig: int) -> None:
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, sig)

    def start_all(self) -> None:
        for name in ("redis", "proxy", *WORKERS, *FRONTENDS):
            self.start(name)

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)


# ----- the client (in the client namespace) ---------------------------------------------------------------
STATES = [f"Machine {i} reports temperature {20 + 3 * i} C and pressure {900 + 7 * i} hPa." for i in range(12)]
RETRY_STATUSES = {408, 429, *range(500, 600)}


@dataclass
class Sample:
    t: float
    latency: float
    ok: bool
    attempts: int
    failed_attempts: int
    worker: str = ""
    error: str = ""


@dataclass
class Timeline:
    samples: list[Sample] = field(default_factory=list)
    health: list[tuple[float, str, dict]] = field(default_factory=list)  # (t, frontend, {backend url: up})


async def one_request(session, k: int, timeout_s: float) -> Sample:
    import aiohttp

    body = {
        "model": "jev-latest",
        "state": random.choice(STATES),
        "questions": {"q": {"type": "noul", "instructions": f"Is it above {random.randint(20, 60)} C?"}},
    }
    started = time.time()
    failed, error = 0, ""
    for attempt in range(3):  # the first try and typesafe-sdk's two retries
        target = FRONTENDS[(k + attempt) % len(FRONTENDS)]
        retry_after = None
        try:
            async with session.post(
                f"http://{addr(target)}:8080/v1/systemone", json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as response:
                await response.read()
                if response.status == 200:
                    return Sample(
                        started,
                        time.time() - started,
                        True,
                        attempt + 1,
                        failed,
                        response.headers.get("x-jev-worker", ""),
                    )
                error = f"{response.status}"
                if response.status not in RETRY_STATUSES:
                    break
                retry_after = response.headers.get("Retry-After")
        except (TimeoutError, aiohttp.ClientError) as exc:
            error = type(exc).__name__
        failed += 1
        if attempt < 2:
            backoff = min(5.0, 0.5 * 2**attempt) * (1 - random.random() * 0.25)
            with contextlib.suppress(ValueError, TypeError):
                backoff = float(retry_after) if retry_after is not None else backoff
            await asyncio.sleep(min(backoff, 5.0))
    return Sample(started, time.time() - started, False, 3, failed, error=error)


async def load(until: float, rate: float, timeline: Timeline, timeout_s: float = 10.0) -> None:
    """Open-loop arrivals at `rate` per second until `until` (as many independent clients make): a request that
    hangs on a dead host holds only itself, never the arrivals after it. Waits for every request to finish."""
    import aiohttp

    tasks: list[asyncio.Task] = []
    k = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def one(index: int) -> None:
            timeline.samples.append(await one_request(session, index, timeout_s))

        next_at = time.time()
        while next_at < until:
            tasks.append(asyncio.create_task(one(k)))
            k += 1
            next_at += random.expovariate(rate)
            await asyncio.sleep(max(0.0, next_at - time.time()))
        await asyncio.gather(*tasks)


async def watch_health(until: float, timeline: Timeline) -> None:
    import aiohttp

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as session:
        while time.time() < until:
            for fe in FRONTENDS:
                try:
                    async with session.get(f"http://{addr(fe)}:8080/health") as response:
                        detail = (await response.json()).get("detail", {})
                    ups = {b["url"]: b["state"] == "up" for b in detail.get("backends", [])}
                    timeline.health.append((time.time(), fe, ups))
                except Exception:  # noqa: BLE001 - a dead frontend is what drill 6 makes
                    timeline.health.append((time.time(), fe, None))
            await asyncio.sleep(0.1)


async def ready(stack: Stack, timeout_s: float = 240.0) -> None:
    """Both frontends have all three workers in rotation and answer a decision."""
    import aiohttp

    deadline = time.time() + timeout_s
    want = {f"http://{addr(w)}:{PROXY_PORT if w == 'w3' else 8000}" for w in WORKERS}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5.0)) as session:
        while time.time() < deadline:
            seen = []
            for fe in FRONTENDS:
                try:
                    async with session.get(f"http://{addr(fe)}:8080/health") as response:
                        detail = (await response.json()).get("detail", {})
                    seen.append({b["url"] for b in detail.get("backends", []) if b["state"] == "up"} >= want)
                except Exception:  # noqa: BLE001 - not up yet
                    seen.append(False)
            if all(seen):
                return
            await asyncio.sleep(0.5)
    raise TimeoutError(f"the stack was not ready within {timeout_s:g} s (logs in {stack.work})")


# ----- drills ---------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def phase_stats(samples: list[Sample], start: float, end: float, workers: set[str] | None = None) -> dict:
    """Requests that started in [start, end); with `workers`, those answered by one of them."""
    chosen = [s for s in samples if start <= s.t < end and (workers is None or s.worker in workers)]
    ok = [s.latency for s in chosen if s.ok]
    return {
        "requests": len(chosen),
        "failed": sum(not s.ok for s in chosen),
        "failed_attempts": sum(s.failed_attempts for s in chosen),
        "p50_ms": round(1000 * percentile(ok, 0.5), 1) if ok else None,
        "p99_ms": round(1000 * percentile(ok, 0.99), 1) if ok else None,
    }


def out_of_rotation_at(timeline: Timeline, fault_t: float, url: str) -> float | None:
    """Seconds from the fault until every frontend that answers has `url` out of rotation (or gone)."""
    latest: dict[str, dict | None] = {}
    for t, fe, ups in timeline.health:
        latest[fe] = ups
        if t < fault_t:
            continue
        answering = [u for u in latest.values() if u is not None]
        if answering and all(not u.get(url, False) for u in answering) and len(latest) == len(FRONTENDS):
            return round(t - fault_t, 2)
    return None


async def index_rebuilt_at(stack: Stack, since: float, timeout_s: float = 30.0) -> float | None:
    """Seconds from `since` until the index holds every worker's record and routes again."""
    import redis.asyncio as redis

    client = redis.from_url(stack.redis_url, socket_timeout=1.0)
    try:
        while time.time() - since < timeout_s:
            try:
                workers = await client.scard("jev:workers")
                routes = [key async for key in client.scan_iter("jev:*route*", count=1000)]
                if workers >= len(WORKERS) and routes:
                    return round(time.time() - since, 2)
            except Exception:  # noqa: BLE001 - Redis not back yet
                pass
            await asyncio.sleep(0.2)
        return None
    finally:
        await client.aclose()


async def run_drill(name: str, stack: Stack, before: float, during: float, after: float, rate: float) -> dict:
    await ready(stack)
    timeline = Timeline()
    t0 = time.time()
    fault_t, recover_t, end = t0 + before, t0 + before + during, t0 + before + during + after
    tasks = [asyncio.create_task(load(end, rate, timeline)), asyncio.create_task(watch_health(end, timeline))]
    extra: dict = {}
    victim_url = None
    await asyncio.sleep(fault_t - time.time())
    if name == "kill9":  # the host is gone: its processes, and its link (no RST answers for it any more)
        stack.topo.kill("w1")
        stack.topo.link("w1", False)
        victim_url = f"http://{addr('w1')}:8000"
    elif name == "sigterm":
        stack.signal("w2", signal.SIGTERM)
        victim_url = f"http://{addr('w2')}:8000"
    elif name == "redis":
        stack.signal("redis", signal.SIGKILL)
        await asyncio.sleep(3.0)
        stack.start("redis")
        extra["index_rebuilt_s"] = await index_rebuilt_at(stack, time.time())
    elif name == "cut":
        stack.topo.link("w3", False)
        victim_url = f"http://{addr('w3')}:{PROXY_PORT}"
    elif name == "slow":
        stack.proxy_control.write_text(json.dumps({"delay_ms": 200, "drop": 0.05}))
    elif name == "frontend":
        stack.topo.kill("fe1")
    if name == "sigterm":  # the rolling update's new pod, once the old one has drained and exited
        await asyncio.get_running_loop().run_in_executor(None, stack.procs["w2"].wait)
        stack.start("w2")
    await asyncio.sleep(max(0.0, recover_t - time.time()))
    if name == "kill9":
        stack.topo.link("w1", True)
        stack.start("w1")
    elif name == "cut":
        stack.topo.link("w3", True)
    elif name == "slow":
        stack.proxy_control.write_text("{}")
    elif name == "frontend":
        stack.start("fe1")
    await asyncio.gather(*tasks)
    samples = timeline.samples
    row = {
        "drill": name,
        "requests": len(samples),
        "failed": sum(not s.ok for s in samples),
        "failed_attempts": sum(s.failed_attempts for s in samples),
        "before": phase_stats(samples, t0, fault_t),
        "during": phase_stats(samples, fault_t, recover_t),
        "after": phase_stats(samples, recover_t, end),
        **extra,
    }
    if victim_url:
        row["reroute_s"] = out_of_rotation_at(timeline, fault_t, victim_url)
    if name == "slow":
        row["during_others"] = phase_stats(samples, fault_t, recover_t, {"w1", "w2"})
        row["during_w3"] = phase_stats(samples, fault_t, recover_t, {"w3"})
        row["before_others"] = phase_stats(samples, t0, fault_t, {"w1", "w2"})
    errors: dict[str, int] = {}
    for s in samples:
        if not s.ok:
            errors[s.error] = errors.get(s.error, 0) + 1
    row["errors"] = errors
    return row


def table(rows: list[dict]) -> str:
    def ms(stats: dict) -> str:
        return f"{stats['p50_ms']} / {stats['p99_ms']}"

    lines = [
        (
            "| drill | requests | failed (after retries) | failed attempts | time to reroute | p50/p99 before (ms) | "
            "p50/p99 during | p50/p99 after |"
        ),
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reroute = r.get("reroute_s", r.get("index_rebuilt_s"))
        what = "index rebuilt " if "index_rebuilt_s" in r else ""
        lines.append(
            f"| {r['drill']} | {r['requests']} | {r['failed']} | {r['failed_attempts']} | "
            f"{what}{reroute if reroute is not None else '-'} s | {ms(r['before'])} | {ms(r['during'])} | "
            f"{ms(r['after'])} |"
        )
    return "\n".join(lines)


async def drive(args, stack: Stack) -> list[dict]:
    rows = []
    for name in args.drills:
        row = await run_drill(name, stack, args.before, args.during, args.after, args.rate)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--drills", type=lambda s: [d for d in s.split(",") if d], default=list(DRILLS))
    parser.add_argument("--before", type=float, default=5.0)
    parser.add_argument("--during", type=float, default=8.0)
    parser.add_argument("--after", type=float, default=5.0)
    parser.add_argument("--rate", type=float, default=60.0, help="requests per second (open loop, Poisson arrivals)")
    parser.add_argument("--prefix", default="jd", help="namespace name prefix")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.drills) - set(DRILLS))
    if unknown:
        parser.error(f"unknown drills {unknown}; known: {', '.join(DRILLS)}")
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("redis-server"):
        print("netdrill needs root, ip and redis-server", file=sys.stderr)
        return 2
    from tools.tiny_checkpoints import make_tiny_text

    work = Path(tempfile.mkdtemp(prefix="jev-netdrill-"))
    os.chmod(work, 0o755)
    model_dir = str(make_tiny_text(work / "tiny"))
    topo = Topology(args.prefix)
    stack = Stack(topo, work, model_dir)
    started = time.time()
    try:
        topo.up()
        stack.start_all()
        topo.enter("client")
        rows = asyncio.run(drive(args, stack))
    finally:
        stack.stop_all()
        topo.down()
        if not args.keep_logs:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rows))
    print(f"# {len(rows)} drills in {time.time() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
