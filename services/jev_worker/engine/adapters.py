"""Forward adapters (protocols.ForwardAdapter): what differs by architecture in a forward, declared where the
backend chooses it, so the runner (runner.py) never detects a subclass's overrides. A family with another
architecture adds an adapter here or in its folder and names it from its backend."""

from __future__ import annotations

import torch

from ..protocols import ForwardAdapter


class TextAdapter(ForwardAdapter):
    """A causal text decoder: positions count from 0, the prefix is its token ids; every path is open."""

    def positions(self, start: int, length: int, batch: int, rope_delta: int, device) -> torch.Tensor:
        return (torch.arange(length, device=device) + start).unsqueeze(0).expand(batch, length)

    def prefix_inputs(self, model, ids: torch.Tensor, assets: list) -> tuple[dict, int]:
        return {"input_ids": ids, "position_ids": self.positions(0, ids.shape[1], 1, 0, ids.device)}, 0


class VisionAdapter(TextAdapter):
    """A vision-language decoder (vision.py): M-RoPE positions, the preencoded images spliced into the prefix's
    embeddings. Not graph-captured: its positions and spliced embeddings do not fit graphs.py's static buffers."""

    graph_capturable = False

    def __init__(self, vision):
        self.vision = vision

    def positions(self, start, length, batch, rope_delta, device) -> torch.Tensor:
        return self.vision.text_positions(start, length, rope_delta, batch).to(device)

    def prefix_inputs(self, model, ids, assets) -> tuple[dict, int]:
        if not assets:
            return super().prefix_inputs(model, ids, assets)
        embeds, positions, rope_delta = self.vision.splice_image_embeds(model, ids, assets)
        return {"inputs_embeds": embeds, "position_ids": positions}, int(rope_delta)


class NoncausalAdapter(TextAdapter):
    """Attention that sees the whole prompt (pplx-decider's `noncausal_full_attention`): every row runs whole in
    one pass, its mask hiding only the padding; no prefix state, no chunks, no packing, no graphs."""

    causal = False
    graph_capturable = False
    reuses_prefix = False
    packs = False

    def whole_mask(self, lengths: torch.Tensor, width: int, dtype) -> torch.Tensor:
        keep = torch.arange(width, device=lengths.device).unsqueeze(0) < lengths.unsqueeze(1)  # [batch, key]
        mask = torch.zeros(len(lengths), 1, width, width, dtype=dtype, device=lengths.device)
        return mask.masked_fill_(~keep[:, None, None, :], torch.finfo(dtype).min)


class RowReadAdapter(TextAdapter):
    """The head reads several positions of each row (option markers, the question's last token): every row
    runs whole (prefix + row), so no prefix state is reused."""

    reads = "row"
    reuses_prefix = False
    graph_capturable = False


class VisionRowReadAdapter(VisionAdapter):
    reads = "row"
    reuses_prefix = False


class SequenceAdapter(TextAdapter):
    """The head answers a whole request from every position of its one sequence (a protocols.RequestHead)."""

    reads = "sequence"
    reuses_prefix = False
    packs = False
    graph_capturable = False


class VisionSequenceAdapter(VisionAdapter):
    reads = "sequence"
    reuses_prefix = False
    packs = False


class RowScoreAdapter(TextAdapter):
    """Rows whose every real position the head reads (a continuation's token log-probabilities, e.g. LFM2.5's
    candidate values, option scoring's option texts), after the prefix state like any row. Packing is off (the packed
    path reads last positions only); not graph-captured (the graph buckets read last positions)."""

    reads = "row"
    packs = False
    graph_capturable = False
