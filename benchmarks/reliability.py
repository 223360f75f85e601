"""One request cannot hurt the others, measured on a real worker (the embedded SmolLM2 by default):

1. bounds: a 1 MB state, a 5 MB state and a 5 MB instructions, each answered 4xx (seconds), a small request
   right after, and the worker's RSS before and after;
2. disconnect: a 255-option choice (jevcompat's) whose client leaves after `--leave` seconds without the SDK's
   headers: seconds from the disconnect until the worker's CPU is idle, and the abandoned counters;
3. SDK: typesafe-sdk with its defaults on the same question, quiet and with one core busy: what the caller
   got, in how long, and how many times the rows were computed;
4. clients: `--clients` callers (each its own client) for `--seconds`, asking `--client-options`-option
   choices on distinct states, each leaving after a random 0.5-3 s (one in ten waits up to 60 s for its
   answer): rows computed (= answered + unwanted: finished after their caller left, the batch running on for
   the others in it) and rows stopped in flight, from the counters.

5. jevcompat: the conformance suite (its own defaults: 120 s a request) with one core busy: MUST and SHOULD
   passed of their totals.

    python -m benchmarks.reliability [--tiny] [--skip sdk,clients,jevcompat] [--clients 100 --seconds 20]

Prints one JSON line per part and a table at the end; the CPU is named. `--tiny` runs every part on a tiny
random checkpoint at small sizes (SMOKE_SIZES unless given; the smoke run in make test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.cpu_speed import Busy, cpu_description, jevcompat_255
from benchmarks.stack import Stack, get_text

BIG_STATE = "word " * 200_000  # 1 MB
FULL_SIZES = {"options": 255, "leave": 2.0, "clients": 100, "seconds": 20.0}
SMOKE_SIZES = {"options": 8, "leave": 0.2, "clients": 2, "seconds": 1.0}  # --tiny: the tiny checkpoint's sizes


def envelope(state, instructions="Is the lamp on?") -> dict:
    return {"model": "jev-latest", "state": state, "questions": {"q": {"type": "noul", "instructions": instructions}}}


def choice(options: int) -> dict:
    body = jevcompat_255()
    criteria = dict(list(body["questions"]["queue"]["criteria"].items())[:options])
    body["questions"]["queue"]["criteria"] = criteria
    return body


def metric(text: str, name: str, labels: str = "") -> float:
    pattern = re.escape(name) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" ([0-9.e+-]+)"
    found = re.search(r"^" + pattern + r"$", text, re.M)
    return float(found.group(1)) if found else 0.0


async def counters(url: str) -> dict:
    text = await get_text(url + "/metrics")
    out = {
        event: metric(text, "jev_worker_flight_rows_total", f'event="{event}"')
        for event in ("computed", "answered", "unwanted", "joined", "kept", "client_limited")
    }
    out["abandoned_rows"] = metric(text, "jev_worker_abandoned_rows_total")
    out["abandoned_batches"] = metric(text, "jev_worker_abandoned_batches_total")
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: round(after[k] - before[k], 3) for k in after}


def rss_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def idle_after(pid: int, since: float, timeout_s: float = 120.0) -> float:
    """Seconds from `since` until the process uses under 10% of a core over 0.5 s."""
    while time.monotonic() - since < timeout_s:
        before, started = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(0.5)
        if (cpu_seconds(pid) - before) / (time.monotonic() - started) < 0.1:
            return round(started - since, 2)
    return float("inf")


async def post(
    session: aiohttp.ClientSession, url: str, body: dict, timeout_s: float | None = None, headers: dict | None = None
) -> tuple[int | str, float]:
    started = time.monotonic()
    try:
        async with session.post(
            url + "/v1/systemone", json=body, headers=headers or {}, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            await response.read()
            return response.status, time.monotonic() - started
    except TimeoutError:
        return "left", time.monotonic() - started


async def part_bounds(url: str, pid: int) -> dict:
    out = {"rss_mb_before": round(rss_mb(pid), 1)}
    async with aiohttp.ClientSession() as session:
        for name, body in (
            ("1MB state", envelope(BIG_STATE)),
            ("5MB state", envelope("x" * 5_000_000)),
            ("5MB instructions", envelope("short", "y" * 5_000_000)),
            ("small after", envelope("The lamp is on.")),
        ):
            status, seconds = await post(session, url, body, 60)
            out[name] = {"status": status, "seconds": round(seconds, 3)}
    out["rss_mb_after"] = round(rss_mb(pid), 1)
    return out


async def part_disconnect(url: str, pid: int, options: int, leave_s: float) -> dict:
    before = await counters(url)
    async with aiohttp.ClientSession() as session:
        status, _ = await post(session, url, choice(options), leave_s)
    left = time.monotonic()
    idle = await idle_after(pid, left)
    return {"client": status, "idle_after_disconnect_s": idle, "counters": delta(await counters(url), before)}


def sdk_call(url: str, options: int) -> dict:
    from typesafe_sdk import Choice, TypeSafeClient

    body = choice(options)["questions"]["queue"]
    started = time.monotonic()
    try:
        with TypeSafeClient(api_key="unused", base_url=url) as client:  # every setting at its default
            answer = client.system_one(
                state=jevcompat_255()["state"],
                questions={"queue": Choice(instructions=body["instructions"], criteria=body["criteria"])},
            )
        got = f"answer ({answer['queue'].choice if hasattr(answer, '__getitem__') else 'ok'})"
    except Exception as exc:  # noqa: BLE001 - what the caller gets is the measurement
        got = type(exc).__name__
    return {"caller_got": got, "seconds": round(time.monotonic() - started, 1)}


async def part_sdk(url: str, options: int, busy: bool) -> dict:
    before = await counters(url)
    if busy:
        with Busy():
            out = await asyncio.to_thread(sdk_call, url, options)
    else:
        out = await asyncio.to_thread(sdk_call, url, options)
    await asyncio.sleep(6)  # past the linger: what was computed for nobody shows
    out["counters"] = delta(await counters(url), before)
    out["load"] = "one core busy" if busy else "quiet"
    return out


async def part_clients(url: str, clients: int, seconds: float, options: int) -> dict:
    before = await counters(url)
    rng = random.Random(0)
    statuses: dict = {}

    async def one(i: int, session):
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            body = choice(options)
            body["state"] += f" (client {i}, request {n})"
            leave = 60.0 if rng.random() < 0.1 else rng.uniform(0.5, 3.0)  # a few wait for their answer
            status, _ = await post(session, url, body, leave, {"x-jev-client": f"bench-{i}"})
            statuses[status] = statuses.get(status, 0) + 1
            n += 1

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients)) as session:
        await asyncio.gather(*(one(i, session) for i in range(clients)))
    await asyncio.sleep(2)
    got = delta(await counters(url), before)
    return {
        "clients": clients,
        "seconds": seconds,
        "statuses": {str(k): v for k, v in statuses.items()},
        "counters": got,
        "computed_is_answered_plus_unwanted": got["computed"] == got["answered"] + got["unwanted"],
    }


def jevcompat_busy(url: str) -> dict:
    import subprocess

    with tempfile.TemporaryDirectory() as out, Busy():
        started = time.monotonic()
        command = str(Path(sys.executable).parent / "jevcompat")  # the suite's own console script
        done = subprocess.run(
            [command, "test", url, "--json", f"{out}/report.json"], capture_output=True, text=True, timeout=3600
        )
        seconds = time.monotonic() - started
        report = json.loads(open(f"{out}/report.json").read())
    summary = report.get("summary", {})
    return {
        "load": "one core busy",
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "verdict": report.get("verdict"),
        **{level: summary.get(level) for level in ("MUST", "SHOULD")},
    }


async def run(args) -> list[dict]:
    results = []
    env = {"JEV_REDIS_URL": "", "JEV_WORKER_REGISTER_TTL_S": "0", "JEV_CACHE_L1": "0"}
    tiny_dir = None
    if args.tiny:
        from tests.fakes.net import free_port  # noqa: F401 - the tests' helpers are importable here
        from tools.tiny_checkpoints import make_tiny_text

        tiny_dir = tempfile.mkdtemp(prefix="jev-tiny-")
        make_tiny_text(tiny_dir)
        env.update(JEV_MODEL_PATH=tiny_dir, JEV_DTYPE="float32")
    with tempfile.TemporaryDirectory() as logs:
        async with Stack(logs) as stack:
            worker = await stack.worker("worker", **env)
            await stack.wait_healthy()
            pid = worker.process.pid
            parts = [p for p in ("bounds", "disconnect", "sdk", "clients", "jevcompat") if p not in args.skip]
            for part in parts:
                if part == "bounds":
                    got = await part_bounds(worker.url, pid)
                elif part == "disconnect":
                    got = await part_disconnect(worker.url, pid, args.options, args.leave)
                elif part == "sdk":
                    got = [await part_sdk(worker.url, args.options, busy) for busy in (False, True)]
                elif part == "jevcompat":
                    got = await asyncio.to_thread(jevcompat_busy, worker.url)
                else:
                    got = await part_clients(worker.url, args.clients, args.seconds, args.client_options)
                line = {"part": part, "result": got}
                print(json.dumps(line), flush=True)
                results.append(line)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reliability", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="a tiny random checkpoint at small sizes (smoke): unless given, --options 8 --leave 0.2 "
        "--clients 2 --seconds 1 (its vocabulary has no 255 single-token labels)",
    )
    parser.add_argument("--options", type=int, default=None, help="options of the choice (2..255; default 255)")
    parser.add_argument(
        "--leave", type=float, default=None, help="seconds before the disconnecting client leaves (default 2)"
    )
    parser.add_argument("--clients", type=int, default=None, help="default 100")
    parser.add_argument("--client-options", type=int, default=16, help="options of the clients part's choice")
    parser.add_argument("--seconds", type=float, default=None, help="default 20")
    parser.add_argument(
        "--skip", default="", help="comma-separated parts to skip: bounds,disconnect,sdk,clients,jevcompat"
    )
    args = parser.parse_args(argv)
    sizes = SMOKE_SIZES if args.tiny else FULL_SIZES
    for name, value in sizes.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.skip = {p for p in args.skip.split(",") if p}
    if not 2 <= args.options <= 255:
        parser.error("--options 2..255")
    print(f"# CPU: {cpu_description()}", flush=True)
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
