"""benchmarks.readout_accuracy's measures and its hand-written labelled set (the whole run path is
tests/benchmarks/test_run_paths.py::test_readout_accuracy_tiny)."""

from __future__ import annotations

from collections import Counter

from benchmarks.readout_accuracy import ece, everyday_items, grade, summary, total_variation, uniform_grade
from jev_common.schema import SystemOneRequest

CHOICE = {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}
NOUL = {"type": "noul", "instructions": "?"}


def test_grade_scores_the_top_option_brier_and_confidence():
    g = grade(CHOICE, {"probabilities": {"a": 0.2, "b": 0.7, "c": 0.1}}, "b")
    assert g["correct"] and abs(g["brier"] - (0.04 + 0.09 + 0.01)) < 1e-12 and g["top"] == 0.7
    g = grade(NOUL, {"noul": 0.8}, False)
    assert not g["correct"] and abs(g["brier"] - 2 * 0.64) < 1e-12 and g["top"] == 0.8
    score = {"type": "score", "criteria": ["low", "mid", "high"]}
    assert grade(score, {"probabilities": {"0": 0.1, "1": 0.3, "2": 0.6}}, 2)["correct"]
    u = uniform_grade(CHOICE)
    assert abs(u["correct"] - 1 / 3) < 1e-12 and abs(u["brier"] - 2 / 3) < 1e-12


def test_expected_calibration_error_is_the_weighted_gap_per_bin():
    perfect = [{"top": 0.75, "correct": c} for c in (True, True, True, False)]
    assert ece(perfect) < 1e-12
    overconfident = [{"top": 0.95, "correct": False}] * 2 + [{"top": 0.55, "correct": True}] * 2
    assert abs(ece(overconfident) - (0.5 * 0.95 + 0.5 * 0.45)) < 1e-12
    assert summary([dict(g, type="noul", brier=0.0) for g in overconfident])["noul"]["n"] == 4


def test_total_variation_distance():
    assert total_variation({"a": 0.5, "b": 0.5}, {"b": 0.5, "a": 0.5}) == 0
    assert abs(total_variation({"a": 0.9, "b": 0.1}, {"a": 0.4, "b": 0.6}) - 0.5) < 1e-12


def test_the_everyday_set_holds_valid_labelled_questions_of_every_type_balanced():
    items = everyday_items()
    assert len(items) == 70 and len({case["id"] for case, _ in items}) == 70
    types = Counter()
    noul, positions = Counter(), Counter()
    for case, gold in items:
        SystemOneRequest.model_validate({"model": "m", "state": case["state"], "questions": case["questions"]})
        for qid, answer in gold.items():
            question = case["questions"][qid]
            types[question["type"]] += 1
            if question["type"] == "noul":
                noul[answer] += 1
            elif question["type"] == "choice":
                positions[list(question["criteria"]).index(answer)] += 1
            else:
                assert 0 <= answer < len(question["criteria"])
    assert types == {"noul": 70, "choice": 70, "score": 70}
    assert noul == {True: 35, False: 35}
    assert max(positions.values()) - min(positions.values()) <= 1  # the gold option rotated over the positions
