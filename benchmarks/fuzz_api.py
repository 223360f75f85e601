"""Schemathesis against the frontend: requests generated from its own /openapi.json (positive: valid by the
description; negative: each breaking it somewhere), sent to a frontend routing to a worker on a tiny random-weight
checkpoint, every answer checked:

- no 500, and any other 5xx only where the description documents it for that route (502/503/504);
- every answer conforms to the description: a documented status, its content type, its body's shape, its headers
  (a 4xx is fine wherever the description documents it: the description is the judge, not the generator);
- no answer later than its deadline (the caller's `x-jev-deadline-s` when valid, else the stack's), plus grace;
- every request gets an answer (no reset connection, no hang).

    python -m benchmarks.fuzz_api --cases 10000      # the benchmark (benchmarks/RESULTS.md, "API fuzzing")

tests/stack/test_fuzz_api.py runs the same fuzzer for a few hundred cases in `make test`. Exit status 1 when any
check failed; each failure is printed with a curl line that repeats it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import secrets
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.stack import Stack

MODEL = "tiny-fuzz"
DEADLINE_S = 30.0  # the worker's JEV_DEADLINE_S for callers that send none
FRONTEND_TIMEOUT_S = 35.0
GRACE_S = 5.0  # past a deadline, how late an answer may still come on a busy 2-core machine before it is a failure
DOCUMENTED_5XX = (502, 503, 504)
# the share of cases per operation (the decision route is where the parsing is)
WEIGHTS = {("POST", "/v1/systemone"): 0.85, ("POST", "/v1/preencode"): 0.1, ("GET", "/v1/models"): 0.05}
CHUNK = 50  # cases per hypothesis run (each its own seed)
RATE_LIMIT = "default=1000000:0"  # on, so every answer carries the x-ratelimit-* headers the description names


@dataclass
class Failure:
    check: str
    message: str
    curl: str

    def line(self) -> str:
        return f"[{self.check}] {self.message.strip()[:600]}\n    {self.curl[:2000]}"


@dataclass
class Tally:
    cases: int = 0
    by_status: Counter = field(default_factory=Counter)
    by_mode: Counter = field(default_factory=Counter)
    by_operation: Counter = field(default_factory=Counter)
    failures: list[Failure] = field(default_factory=list)
    by_key: Counter = field(default_factory=Counter)  # (operation, mode) -> cases sent
    generation_errors: Counter = field(default_factory=Counter)  # chunks whose generation gave up, by why
    slowest_s: float = 0.0
    seconds: float = 0.0

    def summary(self) -> dict:
        return {
            "cases": self.cases,
            "seconds": round(self.seconds, 1),
            "cases_per_s": round(self.cases / self.seconds, 1) if self.seconds else None,
            "by_status": dict(sorted((str(k), v) for k, v in self.by_status.items())),
            "by_mode": dict(self.by_mode),
            "by_operation": dict(self.by_operation),
            "slowest_answer_s": round(self.slowest_s, 2),
            "generation_errors": dict(self.generation_errors),
            "failures": len(self.failures),
            "failed_checks": dict(Counter(f.check for f in self.failures)),
        }


def deadline_of(headers: dict | None) -> float:
    """The deadline a request carries: its valid `x-jev-deadline-s`, else the stack's own."""
    raw = (headers or {}).get("x-jev-deadline-s")
    try:
        value = float(str(raw).strip())
    except (TypeError, ValueError):
        return DEADLINE_S
    return value if 0 < value <= 600 else DEADLINE_S


