"""noncausal-lm: a decoder whose attention layers see the whole prompt (pplx-decider's
`noncausal_full_attention`). Every position depends on every other, so no prefix state can be reused:
L3 is off whatever the settings say, every row runs whole (prefix + row) in one padded forward whose
mask hides only the padding, and /health and /v1/cache/stats say why."""

from __future__ import annotations

from jev_common.checkpoint_files import ServingError

from ..engine.adapters import NoncausalAdapter
from .causal_lm import CausalLM


class NoncausalLM(CausalLM):
    name = "noncausal-lm"
    prefix_reuse = (
        "refused: noncausal full attention makes every position depend on the whole prompt, "
        "so no prefix state is reused (L3 off); each row runs whole"
    )

    def check(self, recipe) -> None:
        if recipe.model.modality != "text":
            raise ServingError(
                f"backend {self.name!r} serves text recipes only; {recipe.name} is {recipe.model.modality}"
            )

    def adapter(self, vision) -> NoncausalAdapter:
        return NoncausalAdapter()

    def l3_bytes(self, configured: int) -> int:
        return 0
