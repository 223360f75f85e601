"""causal-lm: a causal language model with prefix KV (L3), batching and shared-prefix branching (engine.py)."""
from __future__ import annotations

from ..engine import DecisionEngine


class CausalLM:
    name = "causal-lm"
    external = False
    engine_class = DecisionEngine
    prefix_reuse = "on: rows continue the state prefix's KV (L3)"

    def check(self, recipe) -> None:
        """Refuse a recipe this backend cannot run (raises ServingError)."""

    def l3_bytes(self, configured: int) -> int:
        return configured

    def build(self, loaded, *, head, l3_bytes: int, **kwargs) -> DecisionEngine:
        return self.engine_class(loaded.model, loaded.device, head=head, l3_bytes=self.l3_bytes(l3_bytes),
                                 checkpoint_dir=loaded.folder, **kwargs)

    def describe(self) -> dict:
        return {"backend": self.name, "prefix_reuse": self.prefix_reuse}
