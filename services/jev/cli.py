"""jev — send decisions to the stack: one, as a bar chart (`ask`), or a whole dataset (`batch`).

    python -m jev ask "It is raining and I am going out." "What should I take?" umbrella sunglasses
    python -m jev ask --type noul "The door is open." "Is anyone home?"
    python -m jev ask --type score "The soup is lukewarm." "How hot is it?" cold warm hot
    python -m jev batch requests.jsonl -o answers.jsonl
    python -m jev batch tickets.csv --questions questions.json --state-column body -o answers.jsonl

The request is the System One envelope (`{"model", "state", "questions": {"q": ...}}`) posted to
URL/v1/systemone; URL is --url, else $JEV_URL, else http://127.0.0.1:8080 (the frontend of `make up`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from .batch.inputs import CsvSpec, InputError
from .batch.runner import BatchOptions, errors_path_for, run_batch
from .chart import chart
from .client import ApiFailure, envelope, post

DEFAULT_URL = "http://127.0.0.1:8080"


def render(answer: dict, usage: dict | None, model: str | None, *, unicode: bool = True) -> str:
    kind = answer.get("type")
    if kind == "noul":
        p = float(answer["noul"])
        head = f"noul: P(yes) = {p:.3f}"
        body = chart([("yes", p), ("no", 1.0 - p)], mark="yes" if p >= 0.5 else "no", unicode=unicode)
    elif kind == "score":
        legend = answer.get("legend") or {}
        rows = [(f"{level} {legend.get(level, '')}".rstrip(), float(p)) for level, p in answer["probabilities"].items()]
        top = max(answer["probabilities"], key=answer["probabilities"].get)
        mark = f"{top} {legend.get(top, '')}".rstrip()
        head = f"score: {float(answer['score']):.3f}  (confidence {float(answer['confidence']):.3f})"
        body = chart(rows, mark=mark, unicode=unicode)
    elif kind == "choice":
        rows = [(name, float(p)) for name, p in answer["probabilities"].items()]
        head = f"choice: {answer['choice']}  (confidence {float(answer['confidence']):.3f})"
        body = chart(rows, mark=answer["choice"], unicode=unicode)
    else:
        return json.dumps(answer, indent=2)
    tail = []
    if model:
        tail.append(f"model {model}")
    if usage:
        tail.append(f"{usage.get('input_tokens', '?')} input tokens")
    return "\n".join([head, body] + (["  " + " · ".join(tail)] if tail else []))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="jev",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    sub = parser.add_subparsers(dest="command", required=True)
    ask = sub.add_parser("ask", help="ask one question about a state")
    ask.add_argument("state", help="the state, as text")
    ask.add_argument("question", help="the question (the instructions)")
    ask.add_argument("options", nargs="*", help="choice: the option names; score: the levels, lowest first")
    ask.add_argument("--type", dest="kind", choices=("choice", "noul", "score"), default="choice")
    ask.add_argument(
        "--url",
        default=os.environ.get("JEV_URL", DEFAULT_URL),
        help=f"the stack's base URL (default $JEV_URL or {DEFAULT_URL})",
    )
    ask.add_argument("--model", default="jev-latest")
    ask.add_argument("--api-key", default=os.environ.get("JEV_API_KEY"), help="sent as a Bearer token ($JEV_API_KEY)")
    ask.add_argument("--timeout", type=float, default=60.0)
    ask.add_argument("--json", action="store_true", help="print the raw answer instead of the chart")
    _batch_parser(sub)
    return parser


def _positive_int(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _batch_parser(sub) -> None:
    batch = sub.add_parser(
        "batch",
        help="answer every line of a dataset (JSONL or CSV), resumable",
        description="Send every request of INPUT through the frontend and write the answers to OUTPUT (JSONL in "
        "OpenAI's batch output shape), a state's requests together; a rerun sends only what OUTPUT lacks.",
        epilog="INPUT: JSONL of OpenAI batch lines ({custom_id, method, url: /v1/systemone, body}), JSONL of "
        "System One requests (ids line-N), or CSV with --questions (one request per row; ids row-N or --id-column). "
        "Exit status 0: every line answered; 1: some failed (in the errors file); 2: the run could not start; "
        "130: interrupted (rerun to finish).",
    )
    batch.add_argument("input", metavar="INPUT", help="the input file (`-`: standard input)")
    batch.add_argument("-o", "--output", required=True, metavar="OUTPUT", help="answers, appended (JSONL)")
    batch.add_argument(
        "--errors", metavar="FILE", help="lines that failed (default: OUTPUT with .errors.jsonl), rewritten each run"
    )
    batch.add_argument("--questions", metavar="FILE", help="CSV input: the questions (a JSON object), every row asked")
    batch.add_argument(
        "--state-column",
        action="append",
        default=[],
        metavar="COL",
        help="CSV: a column of the state (repeat for several: an object of them; default every column but the id)",
    )
    batch.add_argument("--id-column", metavar="COL", help="CSV: the column holding each row's custom_id")
    batch.add_argument(
        "--url",
        default=os.environ.get("JEV_URL", DEFAULT_URL),
        help=f"the stack's base URL (default $JEV_URL or {DEFAULT_URL})",
    )
    batch.add_argument("--api-key", default=os.environ.get("JEV_API_KEY"), help="sent as a Bearer token ($JEV_API_KEY)")
    batch.add_argument("--model", default="jev-latest", help="the model of CSV rows and of requests that name none")
    batch.add_argument("--concurrency", type=_positive_int, default=16, help="requests in flight at most (default 16)")
    batch.add_argument(
        "--window",
        type=_positive_int,
        default=2048,
        help="lines read ahead and grouped by state (default 2048; memory: that many requests)",
    )
    batch.add_argument("--ordered", action="store_true", help="write OUTPUT in input order (else as lines finish)")
    batch.add_argument("--max-retries", type=int, default=8, help="retries of a 429/502/503/504 or lost connection")
    batch.add_argument("--timeout", type=float, default=300.0, help="seconds one request may take (default 300)")
    batch.add_argument(
        "--fsync-interval",
        type=float,
        default=1.0,
        metavar="S",
        help="fsync OUTPUT at least this often (default 1 s; 0: after every line)",
    )
    batch.add_argument("--quiet", action="store_true", help="no progress, only the summary")
    batch.add_argument(
        "--progress-every", type=float, default=10.0, metavar="S", help="seconds between progress lines off a terminal"
    )


def batch_main(args: argparse.Namespace) -> int:
    if args.questions is None and (args.state_column or args.id_column):
        print("jev batch: --state-column and --id-column read CSV input, which needs --questions", file=sys.stderr)
        return 2
    if args.questions is None and args.input.lower().endswith(".csv"):
        print("jev batch: CSV input needs --questions FILE (the questions asked of every row)", file=sys.stderr)
        return 2
    try:
        spec = None
        if args.questions is not None:
            spec = CsvSpec.load(args.questions, args.state_column, args.id_column, args.model)
    except InputError as exc:
        print(f"jev batch: {exc}", file=sys.stderr)
        return 2
    options = BatchOptions(
        input=args.input,
        output=args.output,
        errors=args.errors or errors_path_for(args.output),
        url=args.url,
        api_key=args.api_key,
        model=args.model,
        csv=spec,
        concurrency=args.concurrency,
        window=args.window,
        ordered=args.ordered,
        max_retries=max(0, args.max_retries),
        timeout_s=args.timeout,
        fsync_interval_s=args.fsync_interval,
        progress=not args.quiet,
        progress_every_s=args.progress_every,
    )
    return run_batch(options)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "batch":
        return batch_main(args)
    try:
        body = envelope(args.state, args.question, args.options, args.kind, args.model)
    except ValueError as exc:
        print(f"jev: {exc}", file=sys.stderr)
        return 2
    url = args.url.rstrip("/") + "/v1/systemone"
    try:
        reply = post(url, body, api_key=args.api_key, timeout=args.timeout)
    except ApiFailure as exc:
        print(f"jev: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(reply, indent=2))
        return 0
    try:
        answer = reply["answers"]["q"]
    except (KeyError, TypeError):
        print(f"jev: the answer has no answers.q: {json.dumps(reply)[:300]}", file=sys.stderr)
        return 1
    unicode = (getattr(sys.stdout, "encoding", "") or "").lower().replace("-", "") in ("utf8", "utf16", "utf32")
    print(render(answer, reply.get("usage"), reply.get("model"), unicode=unicode))
    return 0
