"""causal-lm-scores: the causal-lm runner with rows read at every position (a continuation's log-probabilities,
engine/continuation_head.py), after the state prefix's KV (L3) as any row, and each batch's uncached calibration
baseline rows run beside it and kept (engine/baseline_rows.py). Text checkpoints only."""

from __future__ import annotations

from typing import Any

from jev_common.checkpoint_files import ServingError

from ..engine.adapters import RowScoreAdapter
from ..engine.baseline_rows import BaselineCache, BaselineEngine
from ..protocols import ForwardAdapter
from .causal_lm import CausalLM


class CausalScores(CausalLM):
    name = "causal-lm-scores"
    prefix_reuse = "on: each option's row continues the state prefix's KV (L3); baselines are computed once"

    def __init__(self, baselines: BaselineCache):
        self.baselines = baselines

    def check(self, recipe) -> None:
        if recipe.model.modality != "text":
            raise ServingError(f"recipe {recipe.name}: backend {self.name!r} scores text rows of text checkpoints")

    def adapter(self, vision) -> ForwardAdapter:
        return RowScoreAdapter()

    def build(self, loaded: Any, *, head: Any, vision: Any = None, **kwargs: Any) -> BaselineEngine:  # type: ignore[override]
        return BaselineEngine(super().build(loaded, head=head, vision=vision, **kwargs), self.baselines)
