"""lfm2-values: the causal-lm engine run as system1-omni's LFM2 engine scores candidates (`engine.py`
`Engine.score`): one prefill per question (its whole prompt), forked per candidate batch (the engine's cache
snapshot: the attention layers' KV and the convolution layers' state, copied and repeated per row), each
candidate row `'  "answer": '` + value tokens after it, right-padded. The head reads every position of a row:
the value tokens' log-probabilities over the full vocabulary at the positions that predict them.

What this adds to the causal-lm runner (runner.py), and nothing else:
- each question is its own prefix group (Lfm2Builder.prefix_groups: its prompt is its own prefix, kept in L3
  under its own key);
- its forward adapter (Lfm2Adapter): rows hand the head every real position, packing is off (rows after a
  snapshot are right-padded anyway), and the once-per-model check that a forked snapshot equals a whole
  forward compares the row's positions (the runner does so for every adapter that reads whole rows).
"""

from __future__ import annotations

from ...backends.causal_lm import CausalLM
from ...engine.adapters import RowScoreAdapter
from ...engine.continuation_head import ContinuationLogProbHead


class ValueLogProbHead(ContinuationLogProbHead):
    """The summed FP32 log-probability of a candidate row's value tokens (engine/continuation_head.py; LFM2's head
    is its tied input embedding, with no bias or soft-cap)."""


class Lfm2Adapter(RowScoreAdapter):
    """Rows hand the head every real position (the value tokens' log-probabilities), and run right-padded after
    a forked snapshot (the packed paths read last positions only). Not graph-captured: snapshots are not KV."""


class Lfm2Values(CausalLM):
    name = "lfm2-values"
    prefix_reuse = (
        "on: each question's prompt (schema system turn + state + '{\\n') is one prefill, kept in L3 "
        "as a cache snapshot (attention KV and convolution state) and forked per candidate batch"
    )

    def adapter(self, vision) -> Lfm2Adapter:
        return Lfm2Adapter()
