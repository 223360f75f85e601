"""Model execution: batched last-position hidden states, shared-prefix KV branching, the L3 cache.

Everything here runs on the single model thread (see scheduler.py), so model state and the CUDA
stream are never touched concurrently. Rows are right-padded and need no attention mask: attention
is causal, so a real token never sees the padding after it, and each row's hidden state is read at
its own last real position.
"""
from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .caches import BudgetLRU
from .head import DecisionHead
from .prompt import PreparedRequest

log = logging.getLogger("jev.worker.engine")


@dataclass
class PrefixState:
    """The KV state of a prompt prefix (batch 1), plus what positions after it need."""

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    length: int
    rope_delta: int = 0

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.kv)


@dataclass
class EngineItem:
    prepared: PreparedRequest
    assets: list = field(default_factory=list)  # parsed image assets, in prompt order


@dataclass
class EngineResult:
    row_logits: list[torch.Tensor]  # FP32 label logits, one tensor per row
    cached_tokens: int
    l3: str  # hit | miss | off


class DecisionEngine:
    def __init__(self, model: torch.nn.Module, device: torch.device, *, l3_bytes: int, batching: bool,
                 max_batch_rows: int, pad_id: int = 0, vision=None, checkpoint_dir: str | None = None,
                 on_l3_insert: Callable[[str, PrefixState], None] | None = None,
                 on_l3_evict: Callable[[str, PrefixState], None] | None = None):
        self.model = model
        self.device = device
        self.backbone = model.get_decoder()
        self.embed = model.get_input_embeddings()
        self.head = DecisionHead(model, checkpoint_dir)
        self.batching = batching
        self.max_batch_rows = max(1, max_batch_rows)
        self.pad_id = pad_id
        self.vision = vision
        self.l3: BudgetLRU[PrefixState] = BudgetLRU("l3", l3_bytes, size_of=lambda s: s.nbytes, on_evict=on_l3_evict)
        self._on_l3_insert = on_l3_insert
        params = inspect.signature(self.backbone.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.kv_branching: bool | None = None  # known after the first prefix forward
        self.forward_seconds = 0.0

    # ----- inputs -------------------------------------------------------------------------------
    def _ids(self, rows: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        return ids.to(self.device), lengths.to(self.device)

    def _positions(self, start: int, length: int, batch: int, rope_delta: int) -> torch.Tensor:
        if self.vision is not None:
            return self.vision.text_positions(start, length, rope_delta, batch).to(self.device)
        return (torch.arange(length, device=self.device) + start).unsqueeze(0).expand(batch, length)

    def _prefix_inputs(self, item: EngineItem) -> tuple[dict, int]:
        ids = torch.tensor([item.prepared.prefix_ids], dtype=torch.long, device=self.device)
        if item.assets:
            embeds, positions, rope_delta = self.vision.splice_image_embeds(self.model, ids, item.assets)
            return {"inputs_embeds": embeds, "position_ids": positions}, int(rope_delta)
        return {"input_ids": ids, "position_ids": self._positions(0, ids.shape[1], 1, 0)}, 0

    def _forward(self, **kwargs) -> torch.Tensor:
        return self.backbone(**kwargs).last_hidden_state

    @staticmethod
    def _last(hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]

    # ----- prefix state -------------------------------------------------------------------------
    def compute_prefix(self, item: EngineItem) -> PrefixState | None:
        inputs, rope_delta = self._prefix_inputs(item)
        cache = DynamicCache()
        self._forward(**inputs, use_cache=True, **{self._cache_kwarg: cache})
        layers = getattr(cache, "layers", [])
        if not layers or not all(type(layer) is DynamicLayer for layer in layers):
            self.kv_branching = False  # recurrent / sliding state: not branchable this way
            log.info("model cache is %s: prefix KV branching disabled", [type(x).__name__ for x in layers[:2]])
            return None
        self.kv_branching = True
        kv = [(layer.keys, layer.values) for layer in layers]
        return PrefixState(kv=kv, length=len(item.prepared.prefix_ids), rope_delta=rope_delta)

    def _prefix_for(self, item: EngineItem, n_rows: int) -> tuple[PrefixState | None, str]:
        """(state, l3 outcome). Without L3 a state is only computed when several rows branch from it."""
        if self.l3.enabled and self.kv_branching is not False:
            key = item.prepared.prefix_key
            state = self.l3.get(key)
            if state is not None:
                return state, "hit"
            state = self.compute_prefix(item)
            if state is not None and self.l3.put(key, state) and self._on_l3_insert:
                self._on_l3_insert(key, state)
            return state, "miss"
        if self.batching and n_rows > 1 and self.kv_branching is not False:
            return self.compute_prefix(item), "off"
        return None, "off"

    # ----- rows ---------------------------------------------------------------------------------
    def _rows_after_prefix(self, state: PrefixState, rows: list[tuple[int, ...]]) -> torch.Tensor:
        ids, lengths = self._ids(rows)
        batch = ids.shape[0]
        cache = DynamicCache(ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
                                             for k, v in state.kv])
        positions = self._positions(state.length, ids.shape[1], batch, state.rope_delta)
        hidden = self._forward(input_ids=ids, position_ids=positions, use_cache=True, **{self._cache_kwarg: cache})
        return self._last(hidden, lengths)

    def _rows_full(self, item: EngineItem, rows: list[tuple[int, ...]]) -> torch.Tensor:
        prefix = item.prepared.prefix_ids
        if not item.assets:
            ids, lengths = self._ids([prefix + r for r in rows])
            return self._last(self._forward(input_ids=ids, use_cache=False), lengths)
        inputs, rope_delta = self._prefix_inputs(item)
        ids, lengths = self._ids(rows)
        batch = ids.shape[0]
        embeds = torch.cat([inputs["inputs_embeds"].expand(batch, -1, -1), self.embed(ids)], dim=1)
        row_positions = self._positions(len(prefix), ids.shape[1], batch, rope_delta)
        positions = torch.cat([inputs["position_ids"].expand(-1, batch, -1), row_positions], dim=-1)
        hidden = self._forward(inputs_embeds=embeds, position_ids=positions, use_cache=False)
        return self._last(hidden, lengths + len(prefix))

    def _chunks(self, rows: list[tuple[int, ...]]) -> list[list[tuple[int, ...]]]:
        size = self.max_batch_rows if self.batching else 1
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    # ----- entry point --------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, items: list[EngineItem]) -> list[EngineResult]:
        """Run items that share one prefix key (the scheduler groups them) in as few forwards as the
        batch limit allows; items with other prefixes are run group by group."""
        results: dict[int, EngineResult] = {}
        groups: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.prepared.prefix_key, []).append(index)
        for indices in groups.values():
            lead = items[indices[0]]
            rows = [row for i in indices for row in items[i].prepared.rows]
            state, outcome = self._prefix_for(lead, len(rows))
            hidden = torch.cat([
                self._rows_after_prefix(state, chunk) if state is not None else self._rows_full(lead, chunk)
                for chunk in self._chunks(rows)
            ])
            offset = 0
            for position, i in enumerate(indices):
                prepared = items[i].prepared
                logits = [self.head.logits(hidden[offset + r], labels)
                          for r, labels in enumerate(prepared.row_labels)]
                offset += len(prepared.rows)
                # the first item of a group pays for the prefix; later ones in the same batch reuse it
                hit = outcome == "hit" or (state is not None and position > 0)
                results[i] = EngineResult(
                    row_logits=logits, cached_tokens=len(prepared.prefix_ids) if hit else 0,
                    l3=("hit" if position > 0 and outcome == "miss" else outcome),
                )
        return [results[i] for i in range(len(items))]
