"""causal-lm: a causal language model with prefix KV (L3), batching and shared-prefix branching (engine.py)."""
from __future__ import annotations

from ..engine import DecisionEngine
from ..protocols import Backend


class CausalLM(Backend):
    name = "causal-lm"
    engine_class = DecisionEngine
    prefix_reuse = "on: rows continue the state prefix's KV (L3)"

    def build(self, loaded, *, head, l3, **kwargs) -> DecisionEngine:
        return self.engine_class(loaded.model, loaded.device, head=head, l3=l3, checkpoint_dir=loaded.folder, **kwargs)
