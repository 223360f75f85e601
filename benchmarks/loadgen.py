"""A bounded asyncio load generator for POST /v1/systemone (loopback targets only).

    python -m benchmarks.loadgen --url http://127.0.0.1:8080 --concurrency 4 --requests 200 \
        [--corpus mixed|shared-prefix|set|requests.jsonl] [--new-session-per-request] [--json report.json]

`--concurrency` client tasks share `--requests` requests, taking the corpus entries in order
(request i is corpus[i % len(corpus)]); the run stops by itself after the last one, or when
`--max-seconds` have passed (then no new request starts). Latency is measured per request from
just before it is sent until its whole body has been read. Reported: counts by HTTP status and
error type, p50/p95/p99/mean/max latency in ms, and decisions/s (200 answers over the run's wall
time). With `--new-session-per-request` every request opens its own aiohttp.ClientSession (and so its
own TCP connection) instead of all sharing one pooled session.

Only loopback hosts (127.0.0.0/8, ::1, localhost) are accepted: this is a test tool, not a load
tester for other people's machines. Exit status: 0 all requests answered 200, 1 some did not,
2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import socket
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import aiohttp

from jev_common.errors import error_type_of

from .corpora import BUILTIN, SYSTEM_ONE, WARMUP_BODY, load_corpus

DEFAULT_PATH = "/v1/systemone"
MAX_REQUESTS = 100_000
MAX_CONCURRENCY = 512


class NotLoopback(ValueError):
    pass


def check_loopback(url: str) -> str:
    """The URL to POST to (base URLs get /v1/systemone); raises NotLoopback for any other host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise NotLoopback(f"--url must be an http(s) URL like http://127.0.0.1:8080, got {url!r}")
    host = parts.hostname
    try:
        addresses = {ipaddress.ip_address(host)}
    except ValueError:
        if host != "localhost":
            raise NotLoopback(f"refusing non-loopback host {host!r}: only 127.0.0.0/8, ::1 and localhost") from None
        try:
            infos = socket.getaddrinfo(host, parts.port or 80, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise NotLoopback(f"cannot resolve {host!r}: {exc}") from None
        addresses = {ipaddress.ip_address(info[4][0]) for info in infos}
    if not addresses or not all(a.is_loopback for a in addresses):
        raise NotLoopback(f"refusing non-loopback host {host!r} ({', '.join(map(str, addresses))})")
    if parts.path in ("", "/"):
        return url.rstrip("/") + DEFAULT_PATH
    return url


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not sorted_values:
        return None
    if len(sorted_values) == 1:
        return sorted_values[0]
    rank = (len(sorted_values) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (rank - low)


@dataclass
class Report:
    url: str
    concurrency: int
    requests: int  # asked for
    sent: int
    ok: int
    statuses: dict[str, int]  # HTTP status (or "transport") -> count
    error_types: dict[str, int]  # error envelope type (or exception name) -> count, non-200 only
    wall_s: float
    decisions_per_s: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    mean_ms: float | None
    max_ms: float | None
    pooled: bool
    stopped_early: bool = False
    latencies_ms: list[float] = field(default_factory=list, repr=False)  # 200 answers, in completion order

    def summary(self) -> str:
        def ms(v):
            return "-" if v is None else f"{v:.1f}"

        return (
            f"{self.ok}/{self.sent} ok at concurrency {self.concurrency} "
            f"({'pooled session' if self.pooled else 'session per request'}): "
            f"p50 {ms(self.p50_ms)} ms, p95 {ms(self.p95_ms)} ms, p99 {ms(self.p99_ms)} ms, "
            f"{self.decisions_per_s:.2f} decisions/s over {self.wall_s:.2f} s"
            + (f"; statuses {self.statuses}" if self.ok != self.sent else "")
        )

    def to_dict(self, with_latencies: bool = False) -> dict:
        data = asdict(self)
        if not with_latencies:
            data.pop("latencies_ms")
        return data


def build_report(
    url: str,
    concurrency: int,
    requests: int,
    pooled: bool,
    wall_s: float,
    results: list[tuple[int | str, float, str | None]],
    stopped_early: bool = False,
) -> Report:
    """results: (status or "transport", latency seconds, error type) per sent request."""
    ok_latencies = sorted(lat * 1000 for status, lat, _ in results if status == 200)
    statuses = Counter(str(status) for status, _, _ in results)
    error_types = Counter(kind for status, _, kind in results if status != 200 and kind)
    ok = len(ok_latencies)
    return Report(
        url=url,
        concurrency=concurrency,
        requests=requests,
        sent=len(results),
        ok=ok,
        statuses=dict(sorted(statuses.items())),
        error_types=dict(sorted(error_types.items())),
        wall_s=wall_s,
        decisions_per_s=(ok / wall_s) if wall_s > 0 else 0.0,
        p50_ms=percentile(ok_latencies, 50),
        p95_ms=percentile(ok_latencies, 95),
        p99_ms=percentile(ok_latencies, 99),
        mean_ms=(sum(ok_latencies) / ok) if ok else None,
        max_ms=ok_latencies[-1] if ok else None,
        pooled=pooled,
        stopped_early=stopped_early,
        latencies_ms=[lat * 1000 for status, lat, _ in results if status == 200],
    )


def merge_reports(reports: list[Report]) -> Report:
    """One report for several runs of the same load (e.g. interleaved halves): latencies and counts
    pooled, wall times added, so decisions/s is answers over the time spent sending."""
    if not reports:
        raise ValueError("nothing to merge")
    latencies = [lat for r in reports for lat in r.latencies_ms]
    ordered = sorted(latencies)
    statuses = sum((Counter(r.statuses) for r in reports), Counter())
    error_types = sum((Counter(r.error_types) for r in reports), Counter())
    wall = sum(r.wall_s for r in reports)
    ok = len(latencies)
    first = reports[0]
    return Report(
        url=first.url,
        concurrency=first.concurrency,
        requests=sum(r.requests for r in reports),
        sent=sum(r.sent for r in reports),
        ok=ok,
        statuses=dict(sorted(statuses.items())),
        error_types=dict(sorted(error_types.items())),
        wall_s=wall,
        decisions_per_s=(ok / wall) if wall > 0 else 0.0,
        p50_ms=percentile(ordered, 50),
        p95_ms=percentile(ordered, 95),
        p99_ms=percentile(ordered, 99),
        mean_ms=(sum(ordered) / ok) if ok else None,
        max_ms=ordered[-1] if ok else None,
        pooled=first.pooled,
        stopped_early=any(r.stopped_early for r in reports),
        latencies_ms=latencies,
    )


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict, timeout: aiohttp.ClientTimeout
) -> tuple[int | str, float, str | None]:
    started = time.perf_counter()
    try:
        async with session.post(url, json=body, timeout=timeout) as resp:
            raw = await resp.read()
            status = resp.status
    except (TimeoutError, aiohttp.ClientError) as exc:
        return "transport", time.perf_counter() - started, type(exc).__name__
    elapsed = time.perf_counter() - started
    error_type = None
    if status != 200:
        try:
            error_type = error_type_of(json.loads(raw)) or "no_envelope"
        except ValueError:
            error_type = "no_envelope"
    return status, elapsed, error_type


async def run_load(
    url: str,
    corpus: list[dict],
    *,
    concurrency: int = 1,
    requests: int = 100,
    pooled: bool = True,
    timeout_s: float = 60.0,
    max_seconds: float = 600.0,
    warmup: int = 0,
    offset: int = 0,
) -> Report:
    """Send `requests` requests from `concurrency` tasks and report; never runs past max_seconds
    (plus one request's timeout). Request i is corpus[(offset + i) % len(corpus)]. `warmup`
    requests of WARMUP_BODY go first and are not counted."""
    target = check_loopback(url)
    if not corpus:
        raise ValueError("empty corpus")
    if not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"concurrency must be 1..{MAX_CONCURRENCY}, got {concurrency}")
    if not 1 <= requests <= MAX_REQUESTS:
        raise ValueError(f"requests must be 1..{MAX_REQUESTS}, got {requests}")
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    connector_limit = max(concurrency, 1)
    results: list[tuple[int | str, float, str | None]] = []
    next_index = 0
    stopped_early = False

    async with contextlib.AsyncExitStack() as stack:
        shared = None
        if pooled:
            shared = await stack.enter_async_context(
                aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connector_limit))
            )
        for _ in range(warmup):
            if shared is not None:
                await _post(shared, target, WARMUP_BODY, timeout)
            else:
                async with aiohttp.ClientSession() as session:
                    await _post(session, target, WARMUP_BODY, timeout)

        started = time.perf_counter()
        stop_at = started + max_seconds

        async def client() -> None:
            nonlocal next_index, stopped_early
            while next_index < requests:
                if time.perf_counter() >= stop_at:
                    stopped_early = True
                    return
                body = corpus[(offset + next_index) % len(corpus)]
                next_index += 1
                if shared is not None:
                    results.append(await _post(shared, target, body, timeout))
                else:
                    async with aiohttp.ClientSession() as session:
                        results.append(await _post(session, target, body, timeout))

        await asyncio.gather(*(client() for _ in range(min(concurrency, requests))))
        wall = time.perf_counter() - started
    return build_report(target, concurrency, requests, pooled, wall, results, stopped_early)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.loadgen", description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True, help="base URL (http://127.0.0.1:8080) or the full endpoint URL")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument(
        "--corpus", default="mixed", help=f"built-in ({', '.join([*BUILTIN, *SYSTEM_ONE])}) or a JSON-lines file"
    )
    parser.add_argument(
        "--new-session-per-request",
        action="store_true",
        help="open a new aiohttp.ClientSession per request instead of one pooled session",
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="per-request timeout in seconds")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="stop starting requests after this")
    parser.add_argument("--warmup", type=int, default=0, help="uncounted warm-up requests first")
    parser.add_argument("--json", default=None, help="also write the report (with latencies) to this file")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    try:
        check_loopback(args.url)
        corpus = load_corpus(args.corpus)
        report = asyncio.run(
            run_load(
                args.url,
                corpus,
                concurrency=args.concurrency,
                requests=args.requests,
                pooled=not args.new_session_per_request,
                timeout_s=args.timeout,
                max_seconds=args.max_seconds,
                warmup=args.warmup,
            )
        )
    except ValueError as exc:
        print(f"loadgen: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2))
    print(report.summary(), file=sys.stderr)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(report.to_dict(with_latencies=True), handle, indent=2)
    return 0 if report.ok == report.sent == args.requests else 1


if __name__ == "__main__":
    sys.exit(main())