class Fuzzer:
    """Cases from the description's strategies, sent one at a time, each answer checked; failures collected, never
    raised (so a run counts them all, and nothing is shrunk)."""

    def __init__(self, base_url: str, seed: int = 0):
        import schemathesis
        from schemathesis import checks

        self.base_url = base_url
        self.schema = schemathesis.openapi.from_url(base_url + "/openapi.json", timeout=30)
        self.conformance = [
            checks.status_code_conformance,
            checks.content_type_conformance,
            checks.response_headers_conformance,
            checks.response_schema_conformance,
        ]
        self.random = random.Random(seed)
        self.seed = seed
        self.tally = Tally()
        self.chunks = 0

    def run(self, cases: int) -> Tally:
        from schemathesis import GenerationMode

        started = time.perf_counter()
        for (method, path), weight in WEIGHTS.items():
            operation = self.schema[path][method]
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                self._run_operation(operation, mode, max(1, round(cases * weight / 2)))
        health = self.schema["/health"]["GET"]
        self._run_operation(health, GenerationMode.POSITIVE, 1)
        # an operation without inputs (GET /v1/models, /health) has few distinct cases: the rest go to decisions
        decisions = self.schema["/v1/systemone"]["POST"]
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            left = cases - self.tally.cases
            if left > 0:
                self._run_operation(decisions, mode, (left + 1) // 2 if mode == GenerationMode.POSITIVE else left)
        self.tally.seconds = time.perf_counter() - started
        return self.tally

    def _run_operation(self, operation, mode, examples: int) -> None:
        """`examples` cases of one operation in one mode, in chunks of their own seeds: a chunk whose generation
        gives up (schemathesis cannot negate every schema it meets) is counted and the next one tried."""
        from hypothesis import HealthCheck, Phase, given, seed, settings
        from hypothesis.errors import HypothesisException
        from schemathesis.core.errors import UnsupportedSchema

        strategy = operation.as_strategy(generation_mode=mode)
        target = self.tally.by_key[(operation.label, mode.value)] + examples
        for _ in range(examples // CHUNK + 10):
            left = target - self.tally.by_key[(operation.label, mode.value)]
            if left <= 0:
                return
            sent_before = self.tally.cases

            self.chunks += 1

            @seed(self.seed * 1_000_003 + self.chunks)  # every chunk its own seed: no case sent twice by design
            @settings(
                max_examples=min(CHUNK, left),
                database=None,
                deadline=None,
                phases=[Phase.generate],
                suppress_health_check=list(HealthCheck),
            )
            @given(case=strategy)
            def send(case):
                self.check(case, mode.value)

            try:
                send()
            except (UnsupportedSchema, HypothesisException) as exc:
                self.tally.generation_errors[f"{type(exc).__name__}: {str(exc)[:160]}"] += 1
            if self.tally.cases == sent_before:
                return  # nothing more to generate (an operation without inputs has one case)

    def check(self, case, mode: str) -> None:
        import requests

        if mode == "positive" and self.random.random() < 0.5:
            _plain_decision(case)  # half the valid cases reach the model, not only model-not-served or a bad encoding
        deadline_s = deadline_of(case.headers)
        label = f"{case.operation.method.upper()} {case.operation.path}"
        self.tally.cases += 1
        self.tally.by_key[(case.operation.label, mode)] += 1
        self.tally.by_mode[mode] += 1
        self.tally.by_operation[label] += 1
        sent = time.perf_counter()
        try:
            response = case.call(base_url=self.base_url, timeout=deadline_s + GRACE_S + 5)
        except requests.RequestException as exc:
            self.tally.by_status["no answer"] += 1
            self._fail(case, "answered", f"{label}: no answer: {type(exc).__name__}: {exc}")
            return
        elapsed = time.perf_counter() - sent
        self.tally.slowest_s = max(self.tally.slowest_s, elapsed)
        status = response.status_code
        self.tally.by_status[status] += 1
        if status == 500:
            self._fail(case, "no_500", f"{label} answered 500: {response.text[:300]}")
        elif status >= 500 and status not in DOCUMENTED_5XX:
            self._fail(case, "documented_5xx", f"{label} answered {status}: {response.text[:300]}")
        if elapsed > deadline_s + GRACE_S:
            self._fail(
                case, "deadline", f"{label} answered {status} after {elapsed:.1f} s; its deadline {deadline_s} s"
            )
        try:
            case.validate_response(response, checks=self.conformance)
        except AssertionError as exc:  # schemathesis' FailureGroup: one or more checks failed
            for failure in getattr(exc, "exceptions", [exc]):
                title = getattr(failure, "title", type(failure).__name__)
                self._fail(case, "conforms", f"{label} answered {status}: {title}: {failure}"[:900])

    def _fail(self, case, check: str, message: str) -> None:
        try:
            curl = case.as_curl_command(base_url=self.base_url)
        except Exception as exc:  # noqa: BLE001
            curl = f"(no curl line: {exc})"
        self.tally.failures.append(Failure(check, message, curl))


def _plain_decision(case) -> None:
    """The served model named, and the body sent as it is: a valid case's `Content-Encoding: gzip` names an encoding
    its (uncompressed) body is not in, a 400 every time."""
    if case.headers:
        for name in [n for n in case.headers if n.lower() == "content-encoding"]:
            del case.headers[name]
    if case.operation.path != "/v1/systemone":
        return
    body = case.body
    envelope = body.get("request") if isinstance(body, dict) and isinstance(body.get("request"), dict) else body
    if isinstance(envelope, dict) and "model" in envelope:
        envelope["model"] = "jev-latest"


async def start_stack(stack: Stack, checkpoint: str, redis_url: str):
    """A worker on the tiny checkpoint and a frontend routing to it, rate limits on (far above what a run sends)."""
    return await stack.worker_and_frontend(
        dict(
            JEV_RECIPE="smollm2-135m-cpu",
            JEV_MODEL_PATH=checkpoint,
            JEV_DEVICE="cpu",
            JEV_DTYPE="float32",
            JEV_TORCH_THREADS="1",
            JEV_REDIS_URL=redis_url,
            JEV_DEADLINE_S=str(DEADLINE_S),
            JEV_WORKER_ID=f"fuzz-{secrets.token_hex(4)}",
        ),
        dict(JEV_REDIS_URL=redis_url, JEV_RATE_LIMITS=RATE_LIMIT, JEV_FRONTEND_TIMEOUT_S=str(FRONTEND_TIMEOUT_S)),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=10_000, help="cases in all (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="folder for the services' logs and results.json (default: a temporary one)")
    parser.add_argument("--redis-url", default=os.environ.get("JEV_TEST_REDIS_URL", "redis://127.0.0.1:6379/13"))
    args = parser.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="jev-fuzz-"))
    out.mkdir(parents=True, exist_ok=True)
    tally = asyncio.run(_bench(args, out))
    summary = tally.summary() | {"cpu": cpu_model(), "python": platform.python_version(), "seed": args.seed}
    (out / "results.json").write_text(json.dumps(summary, indent=2) + "\n")
    for failure in tally.failures[:50]:
        print(failure.line())
    print(json.dumps(summary, indent=2))
    print(f"results: {out / 'results.json'}")
    return 1 if tally.failures else 0


async def _bench(args, out: Path) -> Tally:
    from tools.tiny_checkpoints import make_tiny_text

    checkpoint = str(make_tiny_text(out / "tiny-checkpoint"))
    async with Stack(out / "logs") as stack:
        _worker, frontend = await start_stack(stack, checkpoint, args.redis_url)
        fuzzer = Fuzzer(frontend.url, seed=args.seed)
        return await asyncio.to_thread(fuzzer.run, args.cases)


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return platform.processor() or "unknown"


if __name__ == "__main__":
    sys.exit(main())
