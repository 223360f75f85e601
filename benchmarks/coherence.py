"""Coherence modes off, `cyclic` and `prior` (the request's x_coherence) side by side in one run on the embedded model:
jevbench's coherence on a named subset, accuracy on jevbench's labelled corpus, the mean top probability and the cost
per answer in time and prompt tokens.

    python -m benchmarks.coherence [--domains D,...|all] [--relations R,...] [--suite jevbench-mini]
                                   [--accuracy-cases N] [--l3 on|off] [--tiny]

The subset (default, "coherence-6"): jevbench-mini's tests of option_permutation and clone_symmetry (REP) and
option_closure and option_clone (MEA: the two choice relations of MEA.partition the embedded model passes at least
once with the mode off) on 6 of its 12 domains (DOMAINS below): 12 tests per relation, 156 requests, jevbench's own
fixed plan (the same requests for every mode). One worker (`python -m jev_worker`, the embedded SmolLM2 unless
`--tiny`) answers every request of the plan in every mode, the modes interleaved request by request (their order
rotated), so a change in the machine's load falls on all of them alike; jevbench then scores each mode on those
answers. Beside it, accuracy on jevbench-240's cases of the same domains (benchmarks/jevbench_gold.py: the gold
answers regenerated from jevbench's datagen), their choice and score questions (the modes change only those), and
a uniform answerer's row: jevbench's README warns that answering uniformly scores high on coherence at chance
accuracy, so a mode that only flattens answers shows as higher coherence with lower top probability and accuracy.
Prompt tokens are counted by the worker (usage) and split with its own prompt builder into the state prefix
(prefilled once per request) and the rows after it: the permutation rows never pay a state prefill each.
Needs `jevbench` (requirements-dev).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from benchmarks.cpu_speed import cpu_description

REPO = Path(__file__).resolve().parents[1]
MODES = ("off", "cyclic", "prior")
DOMAINS = ["customer_support", "content_moderation", "finance_ops", "security_ops", "it_incidents", "ecommerce_returns"]
RELATIONS = ["option_permutation", "clone_symmetry", "option_closure", "option_clone"]


def worker_env(tiny_dir: Path | None, port: int, l3: bool = True) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JEV_")}
    if not l3:
        env["JEV_CACHE_L3"] = "0"  # every request prefills its state, as one about a state seen for the first time
    env.update(
        PYTHONPATH=f"{REPO / 'services'}:{REPO}",
        JEV_WORKER_HOST="127.0.0.1",
        JEV_WORKER_PORT=str(port),
        JEV_REDIS_URL="",  # no cache index: nothing to announce, no connection errors to print
        JEV_WORKER_REGISTER_TTL_S="0",
        JEV_LOG_LEVEL="error",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
    )
    if tiny_dir is not None:
        env.update(JEV_MODEL_PATH=str(tiny_dir), JEV_DTYPE="float32")
    return env


def tiny_checkpoint() -> Path:
    """A tiny random checkpoint with a position prior computed for it by tools.calibrate_prior (the embedded
    recipe's prior is its own checkpoint's)."""
    from tools.tiny_checkpoints import make_tiny_text

    folder = make_tiny_text(Path(tempfile.mkdtemp(prefix="jev-coherence-")) / "tiny")
    subprocess.run(
        [sys.executable, "-m", "tools.calibrate_prior", "--out", str(folder / "decision_config.json")],
        env=worker_env(folder, 0),
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=REPO,
    )
    return folder


def read_health(url: str) -> dict:
    """A worker's /health body."""
    with urllib.request.urlopen(url + "/health", timeout=5) as answer:
        return json.loads(answer.read())


def post_systemone(url: str, body: dict, label: str) -> tuple[dict, float]:
    """The reply to one System One request and the seconds it took; a refusal raises, named by `label`."""
    request = urllib.request.Request(
        url + "/v1/systemone", data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=600) as answer:
            reply = json.loads(answer.read())
    except urllib.error.HTTPError as error:
        raise RuntimeError(f"{label}: {error.code} {error.read()[:400]!r}") from None
    return reply, time.perf_counter() - started


