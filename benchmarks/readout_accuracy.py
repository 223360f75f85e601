"""Readouts side by side on the embedded model: label tokens, option scoring without calibration and option scoring
with its content-free baseline (PMI), on labelled questions of two sets.

    python -m benchmarks.readout_accuracy [--sets jevbench,everyday] [--cases N] [--readouts R,...]
                                          [--timing-requests N] [--out DIR] [--tiny]

- jevbench: jevbench-240's labelled cases (benchmarks/jevbench_gold.py: the gold answers regenerated from jevbench's
  datagen), every question of each case asked, the labelled ones graded;
- everyday: benchmarks/data/everyday-210.jsonl, 70 short hand-written states with one yes/no, one choice and one
  score question each whose answer the state makes plain (the gold choice rotated evenly over the positions).

One worker per readout (`python -m jev_worker` on the embedded recipe with its serving family and options replaced,
from a recipe folder written here), all started before the first request; each case is asked of every readout in
turn (the order rotated case by case), so a change in the machine's load falls on all of them alike. Measured per
readout and set: accuracy (the most probable option or level, or noul's side of 0.5, is the gold answer) beside a
uniform answerer's expected accuracy; the Brier score (sum over the options of (p - 1{gold})^2) and expected
calibration error (10 equal-width bins of the top probability); the mean total-variation distance between the
choice answers of the options as sent and reversed (the request asked again, every choice's options reversed);
and the time per answer (a request's latency over its questions) at concurrency 1 and 8, on the first
`--timing-requests` cases with their states prefixed by a line the other passes never sent (no L1 or L3 hit on the
state, as a new state would be), after the graded pass has asked every question once (the option scoring baseline
is per question, so it is cached by then). Writes results.json under --out and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from benchmarks.coherence import post_systemone, read_health, worker_env
from benchmarks.cpu_speed import cpu_description

REPO = Path(__file__).resolve().parents[1]
EVERYDAY = REPO / "benchmarks" / "data" / "everyday-210.jsonl"
SYSTEM = "You are a careful assistant. Read the state and answer the question."
READOUTS = {  # name -> the family and options the embedded recipe is served with
    "label-tokens": {"family": "label-tokens", "options": {}},
    "scores-raw": {"family": "option-scoring", "options": {"baseline": "none", "system": SYSTEM}},
    "scores-pmi": {"family": "option-scoring", "options": {"baseline": "content-free", "system": SYSTEM}},
}
BINS = 10


def everyday_items() -> list[tuple[dict, dict]]:
    lines = [json.loads(x) for x in EVERYDAY.read_text(encoding="utf-8").splitlines() if x.strip()]
    return [({k: v for k, v in line.items() if k != "gold"}, line["gold"]) for line in lines]


def jevbench_items() -> list[tuple[dict, dict]]:
    from benchmarks.jevbench_gold import labelled

    return labelled()[0]


SETS = {"jevbench": jevbench_items, "everyday": everyday_items}


def recipe_folder(name: str, spec: dict, tiny: bool) -> Path:
    """The embedded recipe served as `spec` (its family, and its options over the recipe's own when the recipe is
    served by that family), written to a folder of its own with the JSON files beside the recipe's."""
    from jev_common.recipe import load_recipe

    base = load_recipe()
    data = base.model_dump(mode="json")
    options = dict(spec["options"])
    if spec["family"] == base.serving.family:  # the recipe's own options (its system turn, its fitted scaling)
        options = {**base.serving.options, **options}
    data["serving"] = {**data["serving"], "family": spec["family"], "options": options}
    data["name"] = f"{base.name}-{name}"
    folder = Path(tempfile.mkdtemp(prefix="jev-readout-")) / "recipe"
    folder.mkdir()
    assert base.folder is not None, "a recipe read from its folder"
    for extra in base.folder.iterdir():
        if extra.suffix == ".json":
            (folder / extra.name).write_bytes(extra.read_bytes())
    (folder / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return folder


class Worker:
    """`python -m jev_worker` on its own recipe folder, answering System One requests."""

    def __init__(self, folder: Path, tiny_dir: Path | None):
        from tests.fakes.net import free_port
        from tools.stack_run import spawn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {**worker_env(tiny_dir, self.port), "JEV_RECIPE": str(folder)}
        self.process = spawn("worker", [sys.executable, "-m", "jev_worker"], env, REPO, folder.parent / "worker.log")
        self.health: dict = {}

    def wait(self) -> None:
        """Until it is ready (the workers load side by side)."""
        from tools.stack_run import wait_healthy

        wait_healthy(self.process, self.url + "/health", others=[], timeout_s=900, log=lambda line: None)
        self.health = read_health(self.url)

    def answers(self, state, questions: dict) -> tuple[dict, float]:
        reply, seconds = post_systemone(
            self.url, {"model": "jev-latest", "state": state, "questions": questions}, self.url
        )
        return reply["answers"], seconds

    def stop(self) -> None:
        from tools.stack_run import stop_all

        stop_all([self.process], log=lambda line: None)


def options_of(question: dict) -> list[str]:
    if question["type"] == "noul":
        return ["yes", "no"]
    if question["type"] == "choice":
        return list(question["criteria"])
    return [str(i) for i in range(len(question["criteria"]))]


def distribution(question: dict, answer: dict) -> dict[str, float]:
    if question["type"] == "noul":
        return {"yes": answer["noul"], "no": 1 - answer["noul"]}
    return dict(answer["probabilities"])


def gold_key(question: dict, gold) -> str:
    if question["type"] == "noul":
        return "yes" if gold else "no"
    return str(gold)


def grade(question: dict, answer: dict, gold) -> dict:
    """Correct, Brier and the top probability of one answer (ties: the earliest option, as the API breaks them)."""
    from benchmarks.jevbench_gold import correct

    probs = distribution(question, answer)
    want = gold_key(question, gold)
    brier = sum((probs[k] - (k == want)) ** 2 for k in options_of(question))
    return {
        "type": question["type"],
        "correct": correct(question, answer, gold),
        "brier": brier,
        "top": max(probs.values()),
    }


def uniform_grade(question: dict) -> dict:
    k = len(options_of(question))
    return {"type": question["type"], "correct": 1 / k, "brier": 1 - 1 / k, "top": 1 / k}


def ece(graded: list[dict]) -> float:
    bins: list[list[dict]] = [[] for _ in range(BINS)]
    for g in graded:
        bins[min(BINS - 1, int(g["top"] * BINS))].append(g)
    return sum(
        len(b)
        / len(graded)
        * abs(statistics.mean(float(g["correct"]) for g in b) - statistics.mean(g["top"] for g in b))
        for b in bins
        if b
    )


def summary(graded: list[dict]) -> dict:
    out = {}
    for type_ in ("all", "noul", "choice", "score"):
        chosen = [g for g in graded if type_ == "all" or g["type"] == type_]
        if chosen:
            out[type_] = {
                "n": len(chosen),
                "accuracy": statistics.mean(float(g["correct"]) for g in chosen),
                "brier": statistics.mean(g["brier"] for g in chosen),
                "ece": ece(chosen),
            }
    return out


def reversed_choices(questions: dict) -> dict:
    """The same questions with every choice's options in reverse order (empty when the request has no choice)."""
    if not any(q["type"] == "choice" for q in questions.values()):
        return {}
    return {
        qid: {**q, "criteria": dict(reversed(list(q["criteria"].items())))} if q["type"] == "choice" else q
        for qid, q in questions.items()
    }


def total_variation(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a[k] - b[k]) for k in a)


