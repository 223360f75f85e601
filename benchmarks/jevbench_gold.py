"""jevbench's labelled corpus: the cases of jevbench-240 with their gold answers, for accuracy beside coherence.

jevbench 0.1.0 ships the cases (suites/jevbench-240/cases.jsonl) but not the gold file its datagen wrote beside them
(datagen/freeze.py: gold.jsonl). The gold answers are the datagen's own: every case is a plan of
`jevbench.datagen.sample.plan_domain(domain, n, seed)`, computed from sampled facts by the domain's answer rules
with no language model, and the plans are deterministic. They are regenerated here (seed 1, the seed that
reproduces the suite) and each case is kept only when its plan's questions (criteria in the same order) and
thresholds equal the shipped case's, so a gold answer is never attached to another case's text. Check: a uniform
answerer's expected accuracy over the regenerated gold is 39.8%, the figure jevbench's README gives for
jevbench-mini's uniform model (tests/unit/test_jevbench_gold.py). Unknown gold answers (the state does not say)
are left out, as the README's accuracy leaves them out.
"""

from __future__ import annotations

import json
from importlib import resources

SEED = 1  # the datagen seed whose plans are jevbench-240's cases


def cases(domains: list[str] | None = None) -> list[dict]:
    """jevbench-240's cases (in file order), of `domains` when given."""
    text = resources.files("jevbench").joinpath("suites/jevbench-240/cases.jsonl").read_text(encoding="utf-8")
    out = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [c for c in out if domains is None or c["domain"] in domains]


def labelled(domains: list[str] | None = None) -> tuple[list[tuple[dict, dict]], int]:
    """[(case, gold by question id)] for the cases whose regenerated plan matches, and how many did not match."""
    from jevbench.datagen.domains import DOMAINS
    from jevbench.datagen.sample import plan_domain

    chosen = cases(domains)
    need: dict[str, int] = {}
    for case in chosen:
        domain, index = case["id"].rsplit("-", 1)
        need[domain] = max(need.get(domain, 0), int(index))
    plans = {p["id"]: p for domain, n in need.items() for p in plan_domain(DOMAINS[domain], n, seed=SEED)}
    out, unmatched = [], 0
    for case in chosen:
        plan = plans.get(case["id"])
        if (
            plan is None
            or plan["questions"] != case["questions"]
            or (plan["thresholds"] or None) != case.get("thresholds")
        ):
            unmatched += 1
            continue
        out.append((case, {qid: g for qid, g in plan["gold"].items() if g != "unknown" and qid in case["questions"]}))
    return out, unmatched


def correct(question: dict, answer: dict, gold) -> bool:
    """The answer's most probable option (choice) or level (score), or noul's side of 0.5, is the gold answer."""
    if question["type"] == "noul":
        return (answer["noul"] >= 0.5) == bool(gold)
    probabilities = answer["probabilities"]
    keys = (
        list(question["criteria"])
        if question["type"] == "choice"
        else [str(i) for i in range(len(question["criteria"]))]
    )
    best = max(keys, key=lambda k: probabilities[k])  # ties: the earliest, as choice_answer does
    return best == (gold if question["type"] == "choice" else str(gold))


def uniform_accuracy(items: list[tuple[dict, dict]], types=("noul", "choice", "score")) -> float:
    """The expected accuracy of an answerer that gives every answer equal probability (1/k per question)."""
    chances = [
        1 / (2 if case["questions"][qid]["type"] == "noul" else len(case["questions"][qid]["criteria"]))
        for case, gold in items
        for qid in gold
        if case["questions"][qid]["type"] in types
    ]
    return sum(chances) / len(chances)
