"""benchmarks.l3_replay: the L3 hit-rate replay used to check prompt-building changes."""

from __future__ import annotations

from benchmarks.corpora import BUILTIN
from benchmarks.l3_replay import current_keys, hit_rate


def test_hit_rate_counts_repeats_in_order():
    assert hit_rate(["a", "b", "a", "a", "c"]) == (2, 3, 0.4)
    assert hit_rate([]) == (0, 0, 0.0)


def test_requests_about_one_state_share_their_prefix_key(tiny_recipe):
    from tools.tiny_checkpoints import smollm2_tokenizer

    corpus = BUILTIN["shared-prefix"]()
    keys = current_keys(tiny_recipe, smollm2_tokenizer(), corpus)
    by_state: dict[str, set[str]] = {}
    for body, key in zip(corpus, keys):
        by_state.setdefault(str(body["state"]), set()).add(key)
    assert all(len(k) == 1 for k in by_state.values())  # one prefix per state, whatever the question
    assert len(set(keys)) == len(by_state) > 1
