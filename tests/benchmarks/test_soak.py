"""benchmarks.soak's verdicts (the soak itself runs for an hour: a benchmark, never in make test): flat means within
the allowed growth of the first window after warm-up; counts may move by a little; the valid mix passes the schema."""

from __future__ import annotations

import random

from benchmarks.soak import decision, judge, labelled
from jev_common.schema import DecisionRequest, SystemOneRequest, is_envelope


def rows(values: list[float], name: str = "worker.rss_mb") -> list[dict]:
    return [{name: v, "answered": 10} for v in values]


def test_growth_after_warm_up_is_judged_against_the_first_window_after_it():
    assert judge(rows([100, 500, 510, 520]), flat_pct=5, warmup=1)["worker.rss_mb"]["flat"]  # warm-up's jump ignored
    verdict = judge(rows([100, 500, 520, 540]), flat_pct=5, warmup=1)["worker.rss_mb"]
    assert not verdict["flat"] and verdict["growth_pct"] == 8.0
    assert judge(rows([9, 10, 9, 12], "frontend.fds"), flat_pct=5, warmup=1)["frontend.fds"]["flat"]  # +2: noise
    assert not judge(rows([9, 10, 9, 13], "frontend.fds"), flat_pct=5, warmup=1)["frontend.fds"]["flat"]
    assert judge(rows([1, 2]), flat_pct=5, warmup=2) == {}  # nothing after warm-up: no verdict


def test_the_valid_mix_is_valid():
    """Only the hostile share may be refused: every request of the valid mix passes the schema."""
    rng = random.Random(1)
    for _ in range(500):
        payload = decision(rng)
        (SystemOneRequest if is_envelope(payload) else DecisionRequest).model_validate(payload)


def test_a_labelled_sample_is_read_by_its_labels():
    text = (
        "# TYPE jev_worker_cache_resident_bytes gauge\n"
        'jev_worker_cache_resident_bytes{level="l1",model="m"} 10.0\n'
        'jev_worker_cache_resident_bytes{level="l3",model="m"} 2048.0\n'
    )
    assert labelled(text, "jev_worker_cache_resident_bytes", level="l3") == 2048.0
    assert labelled(text, "jev_worker_cache_resident_bytes", level="l2") is None
