"""noncausal-lm: a decoder whose attention layers see the whole prompt (pplx-decider's
`noncausal_full_attention`). Every position depends on every other, so no prefix state can be reused:
L3 is off whatever the settings say, every row runs whole (prefix + row) in one padded forward whose
mask hides only the padding, and /health and /v1/cache/stats say why."""
from __future__ import annotations

import torch

from ..engine import DecisionEngine
from ..readouts.base import ServingError
from .causal_lm import CausalLM


class NoncausalEngine(DecisionEngine):
    causal = False  # every position sees the whole prompt: never prefilled in chunks

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kv_branching = False  # never compute or branch a prefix state

    def _text_full(self, sequences, capture):
        ids, lengths = self._ids([prefix + row for prefix, row in sequences])
        batch, width = ids.shape
        keep = torch.arange(width, device=self.device).unsqueeze(0) < lengths.unsqueeze(1)  # [batch, key]
        dtype = self.embed.weight.dtype
        mask = torch.zeros(batch, 1, width, width, dtype=dtype, device=self.device)
        mask.masked_fill_(~keep[:, None, None, :], torch.finfo(dtype).min)  # padding only: no causal mask
        positions = self._positions(0, width, batch, 0)
        hidden = self._forward(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False)
        return self._last(hidden, lengths), [None] * len(sequences)

    def _rows_full(self, item, rows):
        raise ServingError("the noncausal backend serves text states only")


class NoncausalLM(CausalLM):
    name = "noncausal-lm"
    engine_class = NoncausalEngine
    prefix_reuse = ("refused: noncausal full attention makes every position depend on the whole prompt, "
                    "so no prefix state is reused (L3 off); each row runs whole")

    def check(self, recipe) -> None:
        if recipe.model.modality != "text":
            raise ServingError(f"backend {self.name!r} serves text recipes only; {recipe.name} is {recipe.model.modality}")

    def l3_bytes(self, configured: int) -> int:
        return 0