def timing(worker: Worker, requests: list[tuple[str, dict]], concurrency: int) -> dict:
    per_answer: list[float] = []
    lock = threading.Lock()

    def one(request):
        state, questions = request
        _, seconds = worker.answers(state, questions)
        with lock:
            per_answer.append(seconds / len(questions))

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, requests))
    wall = time.perf_counter() - started
    return {
        "concurrency": concurrency,
        "requests": len(requests),
        "answers": sum(len(q) for _, q in requests),
        "mean_latency_per_answer_s": statistics.mean(per_answer),
        "wall_per_answer_s": wall / sum(len(q) for _, q in requests),
    }


def run(args) -> dict:
    tiny_dir = None
    if args.tiny:
        from tools.tiny_checkpoints import make_tiny_text

        tiny_dir = make_tiny_text(Path(tempfile.mkdtemp(prefix="jev-readout-tiny-")) / "tiny")
    names = args.readouts
    workers = {}
    try:
        for name in names:
            workers[name] = Worker(recipe_folder(name, READOUTS[name], args.tiny), tiny_dir)
        for worker in workers.values():
            worker.wait()
        result = {"cpu": cpu_description(), "args": vars(args), "sets": {}}
        for set_name in args.sets:
            items = SETS[set_name]()
            if args.cases:  # evenly spaced over the set (its domains come in runs)
                items = items[:: max(1, len(items) // args.cases)][: args.cases]
            graded: dict[str, list[Any]] = {name: [] for name in names}
            kept: dict[str, list[Any]] = {name: [] for name in names}  # every graded answer, for results.json
            uniform = []
            tv: dict[str, list[float]] = {name: [] for name in names}
            for index, (case, gold) in enumerate(items):
                questions = case["questions"]
                for qid in gold:
                    uniform.append(uniform_grade(questions[qid]))
                order = names[index % len(names) :] + names[: index % len(names)]
                for name in order:
                    answers, _ = workers[name].answers(case["state"], questions)
                    graded[name] += [grade(questions[qid], answers[qid], g) for qid, g in gold.items()]
                    kept[name] += [
                        {"case": case["id"], "qid": qid, "gold": g, "answer": answers[qid]} for qid, g in gold.items()
                    ]
                    flipped = (
                        reversed_choices(questions) if index < args.reversed_cases or not args.reversed_cases else {}
                    )
                    if flipped:
                        again, _ = workers[name].answers(case["state"], flipped)
                        tv[name] += [
                            total_variation(answers[qid]["probabilities"], again[qid]["probabilities"])
                            for qid in flipped
                            if flipped[qid]["type"] == "choice"
                        ]
            timed = [
                (f"Case {i} of the timing pass.\n{case['state']}", case["questions"])
                for i, (case, _) in enumerate(items[: args.timing_requests])
            ]
            times = {}
            for name in names:
                times[name] = [timing(workers[name], timed, 1)]
            for name in names:
                half = [(f"Again, {state}", questions) for state, questions in timed]
                times[name].append(timing(workers[name], half, 8))
            result["sets"][set_name] = {
                "cases": len(items),
                "questions": len(uniform),
                "uniform": summary(uniform),
                "readouts": {
                    name: {
                        **summary(graded[name]),
                        "tv_mean": statistics.mean(tv[name]) if tv[name] else None,
                        "tv_max": max(tv[name]) if tv[name] else None,
                        "tv_questions": len(tv[name]),
                        "timing": times[name],
                        "answers": kept[name],
                    }
                    for name in names
                },
            }
        result["health"] = {name: workers[name].health["detail"].get("serving") for name in names}
        return result
    finally:
        for worker in workers.values():
            worker.stop()


def table(result: dict) -> str:
    lines = []
    for set_name, s in result["sets"].items():
        lines.append(f"\n{set_name}: {s['cases']} cases, {s['questions']} labelled questions\n")
        lines.append(
            "| readout | accuracy | noul | choice | score | Brier | ECE | TV (orders) | s/answer c=1 | s/answer c=8 |"
        )
        lines.append("|---|---|---|---|---|---|---|---|---|---|")
        u = s["uniform"]
        lines.append(
            f"| uniform answerer | {pct(u['all']['accuracy'])} | {pct(u.get('noul', {}).get('accuracy'))} | "
            f"{pct(u.get('choice', {}).get('accuracy'))} | {pct(u.get('score', {}).get('accuracy'))} | "
            f"{u['all']['brier']:.3f} | - | 0 | - | - |"
        )
        for name, r in s["readouts"].items():
            c1, c8 = r["timing"]
            lines.append(
                f"| {name} | {pct(r['all']['accuracy'])} | {pct(r.get('noul', {}).get('accuracy'))} | "
                f"{pct(r.get('choice', {}).get('accuracy'))} | {pct(r.get('score', {}).get('accuracy'))} | "
                f"{r['all']['brier']:.3f} | {r['all']['ece']:.3f} | "
                f"{'-' if r['tv_mean'] is None else format(r['tv_mean'], '.2g')} | "
                f"{c1['mean_latency_per_answer_s']:.3f} | {c8['wall_per_answer_s']:.3f} |"
            )
    return "\n".join(lines)


def pct(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sets", default="jevbench,everyday", type=lambda s: s.split(","))
    parser.add_argument("--readouts", default=",".join(READOUTS), type=lambda s: s.split(","))
    parser.add_argument("--cases", type=int, default=0, help="N cases of each set, evenly spaced (0: all)")
    parser.add_argument("--timing-requests", type=int, default=24)
    parser.add_argument("--reversed-cases", type=int, default=0, help="ask the reversed order of N cases (0: all)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--tiny", action="store_true", help="a tiny random checkpoint (a smoke run, no figures)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.readouts if n not in READOUTS] + [s for s in args.sets if s not in SETS]
    if unknown:
        parser.error(f"unknown readout or set: {', '.join(unknown)}")
    result = run(args)
    out = args.out or Path(tempfile.mkdtemp(prefix="jev-readout-accuracy-"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"CPU: {result['cpu']}")
    print(table(result))
    print(f"\nresults: {out / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
