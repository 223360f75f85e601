"""causal-lm-rows: a causal LM whose readout reads several positions of each row (option markers, the
question's last token, option-text tokens), not only the last one.

Every row runs whole (state prefix + row), alone in its padded batch slot, and the readout's head is
given the row's final hidden states at every real position ([prefix + row length, hidden]); it
addresses them from the end of the row. No prefix state is reused (L3 off, said in stats): each row
equals a plain forward over prefix + row, which is what the reference's branch layout computes.
"""

from __future__ import annotations

from ..engine.adapters import RowReadAdapter, VisionRowReadAdapter
from .causal_lm import CausalLM


class CausalRows(CausalLM):
    name = "causal-lm-rows"
    prefix_reuse = (
        "off: the readout reads several positions of every row, so each row runs whole "
        "(prefix + row) and no prefix state is reused (L3 off)"
    )

    def adapter(self, vision) -> RowReadAdapter | VisionRowReadAdapter:
        return VisionRowReadAdapter(vision) if vision is not None else RowReadAdapter()

    def l3_bytes(self, configured: int) -> int:
        return 0
