"""benchmarks/peers.py without peers: its corpus, agreement and table code (the run itself is
`make bench-peers`, not part of the suite)."""

from __future__ import annotations

import json

import pytest

from benchmarks import peers
from jev_common.schema import SystemOneRequest


def test_corpus_cells_are_distinct_and_valid():
    corpus = peers.build_corpus(3, peers.DEFAULT_COUNTS)
    assert set(corpus) == {(w, c, r) for w in peers.WORKLOADS for c in peers.CONCURRENCY for r in range(3)}
    bodies = [b for cell in corpus.values() for b in cell]
    keys = [json.dumps(b, sort_keys=True) for b in bodies]
    assert len(set(keys)) == len(keys)  # no arm is sent one request twice
    for (workload, conc, _), cell in corpus.items():
        assert len(cell) == peers.DEFAULT_COUNTS[(workload, conc)]
        for body in cell:
            SystemOneRequest.model_validate(body)
            assert len(body["questions"]) == (8 if workload == "8q" else 1)
            for question in body["questions"].values():  # jev-compatible-server's schema is stricter
                assert question.get("instructions")
                criteria = question.get("criteria")
                if question["type"] == "noul" and criteria is not None:
                    assert set(criteria) == {"true", "false"}
    fresh = [b["state"] for (w, _, _), cell in corpus.items() if w != "repeated" for b in cell]
    assert len(set(fresh)) == len(fresh)
    assert len({b["state"] for (w, _, _), cell in corpus.items() if w == "repeated" for b in cell}) <= 4
    assert peers.build_corpus(3, peers.DEFAULT_COUNTS) == corpus  # deterministic: every arm, every run


def test_prob_vector_orders_by_the_question():
    choice = {"type": "choice", "criteria": {"b": None, "a": None}}
    assert peers.prob_vector(choice, {"probabilities": {"a": 0.25, "b": 0.75}}) == [0.75, 0.25]
    score = {"type": "score", "criteria": ["x", "y", "z"]}
    assert peers.prob_vector(score, {"probabilities": {"2": 0.5, "0": 0.2, "1": 0.3}}) == [0.2, 0.3, 0.5]
    assert peers.prob_vector({"type": "noul"}, {"noul": 0.9}) == pytest.approx([0.9, 0.1])
    assert peers.prob_vector(choice, {"type": "unsupported"}) is None
    assert peers.prob_vector(choice, None) is None


def test_agreement_and_the_table():
    body = {"questions": {"q1": {"type": "noul"}, "q2": {"type": "choice", "criteria": {"a": None, "b": None}}}}
    ours = [{"q1": {"noul": 0.7}, "q2": {"probabilities": {"a": 0.6, "b": 0.4}}}]
    peer = [{"q1": {"noul": 0.4}, "q2": {"probabilities": {"a": 0.55, "b": 0.45}}}]
    agree = peers.agreement([body], ours, peer)
    assert (agree.compared, agree.argmax_agree, agree.missing) == (2, 1, 0)
    assert agree.max_abs_dp == pytest.approx(0.3)
    assert peers.agreement([body], ours, [None]).missing == 2
    assert agree.merge(peers.Agreement()).cell() == ("0.3", "1/2")

    def cell(arm, lat, questions, wall):
        return peers.CellStats(
            "single", 1, arm, sent=len(lat), ok=len(lat), questions=questions, wall_s=wall, latencies_ms=lat
        )

    stats = {
        ("single", 1, "ours"): cell("ours", [100.0, 110.0, 120.0], 3, 0.33),
        ("single", 1, "fast"): cell("fast", [50.0, 60.0, 70.0], 3, 0.18),
        ("single", 1, "slow"): cell("slow", [200.0, 220.0, 240.0], 3, 0.66),
    }
    rows = peers.table_rows(stats, {("single", 1, "slow"): agree}, ["ours", "fast", "slow"])
    by_arm = {r["arm"]: r for r in rows}
    assert by_arm["ours"]["p50_ratio"] is None and by_arm["ours"]["ahead"] is None
    assert by_arm["slow"]["p50_ratio"] == pytest.approx(0.5) and by_arm["slow"]["ahead"] is True
    assert by_arm["slow"]["dec_ratio"] == pytest.approx(2.0)
    assert by_arm["fast"]["ahead"] is False
    assert [r["arm"] for r in peers.not_ahead(rows)] == ["fast"]
    table = peers.markdown_table(rows)
    lines = table.splitlines()
    assert lines[0] == peers.TABLE_HEADER and len(lines) == 5
    assert all(line.count("|") == lines[0].count("|") for line in lines)
    assert "x0.50" in table and "(not ahead)" in table and "| 0.3 | 1/2 |" in table
    compact = peers.compact_table(rows).splitlines()
    assert compact[0] == "| workload | conc | ours | fast | slow |" and len(compact) == 3
    assert "110.0 ms · 9.09/s" in compact[2] and "(ours x0.50)" in compact[2]


def test_percentile_and_args():
    assert peers.percentile([], 50) is None
    assert peers.percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert peers.percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    args = peers.parse_args(["--arms", "ours,llama-bare", "--quick"])
    assert args.arms == ("ours", "llama-bare") and args.quick
    with pytest.raises(SystemExit):
        peers.parse_args(["--arms", "llama-bare"])
