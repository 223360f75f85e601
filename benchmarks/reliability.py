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

The worker runs as behind the frontend: with an internal token (generated per run), which every call of the
benchmark carries, so the clients part's `x-jev-client` (one fairness key per simulated client) is honoured as the
frontend's would be; the SDK and jevcompat send it as their API key. Prints one JSON line per part (`ok`, and
`failed` with the reasons when a part broke: an error, a 5xx, an oversized request not refused, a worker still
busy after its caller left, a conformance failure) and exits 1 when any part it ran failed. A part that cannot
apply to the served model is skipped, its line saying why (jevcompat where the model reads fewer tokens than the
suite's 255-option question has: the tiny checkpoint's 4,096). `--tiny` runs every part on a tiny random
checkpoint at small sizes (SMOKE_SIZES unless given; the smoke run in make test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.cpu_speed import Busy, cpu_description, jevcompat_255
from benchmarks.stack import Stack, get_text
from jev_common.internal_auth import INTERNAL_TOKEN_HEADER

BIG_STATE = "word " * 200_000  # 1 MB
FULL_SIZES = {"options": 255, "leave": 2.0, "clients": 100, "seconds": 20.0}
SMOKE_SIZES = {"options": 8, "leave": 0.2, "clients": 2, "seconds": 1.0}  # --tiny: the tiny checkpoint's sizes
PARTS = ("bounds", "disconnect", "sdk", "clients", "jevcompat")
TOKEN = secrets.token_hex(16)  # the worker's internal token for this run; every call carries it
CREDENTIAL = {INTERNAL_TOKEN_HEADER: TOKEN}
PROBE_S = 10.0  # a prompt's length is judged before any forward: a too-long one is refused well within this


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
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
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
            url + "/v1/systemone",
            json=body,
            headers={**CREDENTIAL, **(headers or {})},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
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
        with TypeSafeClient(api_key=TOKEN, base_url=url) as client:  # every setting at its default (the token: a key)
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
            [command, "test", url, "--key-env", "JEV_BENCH_TOKEN", "--json", f"{out}/report.json"],
            env={**os.environ, "JEV_BENCH_TOKEN": TOKEN},  # the token as its API key: never on a command line
            capture_output=True,
            text=True,
            timeout=3600,
        )
        seconds = time.monotonic() - started
        report = json.loads(Path(f"{out}/report.json").read_text())
    summary = report.get("summary", {})
    return {
        "load": "one core busy",
        "seconds": round(seconds, 1),
        "exit": done.returncode,
        "verdict": summary.get("verdict"),  # conformant, not conformant, incomplete (a timeout), not tested
        **{level: summary.get(level) for level in ("MUST", "SHOULD")},
        "untested_musts": summary.get("untested_musts", []),
        "inconclusive": [str(item)[:200] for item in report.get("inconclusive", [])][:5],
        "case_errors": [str(item)[:200] for item in report.get("case_errors", [])][:5],
    }


async def jevcompat_applies(url: str) -> str | None:
    """Why jevcompat cannot apply to the served model, or None when it can: the suite's largest request (its
    255-option choice) is sent as the suite sends it, and a model that reads fewer tokens refuses it before any
    forward (422, `prompt too long`). One that reads it is left at once (its forward stops when its caller leaves)."""
    from jevcompat.checks import TICKET

    body = jevcompat_255()
    body["state"] = TICKET  # the suite's own state
    timeout = aiohttp.ClientTimeout(total=PROBE_S)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url + "/v1/systemone", json=body, headers=CREDENTIAL) as response,
        ):
            status, payload = response.status, await response.json(content_type=None)
    except TimeoutError:
        return None  # computing it: the model reads it
    detail = payload.get("detail") if isinstance(payload, dict) else None
    message = detail[0].get("msg", "") if isinstance(detail, list) and detail else ""
    if status == 422 and message.startswith("prompt too long"):
        return f"the suite's 255-option question does not fit the served model: {message}"
    return None


