"""causal-lm: a causal language model with prefix KV (L3), batching and shared-prefix branching (engine.py)."""
from __future__ import annotations

from ..engine import DecisionEngine
from ..protocols import Backend


class CausalLM(Backend):
    name = "causal-lm"
    engine_class = DecisionEngine
    prefix_reuse = "on: rows continue the state prefix's KV (L3)"

    def build(self, loaded, *, head, l3_bytes: int, **kwargs) -> DecisionEngine:
        return self.engine_class(loaded.model, loaded.device, head=head, l3_bytes=self.l3_bytes(l3_bytes),
                                 checkpoint_dir=loaded.folder, **kwargs)
