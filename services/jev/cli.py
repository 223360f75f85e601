"""jev — send one decision to the stack and see its probabilities as a bar chart.

    python -m jev ask "It is raining and I am going out." "What should I take?" umbrella sunglasses
    python -m jev ask --type noul "The door is open." "Is anyone home?"
    python -m jev ask --type score "The soup is lukewarm." "How hot is it?" cold warm hot

The request is the System One envelope (`{"model", "state", "questions": {"q": ...}}`) posted to
URL/v1/systemone; URL is --url, else $JEV_URL, else http://127.0.0.1:8080 (the frontend of `make up`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

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
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
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
