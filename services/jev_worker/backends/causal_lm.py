"""causal-lm: a causal language model with prefix KV (L3), batching and shared-prefix branching (runner.py)."""

from __future__ import annotations

from ..engine.adapters import TextAdapter, VisionAdapter
from ..engine.runner import ModelRunner
from ..loading.loader import LoadedModel, load_model
from ..protocols import Backend, ForwardAdapter


class CausalLM(Backend):
    name = "causal-lm"
    prefix_reuse = "on: rows continue the state prefix's KV (L3)"

    def load(self, recipe, folder: str, device: str, dtype: str, *, lm_head: bool) -> LoadedModel:
        return load_model(recipe, folder, device, dtype, lm_head=lm_head)

    def adapter(self, vision) -> ForwardAdapter:
        """The forward adapter this backend's checkpoints run with (`vision`: the vision module, for VL recipes)."""
        return VisionAdapter(vision) if vision is not None else TextAdapter()

    def build(self, loaded, *, head, vision=None, **kwargs) -> ModelRunner:
        return ModelRunner(
            loaded.model, loaded.device, self.adapter(vision), head=head, checkpoint_dir=loaded.folder, **kwargs
        )
