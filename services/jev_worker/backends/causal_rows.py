"""causal-lm-rows: a causal LM whose readout reads several positions of each row (option markers, the
question's last token, option-text tokens), not only the last one.

Every row runs whole (state prefix + row), alone in its padded batch slot, and the readout's head is
given the row's final hidden states at every real position ([prefix + row length, hidden]); it
addresses them from the end of the row. No prefix state is reused (L3 off, said in stats): each row
equals a plain forward over prefix + row, which is what the reference's branch layout computes.
"""
from __future__ import annotations

import torch

from ..engine import DecisionEngine
from .causal_lm import CausalLM


class RowsEngine(DecisionEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kv_branching = False  # every row whole: no prefix state is computed or branched

    @staticmethod
    def _last(hidden: torch.Tensor, lengths: torch.Tensor) -> list[torch.Tensor]:
        """Each row's hidden states up to its own length (the engine's readers take the row's output)."""
        return [hidden[i, :n] for i, n in enumerate(lengths.tolist())]


class CausalRows(CausalLM):
    name = "causal-lm-rows"
    engine_class = RowsEngine
    prefix_reuse = ("off: the readout reads several positions of every row, so each row runs whole "
                    "(prefix + row) and no prefix state is reused (L3 off)")

    def l3_bytes(self, configured: int) -> int:
        return 0