class Worker:
    def __init__(self, tiny_dir: Path | None, l3: bool = True):
        from tests.fakes.net import free_port
        from tools.stack_run import spawn, wait_healthy

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(tempfile.mkdtemp(prefix="jev-coherence-log-")) / "worker.log"
        self.process = spawn(
            "worker", [sys.executable, "-m", "jev_worker"], worker_env(tiny_dir, self.port, l3), REPO, self.log_path
        )
        wait_healthy(self.process, self.url + "/health", others=[], timeout_s=300, log=lambda line: None)
        self.health = read_health(self.url)

    def ask(self, state, questions: dict, mode: str) -> tuple[dict, float]:
        body = {"model": "jev-latest", "state": state, "questions": questions, "x_coherence": mode}
        return post_systemone(self.url, body, mode)

    def stop(self) -> None:
        from tools.stack_run import stop_all

        stop_all([self.process], log=lambda line: None)


class PromptCounter:
    """Each request's state-prefix and row tokens, from the worker's own prompt builder over the checkpoint's
    tokenizer (no model): the prefix is prefilled once per request, the rows follow it."""

    def __init__(self, tiny_dir: Path | None):
        from transformers import AutoTokenizer

        from jev_common.recipe import load_recipe
        from jev_worker.loading.loader import resolve_checkpoint
        from jev_worker.prompt.builder import ChatPromptBuilder

        recipe = load_recipe()
        folder = resolve_checkpoint(recipe, str(tiny_dir) if tiny_dir else None)
        gguf = recipe.model.gguf_file
        kwargs = {"gguf_file": gguf} if gguf and os.path.isfile(os.path.join(folder, gguf)) else {}
        self.builder = ChatPromptBuilder(AutoTokenizer.from_pretrained(folder, **kwargs), recipe, "count")

    def count(self, state, questions: dict, mode: str) -> tuple[int, list[int], int]:
        from jev_common.schema import SystemOneRequest
        from jev_common.state_text import render_state
        from jev_worker.questions.plan import rows_for

        request = SystemOneRequest.model_validate({"model": "jev-latest", "state": state, "questions": questions})
        layout = "cyclic" if mode == "cyclic" else "off"  # `prior` reads the single-pass rows
        rows, plan = rows_for(request.questions, request.state, self.builder, coherence=layout)
        prepared = self.builder.prepare(render_state(request.state), rows, (), plan)
        return len(prepared.prefix_ids), [len(r) for r in prepared.rows], computed_row_tokens(prepared.rows)


def computed_row_tokens(rows, pack_tokens: int = 512) -> int:
    """The row tokens the worker's packed forwards run after the prefix (forwards.packs at the default
    JEV_PACK_TOKENS): rows that begin with the same tokens run their stem once per pack."""
    from jev_worker.engine.forwards import packs

    pairs = [(None, tuple(row)) for row in rows]
    return sum(segment.tokens(pairs) for pack in packs(pairs, pack_tokens) for segment in pack)


def uniform(questions: dict) -> dict:
    out = {}
    for key, q in questions.items():
        if q["type"] == "noul":
            out[key] = {"type": "noul", "noul": 0.5}
        else:
            keys = list(q["criteria"]) if q["type"] == "choice" else [str(i) for i in range(len(q["criteria"]))]
            out[key] = {"type": q["type"], "probabilities": {k: 1 / len(keys) for k in keys}}
    return out


def request_key(state, questions: dict) -> str:
    return json.dumps([state, questions])  # insertion order kept: a reordered batch is another request


def evaluate(answer, args):
    import jevbench as jb

    return jb.evaluate(
        jb.from_callable(answer), suite=args.suite, domains=args.domains, relations=args.relations, cache=None
    )


def rotated(index: int) -> tuple[str, ...]:
    """The modes in the order request `index` asks them: interleaved, the first one rotated request by request."""
    return MODES[index % len(MODES) :] + MODES[: index % len(MODES)]


