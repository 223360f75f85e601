"""Check that the frontend answers exactly like the worker behind it.

Each request is sent to the worker, then through the frontend, then to the worker again; the frontend's
answer is compared with the SECOND worker answer (both then see a warm cache, so usage.cached_tokens
agree). Compared: the HTTP status; for 200s the decision fields (probabilities and the other floats
within 1e-6, choice_index, choice, noul, score, span, yes_probabilities, selected, usage, kind, model,
request_id; elapsed_seconds ignored); for errors the envelope's error.type.

    python -m tools.compare_with_backend --worker http://127.0.0.1:8000 --frontend http://127.0.0.1:8080 \
        [--corpus requests.jsonl]

The corpus is JSON lines, one /v1/systemone request object a line (blank lines and lines starting
with # are skipped); without --corpus a built-in corpus covering all five kinds is used.
Exit status: 0 all match, 1 a mismatch, 2 bad arguments or corpus.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from jev_common.errors import error_type_of
from jev_common.internal_auth import backend_headers
from tools.local_stack import internal_token

TOLERANCE = 1e-6
FLOAT_FIELDS = ("noul", "score")
FLOAT_LIST_FIELDS = ("probabilities", "yes_probabilities")
EXACT_FIELDS = ("kind", "model", "request_id", "choice_index", "choice", "span", "selected", "usage")

DEFAULT_CORPUS: list[dict] = [
    {
        "request_id": "choice-1",
        "kind": "choice",
        "state": "The light is red and the car is moving.",
        "question": "What should the driver do?",
        "options": ["stop", "accelerate", "turn around"],
    },
    {
        "request_id": "choice-2",
        "kind": "choice",
        "state": {"text": "A cat sits on a warm mat."},
        "question": "Where is the cat?",
        "options": ["on the mat", "in a tree"],
    },
    {
        "request_id": "noul-1",
        "kind": "noul",
        "state": "The box contains three apples.",
        "question": "What is in the box?",
        "options": ["oranges", "bananas"],
    },
    {
        "request_id": "score-1",
        "kind": "score",
        "state": "The film was long but the acting was superb.",
        "question": "Rate the review from 1 to 5.",
        "options": ["1", "2", "3", "4", "5"],
    },
    {
        "request_id": "span-1",
        "kind": "span",
        "state": "Alice met Bob in Paris on Monday.",
        "question": "Where did they meet?",
        "options": ["Paris", "Monday", "Alice"],
    },
    {
        "request_id": "set-1",
        "kind": "set",
        "state": "The soup is hot, salty and green.",
        "question": "Which statements are true?",
        "options": ["The soup is hot", "The soup is cold", "The soup is green"],
    },
    {
        "request_id": "deadline-1",
        "kind": "choice",
        "state": "It is raining.",
        "question": "Take an umbrella?",
        "options": ["yes", "no"],
        "deadline_s": 20,
    },
    # Deliberately invalid (duplicate options): both must refuse it with 422 validation_error.
    {"request_id": "invalid-1", "kind": "choice", "state": "x", "question": "Pick one.", "options": ["a", "a"]},
]


@dataclass(frozen=True)
class Mismatch:
    index: int
    request_id: str | None
    field: str
    worker: Any
    frontend: Any

    def __str__(self) -> str:
        return (
            f"#{self.index} {self.request_id or '-'}: {self.field}: worker={self.worker!r} frontend={self.frontend!r}"
        )


@dataclass
class Answer:
    status: int | None  # None: no HTTP answer at all (see error)
    body: Any = None
    error: str | None = None


@dataclass
class Row:
    index: int
    request: dict
    worker_first: Answer
    frontend: Answer
    worker: Answer  # the second worker answer, the one compared
    mismatches: list[Mismatch] = field(default_factory=list)


def _close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        return False
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= TOLERANCE * max(1.0, abs(a), abs(b))


def _error_type(body: dict) -> Any:
    return error_type_of(body)


def diff_answers(index: int, request: dict, worker: Answer, frontend: Answer) -> list[Mismatch]:
    rid = request.get("request_id") if isinstance(request, dict) else None
    out: list[Mismatch] = []

    def miss(name: str, w: Any, f: Any) -> None:
        out.append(Mismatch(index, rid, name, w, f))

    if worker.status != frontend.status:
        miss(
            "status",
            worker.status if worker.status is not None else worker.error,
            frontend.status if frontend.status is not None else frontend.error,
        )
        return out
    if worker.status is None:
        return out  # neither answered; reported by the caller as a transport failure
    w, f = worker.body, frontend.body
    if not isinstance(w, dict) or not isinstance(f, dict):
        if w != f:
            miss("body", w, f)
        return out
    if worker.status != 200:
        if _error_type(w) != _error_type(f):
            miss("error.type", _error_type(w), _error_type(f))
        return out
    for name in FLOAT_LIST_FIELDS:
        wl, fl = w.get(name), f.get(name)
        if wl is None or fl is None or not isinstance(wl, list) or not isinstance(fl, list):
            if wl != fl:
                miss(name, wl, fl)
        elif len(wl) != len(fl) or not all(_close(a, b) for a, b in zip(wl, fl)):
            miss(name, wl, fl)
    for name in FLOAT_FIELDS:
        if not _close(w.get(name), f.get(name)):
            miss(name, w.get(name), f.get(name))
    for name in EXACT_FIELDS:
        if w.get(name) != f.get(name):
            miss(name, w.get(name), f.get(name))
    return out


async def _send(
    session: aiohttp.ClientSession,
    base_url: str,
    payload: bytes,
    timeout_s: float,
    headers: dict[str, str] | None = None,
) -> Answer:
    try:
        async with session.post(
            base_url.rstrip("/") + "/v1/systemone",
            data=payload,
            headers={"Content-Type": "application/json", **(headers or {})},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            raw = await resp.read()
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
            return Answer(resp.status, body)
    except TimeoutError:
        return Answer(None, error=f"timeout after {timeout_s:g}s")
    except aiohttp.ClientError as exc:
        return Answer(None, error=f"{type(exc).__name__}: {exc}")


async def compare_rows(
    worker_url: str,
    frontend_url: str,
    requests: list[dict],
    timeout_s: float = 60.0,
    worker_headers: dict[str, str] | None = None,
) -> list[Row]:
    """worker_headers: what the worker is sent beside each request (the internal token, where it asks for one)."""
    rows: list[Row] = []
    async with aiohttp.ClientSession() as session:
        for index, request in enumerate(requests):
            payload = json.dumps(request).encode()
            first = await _send(session, worker_url, payload, timeout_s, worker_headers)
            via_frontend = await _send(session, frontend_url, payload, timeout_s)
            second = await _send(session, worker_url, payload, timeout_s, worker_headers)
            row = Row(index, request, first, via_frontend, second)
            row.mismatches = diff_answers(index, request, second, via_frontend)
            if second.status is None and via_frontend.status is None:
                row.mismatches.append(
                    Mismatch(index, request.get("request_id"), "transport", second.error, via_frontend.error)
                )
            rows.append(row)
    return rows


async def compare(worker_url: str, frontend_url: str, requests: list[dict], timeout_s: float = 60.0) -> list[Mismatch]:
    """Every mismatch between the frontend's and the worker's answers to `requests` (empty: all match)."""
    rows = await compare_rows(worker_url, frontend_url, requests, timeout_s)
    return [m for row in rows for m in row.mismatches]


def compare_sync(worker_url: str, frontend_url: str, requests: list[dict], timeout_s: float = 60.0) -> list[Mismatch]:
    """compare() for callers without a running event loop."""
    return asyncio.run(compare(worker_url, frontend_url, requests, timeout_s))


def load_corpus(path: Path) -> list[dict]:
    requests = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            text = line.strip()
            if not text or text.startswith("#"):
                continue
            try:
                item = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON: {exc}") from None
            if not isinstance(item, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object (one request), got {type(item).__name__}")
            requests.append(item)
    if not requests:
        raise ValueError(f"{path}: no requests")
    return requests


def _short(value: Any, width: int) -> str:
    text = str(value)
    return text if len(text) <= width else text[: width - 1] + "~"


def render(rows: list[Row]) -> str:
    lines = [f"{'#':>3}  {'request_id':<16} {'kind':<7} {'worker':>6} {'front':>6}  result", "-" * 72]
    for row in rows:
        req = row.request
        fields_ = sorted({m.field for m in row.mismatches})
        result = "ok" if not fields_ else "MISMATCH " + ",".join(fields_)
        lines.append(
            f"{row.index:>3}  {_short(req.get('request_id') or '-', 16):<16} {_short(req.get('kind'), 7):<7} "
            f"{_short(row.worker.status, 6):>6} {_short(row.frontend.status, 6):>6}  {result}"
        )
    details = [f"  {m}" for row in rows for m in row.mismatches]
    if details:
        lines += ["", "mismatches:", *details]
    bad = sum(1 for row in rows if row.mismatches)
    lines += ["", f"summary: {len(rows)} requests, {len(rows) - bad} match, {bad} mismatch"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compare_with_backend", description=__doc__.split("\n")[0])
    parser.add_argument("--worker", required=True, help="worker base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--frontend", required=True, help="frontend base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--corpus", type=Path, help="JSON lines of requests (default: the built-in corpus)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request (default 60)")
    parser.add_argument(
        "--internal-token",
        default=None,
        help="the worker's internal token (default: JEV_INTERNAL_TOKENS' first, else the one "
        "`make up` generated in .cache/local-stack/jev-secrets)",
    )
    args = parser.parse_args(argv)
    token = args.internal_token or internal_token()
    try:
        requests = load_corpus(args.corpus) if args.corpus else DEFAULT_CORPUS
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = asyncio.run(
        compare_rows(args.worker, args.frontend, requests, args.timeout, backend_headers((token,) if token else ()))
    )
    print(render(rows))
    return 1 if any(row.mismatches for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
