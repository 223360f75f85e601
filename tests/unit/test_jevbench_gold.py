"""benchmarks/jevbench_gold.py: jevbench-240's gold answers regenerated from jevbench's own datagen."""

from __future__ import annotations

import pytest

pytest.importorskip("jevbench")

from benchmarks.jevbench_gold import correct, labelled, uniform_accuracy  # noqa: E402


def test_every_case_is_regenerated_and_a_uniform_answerer_scores_jevbench_s_own_39_8_percent():
    items, unmatched = labelled()
    assert unmatched == 0 and len(items) == 240
    assert sum(len(gold) for _, gold in items) == 1938  # known gold answers ("unknown" left out)
    assert round(100 * uniform_accuracy(items), 1) == 39.8  # jevbench's README: a uniform model, 39.8% accuracy


def test_the_argmax_is_judged_against_the_gold_option_or_level():
    choice = {"type": "choice", "criteria": {"a": None, "b": None}}
    score = {"type": "score", "criteria": ["low", "mid", "high"]}
    assert correct(choice, {"probabilities": {"a": 0.3, "b": 0.7}}, "b")
    assert not correct(choice, {"probabilities": {"a": 0.5, "b": 0.5}}, "b")  # a tie goes to the earliest
    assert correct(score, {"probabilities": {"0": 0.1, "1": 0.2, "2": 0.7}}, 2)
    assert correct({"type": "noul"}, {"noul": 0.6}, True) and not correct({"type": "noul"}, {"noul": 0.6}, False)