def run(args) -> dict:
    from benchmarks.jevbench_gold import correct, labelled, uniform_accuracy

    plan: dict[str, tuple] = {}

    def record(state, questions):  # jevbench's fixed plan, asked of a uniform answerer
        plan.setdefault(request_key(state, questions), (state, questions))
        return uniform(questions)

    uniform_report = evaluate(record, args)
    items, unmatched = labelled(args.domains)
    items = [] if args.accuracy_cases < 0 else items[: args.accuracy_cases] if args.accuracy_cases else items
    graded = [
        (case, {qid: g for qid, g in gold.items() if case["questions"][qid]["type"] in ("choice", "score")})
        for case, gold in items
    ]
    graded = [(case, gold) for case, gold in graded if gold]
    tiny_dir = tiny_checkpoint() if args.tiny else None
    counter = PromptCounter(tiny_dir)
    worker = Worker(tiny_dir, args.l3 == "on")
    answers: dict[tuple[str, str], dict] = {}
    cost = {
        m: {
            "seconds": 0.0,
            "answers": 0,
            "tokens": 0,
            "prefix": 0,
            "rows": 0,
            "computed": 0,
            "row_count": 0,
            "requests": 0,
            "per_row_prefill": 0,
            "mismatch": 0,
            "tops": [],
        }
        for m in MODES
    }
    accuracy = {m: [] for m in MODES}
    started = time.perf_counter()
    try:
        for index, (key, (state, questions)) in enumerate(plan.items()):
            for mode in rotated(index):
                reply, seconds = worker.ask(state, questions, mode)
                answers[key, mode] = reply["answers"]
                c = cost[mode]
                prefix, rows, computed = counter.count(state, questions, mode)
                c["seconds"] += seconds
                c["answers"] += len(reply["answers"])
                c["tokens"] += reply["usage"]["input_tokens"]
                c["prefix"] += prefix
                c["rows"] += sum(rows)
                c["computed"] += computed
                c["row_count"] += len(rows)
                c["requests"] += 1
                c["per_row_prefill"] += len(rows) * prefix + sum(rows)
                c["mismatch"] += reply["usage"]["input_tokens"] != prefix + sum(rows)
                c["tops"] += [
                    max(a["probabilities"].values()) for a in reply["answers"].values() if a.get("type") == "choice"
                ]
        for index, (case, gold) in enumerate(graded):
            questions = {qid: case["questions"][qid] for qid in gold}
            for mode in rotated(index):
                reply, _ = worker.ask(case["state"], questions, mode)
                accuracy[mode] += [correct(questions[qid], reply["answers"][qid], g) for qid, g in gold.items()]
    finally:
        worker.stop()
    wall = time.perf_counter() - started
    reports = {}
    for mode in MODES:
        live = []

        def cached(state, questions, mode=mode, live=live):
            key = request_key(state, questions)
            if (key, mode) not in answers:  # not in the recorded plan (never so far): asked now, counted
                live.append(key)
                raise RuntimeError(f"request outside the recorded plan: {key[:200]}")
            return answers[key, mode]

        reports[mode] = (evaluate(cached, args), live)
    return {
        "plan": plan,
        "uniform": uniform_report,
        "reports": reports,
        "cost": cost,
        "accuracy": accuracy,
        "uniform_accuracy": uniform_accuracy(graded, ("choice", "score")) if graded else None,
        "labelled": (len(graded), sum(len(g) for _, g in graded), unmatched),
        "wall": wall,
        "prior": worker.health["detail"]["serving"]["calibration"].get("position_prior"),
    }


def scores(report, relation: str = "option_permutation") -> dict:
    from jevbench.results import card

    checks = {c["relation"]: c for c in card(report.result)}
    check = checks.get(relation)
    relations = [v for v in report.relations.values() if v is not None]
    return {
        "tests": check["n"] if check else None,
        "within": (check["n"] - check["violations"]) if check else None,
        "deviation": check["mean_deviation"] if check else None,
        "REP": report.dimensions.get("REP"),
        "MEA": report.dimensions.get("MEA"),
        "subset": statistics.mean(relations) if relations else None,
        "errors": len(report.errors),
    }


def pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def rows(result: dict) -> list[dict]:
    out = []
    base = result["cost"]["off"]
    base_s = base["seconds"] / max(1, base["answers"])
    base_t = base["tokens"] / max(1, base["answers"])
    u = scores(result["uniform"])
    out.append({"mode": "uniform answerer", **u, "accuracy": result["uniform_accuracy"], "top": None})
    for mode in MODES:
        c, s = result["cost"][mode], scores(result["reports"][mode][0])
        acc = result["accuracy"][mode]
        out.append(
            {
                "mode": mode,
                **s,
                "accuracy": sum(acc) / len(acc) if acc else None,
                "top": statistics.mean(c["tops"]) if c["tops"] else None,
                "s_answer": c["seconds"] / max(1, c["answers"]),
                "x_time": c["seconds"] / max(1, c["answers"]) / base_s,
                "t_answer": c["tokens"] / max(1, c["answers"]),
                "x_tokens": c["tokens"] / max(1, c["answers"]) / base_t,
                "prefix_request": c["prefix"] / max(1, c["requests"]),
                "rows_request": c["row_count"] / max(1, c["requests"]),
                "row_tokens_request": c["rows"] / max(1, c["requests"]),
                "computed_request": c["computed"] / max(1, c["requests"]),
                "x_computed": c["computed"] / max(1, base["computed"]),
                "per_row_prefill_answer": c["per_row_prefill"] / max(1, c["answers"]),
                "mismatch": c["mismatch"],
            }
        )
    return out