def judge(part: str, got) -> list[str]:
    """What broke in a part's result (empty: it ran as it should). An unfavourable measurement is not a failure
    (the SDK timing out on a model too slow for its budget is what the part measures); an error is."""
    problems = []
    if part == "bounds":
        for name, outcome in got.items():
            if isinstance(outcome, dict):
                status = outcome["status"]
                wanted = status == 200 if name == "small after" else isinstance(status, int) and 400 <= status < 500
                if not wanted:
                    problems.append(f"{name}: answered {status}")
    elif part == "disconnect":
        if got["client"] not in ("left", 200):
            problems.append(f"the disconnecting client got {got['client']}")
        if got["idle_after_disconnect_s"] == float("inf"):
            problems.append("the worker was still busy 120 s after its caller left")
    elif part == "sdk":
        for run in got:
            if not run["caller_got"].startswith("answer") and run["caller_got"] != "TypeSafeAPITimeoutError":
                problems.append(f"the SDK ({run['load']}) got {run['caller_got']}")
    elif part == "clients":
        errors = {k: v for k, v in got["statuses"].items() if k.isdigit() and int(k) >= 500}
        if errors:
            problems.append(f"answered 5xx: {errors}")
        if not got["computed_is_answered_plus_unwanted"]:
            problems.append(f"rows computed != answered + unwanted: {got['counters']}")
    elif part == "jevcompat" and got["exit"] != 0:  # incomplete (a request timed out) is not a pass either
        why = got.get("inconclusive") or got.get("case_errors") or got.get("untested_musts") or ""
        problems.append(f"jevcompat exited {got['exit']}, {got['verdict']}: MUST {got['MUST']} {why}".rstrip())
    return problems


async def run_part(part: str, args, url: str, pid: int):
    if part == "bounds":
        return await part_bounds(url, pid)
    if part == "disconnect":
        return await part_disconnect(url, pid, args.options, args.leave)
    if part == "sdk":
        return [await part_sdk(url, args.options, busy) for busy in (False, True)]
    if part == "jevcompat":
        return await asyncio.to_thread(jevcompat_busy, url)
    return await part_clients(url, args.clients, args.seconds, args.client_options)


async def run(args) -> list[dict]:
    results = []
    env = {
        "JEV_REDIS_URL": "",
        "JEV_WORKER_REGISTER_TTL_S": "0",
        "JEV_CACHE_L1": "0",
        "JEV_INTERNAL_TOKENS": TOKEN,
    }
    tiny_dir = None
    if args.tiny:
        from tools.tiny_checkpoints import make_tiny_text

        tiny_dir = tempfile.mkdtemp(prefix="jev-tiny-")
        make_tiny_text(tiny_dir)
        env.update(JEV_MODEL_PATH=tiny_dir, JEV_DTYPE="float32")
    with tempfile.TemporaryDirectory() as logs:
        async with Stack(logs) as stack:
            worker = await stack.worker("worker", **env)
            await stack.wait_healthy()
            pid = worker.process.pid
            for part in (p for p in PARTS if p not in args.skip):
                skipped = await jevcompat_applies(worker.url) if part == "jevcompat" else None
                if skipped:
                    line = {"part": part, "skipped": skipped}
                else:
                    try:
                        got = await run_part(part, args, worker.url, pid)
                        problems = judge(part, got)
                    except Exception as exc:  # noqa: BLE001 - a part that raised failed; the others still run
                        got, problems = None, [f"{type(exc).__name__}: {exc}"]
                    line = {"part": part, "result": got, "ok": not problems}
                    if problems:
                        line["failed"] = problems
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
    if args.skip - set(PARTS):
        parser.error(f"--skip: unknown parts {sorted(args.skip - set(PARTS))}; the parts are {','.join(PARTS)}")
    if not 2 <= args.options <= 255:
        parser.error("--options 2..255")
    print(f"# CPU: {cpu_description()}", flush=True)
    lines = asyncio.run(run(args))
    for line in lines:
        if "skipped" in line:
            print(f"# skipped {line['part']}: {line['skipped']}", file=sys.stderr)
    failed = [line for line in lines if line.get("failed")]
    for line in failed:
        print(f"# FAILED {line['part']}: {'; '.join(line['failed'])}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