def table(result: dict) -> str:
    all_rows = rows(result)
    lines = [
        (
            "| x_coherence | option_permutation within tolerance | its mean deviation | REP | MEA | subset mean | "
            "accuracy (labelled, choice+score) | mean top p (choice) | s / answer | prompt tokens / answer |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in all_rows:
        costs = (
            ("-", "-")
            if r["mode"] == "uniform answerer"
            else (f"{r['s_answer']:.4f} (x{r['x_time']:.2f})", f"{r['t_answer']:.1f} (x{r['x_tokens']:.2f})")
        )
        lines.append(
            f"| {r['mode']} | {r['within']}/{r['tests']} | "
            f"{'-' if r['deviation'] is None else round(r['deviation'], 4)} | {pct(r['REP'])} | {pct(r['MEA'])} | "
            f"{pct(r['subset'])} | {pct(r['accuracy'])} | {'-' if r['top'] is None else round(r['top'], 4)} | "
            f"{costs[0]} | {costs[1]} |"
        )
    lines += [
        "",
        (
            "| x_coherence | state-prefix tokens / request (prefilled once) | rows / request | row tokens / request | "
            "row tokens run / request (stems once) | prompt tokens / answer | "
            "if every row prefilled the state: tokens / answer |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for r in all_rows[1:]:
        lines.append(
            f"| {r['mode']} | {r['prefix_request']:.1f} | {r['rows_request']:.2f} | {r['row_tokens_request']:.1f} | "
            f"{r['computed_request']:.1f} (x{r['x_computed']:.2f}) | {r['t_answer']:.1f} | "
            f"{r['per_row_prefill_answer']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coherence", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="jevbench-mini")
    parser.add_argument("--domains", default=",".join(DOMAINS), help="jevbench domains (comma-separated) or `all`")
    parser.add_argument("--relations", type=lambda s: [r for r in s.split(",") if r], default=RELATIONS)
    parser.add_argument(
        "--accuracy-cases", type=int, default=0, help="at most this many labelled cases (0: all, -1: none)"
    )
    parser.add_argument(
        "--l3",
        choices=("on", "off"),
        default="on",
        help="the worker's L3 prefix cache (off: every request prefills its state once)",
    )
    parser.add_argument("--tiny", action="store_true", help="a tiny random checkpoint (smoke)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args(argv)
    args.domains = None if args.domains == "all" else [d for d in args.domains.split(",") if d]
    print(f"# CPU: {cpu_description()}", flush=True)
    result = run(args)
    count, graded, unmatched = result["labelled"]
    print(
        f"# L3 {args.l3}; {args.suite}, domains {','.join(args.domains) if args.domains else 'all'}, relations "
        f"{','.join(args.relations)}: {len(result['plan'])} requests per mode; labelled: {count} cases of "
        f"jevbench-240, {graded} choice/score questions with gold ({unmatched} cases unmatched); "
        f"{result['wall']:.0f} s; prior: {json.dumps(result['prior'])[:300]}",
        flush=True,
    )
    broken = failures(result)
    for line in broken:
        print(f"# FAILED {line}", flush=True)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(rows(result), indent=1))
    return 1 if broken else 0


def failures(result: dict) -> list[str]:
    """The modes whose figures cannot be trusted: jevbench asked a request outside the recorded plan, scoring
    raised, or the worker counted other prompt tokens than its own prompt builder does."""
    out = []
    for mode in MODES:
        live, errors = result["reports"][mode][1], len(result["reports"][mode][0].errors)
        mismatch = result["cost"][mode]["mismatch"]
        if live or errors or mismatch:
            out.append(
                f"{mode}: {len(live)} requests outside the plan, {errors} errors, {mismatch} token counts unlike "
                "the worker's"
            )
    return out


if __name__ == "__main__":
    sys.exit(main())
