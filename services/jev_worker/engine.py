"""Model execution: batched last-position hidden states, shared-prefix KV branching, the L3 cache.

Everything here runs on the single model thread (see scheduler.py), so model state and the CUDA
stream are never touched concurrently. Rows are right-padded and need no attention mask: attention
is causal, so a real token never sees the padding after it, and each row's hidden state is read at
its own last real position.
"""
from __future__ import annotations

import copy
import inspect
import logging
import time
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .abandon import ForwardAbandoned
from .caches import BudgetLRU
from .graphs import Capture, GraphRunner
from .head import DecisionHead
from .prompt import PreparedRequest
from .protocols import Engine
from .reuse import LinearCost, ReuseCosts, ReusePolicy

log = logging.getLogger("jev.worker.engine")


def _layer_tensors(layer):
    """(owner, key, tensor) for every batch-major tensor a cache layer holds, directly or in a dict."""
    for name, value in vars(layer).items():
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            yield vars(layer), name, value
        elif isinstance(value, dict):
            for key, tensor in value.items():
                if isinstance(tensor, torch.Tensor) and tensor.dim() > 0:
                    yield value, key, tensor


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def _plain_kv(cache) -> bool:
    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def chunked_forward(forward, kwargs: dict, chunk: int, cache_kwarg: str, new_cache) -> torch.Tensor:
    """`forward(**kwargs)` (last hidden states), run over the sequence in chunks of `chunk` tokens that continue
    one plain-KV cache (the caller's, or a new one): causal attention makes it the same computation as one pass.
    Positions, the inputs and a 2D or 4D attention mask are cut per chunk (a mask's key axis to the cache's past
    plus the chunk's end). Caches with recurrent or sliding state, and sequences within one chunk, run in one pass.
    A forward stopped in chunk i (ForwardAbandoned) says so."""
    x = kwargs.get("input_ids")
    if x is None:
        x = kwargs.get("inputs_embeds")
    if not chunk or x is None or x.shape[1] <= chunk:
        return forward(**kwargs)
    cache = kwargs.get(cache_kwarg)
    if cache is None:
        cache = new_cache()
    if not _plain_kv(cache):
        return forward(**kwargs)
    past, total = cache.get_seq_length(), x.shape[1]
    positions, mask = kwargs.get("position_ids"), kwargs.get("attention_mask")
    out = []
    for index, start in enumerate(range(0, total, chunk)):
        end = min(total, start + chunk)
        part = {**kwargs, "use_cache": True, cache_kwarg: cache}
        for name in ("input_ids", "inputs_embeds"):
            if kwargs.get(name) is not None:
                part[name] = kwargs[name][:, start:end]
        if positions is not None:
            part["position_ids"] = positions[..., start:end]
        if mask is not None:
            part["attention_mask"] = mask[:, :, start:end, : past + end] if mask.dim() == 4 else mask[:, : past + end]
        try:
            out.append(forward(**part))
        except ForwardAbandoned as stopped:
            stopped.chunk = index
            raise
    return torch.cat(out, dim=1)


@dataclass
class PrefixState:
    """The state of a prompt prefix (batch 1), plus what positions after it need.

    Plain attention models keep per-layer (keys, values), which can be sliced, expanded and padded.
    Models with recurrent or sliding state (hybrid conv/linear attention) keep a `snapshot` of the
    whole cache, copied and repeated per branch.
    """

    kv: list[tuple[torch.Tensor, torch.Tensor]]
    length: int
    rope_delta: int = 0
    snapshot: object | None = None

    @property
    def nbytes(self) -> int:
        if self.snapshot is not None:
            return sum(t.numel() * t.element_size() for layer in self.snapshot.layers
                       for _, _, t in _layer_tensors(layer))
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


class DecisionEngine(Engine):
    # Declared by each engine: causal attention, so a sequence may be prefilled in chunks (a noncausal engine,
    # whose every position sees the whole prompt, sets False and runs one pass)
    causal = True

    def __init__(self, model: torch.nn.Module, device: torch.device, *, l3: BudgetLRU | None = None,
                 batching: bool, max_batch_rows: int, pad_id: int = 0, vision=None,
                 checkpoint_dir: str | None = None, head=None, graph_capture: Capture | None = None,
                 reuse: ReusePolicy | None = None):
        self.model = model
        self.device = device
        self.backbone = model.get_decoder()
        self.embed = model.get_input_embeddings()
        # the readout's projection of a row's last hidden state (FP32 logits); LM-head label rows by default
        self.head = head if head is not None else DecisionHead(model, checkpoint_dir)
        self.batching = batching
        self.max_batch_rows = max(1, max_batch_rows)
        self.pad_id = pad_id
        self.vision = vision
        self.l3: BudgetLRU[PrefixState] = l3 if l3 is not None else BudgetLRU("l3", 0)  # WorkerCaches' L3
        params = inspect.signature(self.backbone.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.kv_branching: bool | None = None  # can prefix state be reused? known after the first prefix forward
        self.packing = True  # rows after one prefix state run packed; checked once against a padded batch
        self._packing_verified: set[str] = set()  # paths ("rows", "whole") checked against a padded batch
        self.prefix_mode: str | None = None  # "kv" (plain attention) or "snapshot" (recurrent/sliding state)
        self.reuse = (reuse or ReusePolicy()).resolved(device.type)  # whether an L3 hit is used (reuse.py)
        self.prefill_chunk = 0  # tokens per prefill chunk (0: one pass); the worker sets JEV_PREFILL_CHUNK_TOKENS
        self.graphs: GraphRunner | None = None  # bucketed static-buffer forwards (graphs.py)
        if graph_capture is not None:
            why_not = self._graphs_unsupported()
            if why_not:
                log.info("graph path off: %s", why_not)
            else:
                self.graphs = GraphRunner(self._graph_forward, self._new_cache, device, capture=graph_capture,
                                          max_rows=self.max_batch_rows, kv_budget_bytes=self.l3.budget,
                                          pad_id=pad_id)

    def _graphs_unsupported(self) -> str | None:
        """Why this engine's forwards cannot go through graphs.py's static buffers, or None."""
        if self.vision is not None:
            return "vision-language positions (M-RoPE) and spliced image embeddings"
        changed = [name for name in ("run", "_text_full", "_rows_after_states", "_last", "_positions", "_forward")
                   if getattr(type(self), name) is not getattr(DecisionEngine, name)]
        if changed:
            return f"{type(self).__name__} overrides {', '.join(changed)}"
        return None

    def describe(self) -> dict:
        out = {"l3_reuse": self.reuse.describe()}
        if self.graphs is not None:
            out["graphs"] = self.graphs.describe()
        return out

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

    def _new_cache(self) -> DynamicCache:
        """A cache whose layer types follow the model's config (sliding, linear-attention or full)."""
        return DynamicCache(config=self.model.config)

    def _forward(self, **kwargs) -> torch.Tensor:
        """The backbone's last hidden states; a sequence longer than `prefill_chunk` tokens is prefilled in
        chunks (chunked_forward) so that no layer step is long and a forward nobody waits for stops soon."""
        return chunked_forward(self._backbone_forward, kwargs, self.prefill_chunk if self.causal else 0,
                               self._cache_kwarg, self._new_cache)

    def _backbone_forward(self, **kwargs) -> torch.Tensor:
        return self.backbone(**kwargs).last_hidden_state

    def _graph_forward(self, ids, positions, mask, cache) -> torch.Tensor:
        kwargs = {"input_ids": ids, "position_ids": positions, "use_cache": cache is not None}
        if mask is not None:
            kwargs["attention_mask"] = mask
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        return self._backbone_forward(**kwargs)  # graph buckets are bounded in length: one pass

    def _graph_whole(self, sequences, capture: bool) -> tuple[torch.Tensor, list[PrefixState | None]] | None:
        """_text_full through a graph bucket, or None (run it eagerly)."""
        if self.graphs is None:
            return None
        if capture and self.prefix_mode == "snapshot":
            self.graphs.refuse("snapshot_cache", "prefix state is a cache snapshot, not plain attention KV")
            return None
        got = self.graphs.whole(sequences, capture)
        if got is None:
            return None
        hidden, cache = got
        return hidden, self._states_of_padded(cache, sequences) if capture else [None] * len(sequences)

    @staticmethod
    def _last(hidden: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]

    # ----- prefix state -------------------------------------------------------------------------
    def _branchable(self, cache) -> list | None:
        """The cache's per-layer KV layers when it is plain attention KV, else None (snapshot mode)."""
        layers = getattr(cache, "layers", [])
        if _plain_kv(cache):
            self.prefix_mode = "kv"
            return layers
        if self.prefix_mode != "snapshot":
            log.info("model cache layers are %s: prefix states are cache snapshots",
                     sorted({type(x).__name__ for x in layers}))
        self.prefix_mode = "snapshot"
        return None

    def _branch_snapshot(self, state: PrefixState, batch: int):
        cache = copy.deepcopy(state.snapshot)
        if batch > 1:
            for layer in cache.layers:
                for owner, key, tensor in list(_layer_tensors(layer)):
                    owner[key] = tensor.repeat_interleave(batch, dim=0)
        return cache

    def compute_prefix(self, item: EngineItem) -> PrefixState | None:
        prefix = item.prepared.prefix_ids
        if self.graphs is not None and not item.assets and self.prefix_mode == "kv":
            graphed = self._graph_whole([(prefix, prefix[:0])], True)
            if graphed is not None and graphed[1][0] is not None:
                return graphed[1][0]
        inputs, rope_delta = self._prefix_inputs(item)
        cache = self._new_cache()
        self._forward(**inputs, use_cache=True, **{self._cache_kwarg: cache})
        layers = self._branchable(cache)
        length = len(item.prepared.prefix_ids)
        if layers is not None:
            self.kv_branching = True
            return PrefixState(kv=[(layer.keys, layer.values) for layer in layers], length=length,
                               rope_delta=rope_delta)
        state = PrefixState(kv=[], length=length, rope_delta=rope_delta, snapshot=cache)
        if self.kv_branching is None:
            self.kv_branching = self._snapshot_branching_is_exact(item, state)
        return state if self.kv_branching else None

    def _snapshot_branching_is_exact(self, item: EngineItem, state: PrefixState) -> bool:
        """Once per model: continuing two copies of a snapshot must equal the whole forward, or the
        cache holds state this engine does not know how to branch, and whole forwards are used."""
        row = item.prepared.rows[0]
        branched = self._rows_after_states([(state, row), (state, row)])
        whole = (self._rows_full(item, [row]) if item.assets
                 else self._text_full([(item.prepared.prefix_ids, row)], False)[0])
        error = _relative_error(branched, whole)
        if error > 1e-3:
            log.warning("prefix snapshot branching differs from a whole forward (relative %.2e): disabled", error)
            return False
        return True

    def _store(self, key: str, state: PrefixState | None) -> None:
        if state is not None:
            self.l3.put(key, state)

    @property
    def _caching(self) -> bool:
        return self.l3.enabled and self.kv_branching is not False

    # ----- rows ---------------------------------------------------------------------------------
    def _rows_after_states(self, pairs: list[tuple[PrefixState, tuple[int, ...]]]) -> torch.Tensor:
        """Rows, each after its own prefix state, in one forward: packed when the model's attention
        takes a custom mask (checked once against the padded batch), else right-padded."""
        ids, lengths = self._ids([row for _, row in pairs])
        batch, width = ids.shape
        states = [state for state, _ in pairs]
        first = states[0]
        if first.snapshot is not None:  # _state_chunks never mixes a snapshot with another state
            if self.graphs is not None:
                self.graphs.refuse("snapshot_cache", "prefix state is a cache snapshot, not plain attention KV")
            positions = self._positions(first.length, width, batch, first.rope_delta)
            hidden = self._forward(input_ids=ids, position_ids=positions, use_cache=True,
                                   **{self._cache_kwarg: self._branch_snapshot(first, batch)})
            return self._last(hidden, lengths)
        if self.graphs is not None:
            graphed = self.graphs.after(pairs)
            if graphed is not None:
                return graphed
        if batch > 1 and self.packing:
            packed = self._packed_rows_after(pairs)
            if self._packing_agrees("rows", packed, lambda: self._padded_rows_after(pairs, ids, lengths)):
                return packed
        return self._padded_rows_after(pairs, ids, lengths)

    def _packing_agrees(self, path: str, packed: torch.Tensor, padded) -> bool:
        """Once per model and path: the packed hidden states must equal the padded batch's (`padded()`),
        or the model's attention does not honour a custom mask and packing is turned off."""
        if path in self._packing_verified:
            return True
        error = _relative_error(packed, padded())  # (a forward stopped in padded() leaves the path unchecked)
        self._packing_verified.add(path)
        if error <= 1e-3:
            return True
        log.warning("packed %s differ from a padded batch (relative %.2e): packing disabled", path, error)
        self.packing = False
        return False

    def _padded_rows_after(self, pairs, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Right-padded rows after their prefix states. One shared state: its KV is expanded (a view)
        across the rows. Several: each state's KV padded to the longest, the padding masked."""
        batch, width = ids.shape
        states = [state for state, _ in pairs]
        first = states[0]
        if all(state is first for state in states):
            cache = DynamicCache(ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
                                                 for k, v in first.kv])
            positions = self._positions(first.length, width, batch, first.rope_delta)
            hidden = self._forward(input_ids=ids, position_ids=positions, use_cache=True,
                                   **{self._cache_kwarg: cache})
            return self._last(hidden, lengths)
        longest = max(state.length for state in states)
        padded = []
        for layer in range(len(first.kv)):
            keys, values = [], []
            for state in states:
                k, v = state.kv[layer]
                pad = longest - state.length
                keys.append(torch.nn.functional.pad(k, (0, 0, 0, pad)))
                values.append(torch.nn.functional.pad(v, (0, 0, 0, pad)))
            padded.append((torch.cat(keys), torch.cat(values)))
        mask = torch.ones(batch, longest + width, dtype=torch.long, device=self.device)
        for i, state in enumerate(states):
            mask[i, state.length:longest] = 0
        positions = torch.cat([self._positions(state.length, width, 1, state.rope_delta) for state in states],
                              dim=-2)
        hidden = self._forward(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                               **{self._cache_kwarg: DynamicCache(ddp_cache_data=padded)})
        return self._last(hidden, lengths)

    def _packed_rows_after(self, pairs) -> torch.Tensor:
        """Rows after their prefix states in one packed sequence, without padding: the distinct
        prefix states' KV side by side, then every row end to end. Each row attends to its own
        prefix's KV and causally to itself only, with positions continuing from its prefix length,
        so it computes exactly what it would alone; the forward costs the rows' real tokens only."""
        order: dict[int, int] = {}
        states: list[PrefixState] = []
        for state, _ in pairs:
            if id(state) not in order:
                order[id(state)] = sum(s.length for s in states)
                states.append(state)
        kv_length = sum(s.length for s in states)
        rows = [row for _, row in pairs]
        total = sum(len(row) for row in rows)
        ids = torch.tensor([[token for row in rows for token in row]], dtype=torch.long, device=self.device)
        mask = torch.zeros(1, 1, total, kv_length + total, dtype=torch.bool, device=self.device)
        ends, positions, start = [], [], 0
        for state, row in pairs:
            n = len(row)
            offset = order[id(state)]
            mask[0, 0, start : start + n, offset : offset + state.length] = True
            mask[0, 0, start : start + n, kv_length + start : kv_length + start + n] = torch.ones(
                n, n, dtype=torch.bool, device=self.device).tril()
            positions.append(self._positions(state.length, n, 1, state.rope_delta))
            start += n
            ends.append(start - 1)
        kv = [(torch.cat([s.kv[layer][0] for s in states], dim=2), torch.cat([s.kv[layer][1] for s in states], dim=2))
              if len(states) > 1 else states[0].kv[layer] for layer in range(len(states[0].kv))]
        hidden = self._forward(input_ids=ids, position_ids=torch.cat(positions, dim=-1), attention_mask=mask,
                               use_cache=True, **{self._cache_kwarg: DynamicCache(ddp_cache_data=kv)})
        return hidden[0, torch.tensor(ends, device=hidden.device)]

    def _rows_full(self, item: EngineItem, rows: list[tuple[int, ...]]) -> torch.Tensor:
        """Rows of one image-bearing item, each forwarded whole after the spliced prefix."""
        prefix = item.prepared.prefix_ids
        inputs, rope_delta = self._prefix_inputs(item)
        ids, lengths = self._ids(rows)
        batch = ids.shape[0]
        embeds = torch.cat([inputs["inputs_embeds"].expand(batch, -1, -1), self.embed(ids)], dim=1)
        row_positions = self._positions(len(prefix), ids.shape[1], batch, rope_delta)
        positions = torch.cat([inputs["position_ids"].expand(-1, batch, -1), row_positions], dim=-1)
        hidden = self._forward(inputs_embeds=embeds, position_ids=positions, use_cache=False)
        return self._last(hidden, lengths + len(prefix))

    def _text_full(self, sequences: list[tuple[tuple[int, ...], tuple[int, ...]]], capture: bool
                   ) -> tuple[torch.Tensor, list[PrefixState | None]]:
        """Whole (prefix + row) text sequences, any prefixes, in one forward. With capture, each row's
        prefix KV is cut from the same forward (causal: positions < len(prefix) never saw the row), so
        a miss costs one forward and still fills L3. Packed end to end when the model's cache is plain
        attention KV (checked once against the padded batch), else right-padded. Through a graph
        bucket when one fits (graphs.py)."""
        graphed = self._graph_whole(sequences, capture)
        if graphed is not None:
            return graphed
        if len(sequences) > 1 and self.packing and self.prefix_mode == "kv":
            packed = self._text_packed(sequences, capture)
            if self._packing_agrees("whole", packed[0], lambda: self._text_padded(sequences, False)[0]):
                return packed
        return self._text_padded(sequences, capture)

    def _text_packed(self, sequences, capture: bool) -> tuple[torch.Tensor, list[PrefixState | None]]:
        """Sequences end to end in one row, each attending causally to itself only (a block-diagonal
        mask), positions restarting at 0: no padding, and each sequence's KV is what it alone makes."""
        full = [prefix + row for prefix, row in sequences]
        total = sum(len(seq) for seq in full)
        ids = torch.tensor([[token for seq in full for token in seq]], dtype=torch.long, device=self.device)
        mask = torch.zeros(1, 1, total, total, dtype=torch.bool, device=self.device)
        starts, ends, positions, start = [], [], [], 0
        for seq in full:
            n = len(seq)
            mask[0, 0, start : start + n, start : start + n] = torch.ones(n, n, dtype=torch.bool,
                                                                          device=self.device).tril()
            positions.append(self._positions(0, n, 1, 0))
            starts.append(start)
            start += n
            ends.append(start - 1)
        cache = self._new_cache() if capture else None
        extra = {self._cache_kwarg: cache} if capture else {}
        hidden = self._forward(input_ids=ids, position_ids=torch.cat(positions, dim=-1), attention_mask=mask,
                               use_cache=capture, **extra)
        states: list[PrefixState | None] = [None] * len(sequences)
        layers = self._branchable(cache) if capture else None
        if layers is not None:
            self.kv_branching = True
            for i, ((prefix, _), begin) in enumerate(zip(sequences, starts)):
                kv = [(layer.keys[:, :, begin : begin + len(prefix)].clone(),
                       layer.values[:, :, begin : begin + len(prefix)].clone()) for layer in layers]
                states[i] = PrefixState(kv=kv, length=len(prefix))
        return hidden[0, torch.tensor(ends, device=hidden.device)], states

    def _text_padded(self, sequences, capture: bool) -> tuple[torch.Tensor, list[PrefixState | None]]:
        ids, lengths = self._ids([prefix + row for prefix, row in sequences])
        positions = self._positions(0, ids.shape[1], ids.shape[0], 0)
        if not capture:
            hidden = self._forward(input_ids=ids, position_ids=positions, use_cache=False)
            return self._last(hidden, lengths), [None] * len(sequences)
        cache = self._new_cache()
        hidden = self._forward(input_ids=ids, position_ids=positions, use_cache=True, **{self._cache_kwarg: cache})
        return self._last(hidden, lengths), self._states_of_padded(cache, sequences)

    def _states_of_padded(self, cache, sequences) -> list[PrefixState | None]:
        """Each row's prefix state cut from a right-padded batch's cache (None where it is not plain KV)."""
        layers = self._branchable(cache)
        states: list[PrefixState | None] = [None] * len(sequences)
        if layers is not None:
            self.kv_branching = True
            for i, (prefix, _) in enumerate(sequences):
                kv = [(layer.keys[i : i + 1, :, : len(prefix)].clone(), layer.values[i : i + 1, :, : len(prefix)].clone())
                      for layer in layers]
                states[i] = PrefixState(kv=kv, length=len(prefix))
        return states

    def _state_chunks(self, pairs: list) -> list[list]:
        """Chunks of (state, row, item) within the row limit; snapshot states never share a chunk
        with another state (their recurrent state cannot be padded and masked)."""
        chunks: list[list] = []
        limit = self._batch_limit
        for pair in pairs:
            current = chunks[-1] if chunks else None
            if (current is None or len(current) >= limit
                    or ((pair[0].snapshot is not None or current[0][0].snapshot is not None)
                        and pair[0] is not current[0][0])):
                chunks.append([pair])
            else:
                current.append(pair)
        return chunks

    @property
    def _batch_limit(self) -> int:
        return self.max_batch_rows if self.batching else 1

    def _chunks(self, rows: list) -> list[list]:
        size = self._batch_limit
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    # ----- start-up -----------------------------------------------------------------------------
    def calibrate(self, lengths: tuple[int, int] = (32, 512), row_tokens: int = 16, repeats: int = 3) -> None:
        """Once at start-up when the reuse policy measures: time a row's forward with its prefix recomputed
        against the same row after the cached prefix state, at a short and a long prefix (synthetic ids)."""
        if not (self.reuse.measures and self._caching and self.vision is None):
            return
        vocab = self.embed.num_embeddings
        row = tuple((7 + i) % vocab for i in range(row_tokens))
        points = {"recompute": [], "reuse": []}
        with torch.inference_mode():
            for length in lengths:
                prefix = tuple((1000 + 13 * i) % vocab for i in range(length))
                _, states = self._text_full([(prefix, row)], True)
                if states[0] is None:
                    log.info("L3 reuse not measured: prefix states are cache snapshots")
                    return
                state = states[0]
                points["recompute"].append((length, self._best_time(lambda: self._text_full([(prefix, row)], False),
                                                                    repeats)))
                points["reuse"].append((length, self._best_time(lambda: self._rows_after_states([(state, row)]),
                                                                repeats)))
        self.reuse.costs = ReuseCosts(LinearCost.through(*points["recompute"]), LinearCost.through(*points["reuse"]))
        log.info("L3 reuse measured on %s: %s", self.device, self.reuse.describe())

    def _best_time(self, work, repeats: int) -> float:
        work()  # the first call may capture a graph
        best = float("inf")
        for _ in range(repeats):
            self._synchronize()
            started = time.perf_counter()
            work()
            self._synchronize()
            best = min(best, time.perf_counter() - started)
        return best

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ----- entry point --------------------------------------------------------------------------
    @torch.inference_mode()
    def run(self, items: list[EngineItem]) -> list[EngineResult]:
        """Decide a batch of items in as few forwards as the row limit allows.

        Items are grouped by prefix key. A group whose prefix state is cached (or that has several
        rows to branch) runs its rows after that state; single-row text groups without a cached
        prefix, whatever their prefixes, run whole in shared right-padded forwards.
        """
        groups: dict[str, list[int]] = {}
        for index, item in enumerate(items):
            groups.setdefault(item.prepared.prefix_key, []).append(index)
        hidden: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(items))}
        outcome: dict[str, str] = {}
        whole: list[tuple[str, int]] = []  # single-row text groups without a state: run whole
        after: list[tuple[PrefixState, tuple[int, ...], int]] = []  # rows after a prefix state
        shared: set[str] = set()  # groups whose later items reuse the state the first one computed
        bypassed: set[str] = set()  # groups whose cached state was not used (the reuse policy)
        for key, indices in groups.items():
            lead = items[indices[0]]
            rows = [(row, i) for i in indices for row in items[i].prepared.rows]
            state = self.l3.get(key) if self._caching else None
            if state is not None and not self.reuse.use_cached(state.length):
                state = None  # measured: recomputing this prefix costs less than assembling its cached state
                bypassed.add(key)
            outcome[key] = ("bypass" if key in bypassed else "hit" if state is not None
                            else "miss" if self._caching else "off")
            if state is None and len(rows) == 1 and not lead.assets and (
                    self.prefix_mode != "snapshot" or not self._caching):
                whole.append((key, indices[0]))  # a KV miss is cut from the whole forward itself
                continue
            if (state is None and key not in bypassed and self.kv_branching is not False
                    and (self._caching or (self.batching and len(rows) > 1))):
                state = self.compute_prefix(lead)
                if self._caching:
                    self._store(key, state)
            if state is not None:
                shared.add(key)
                after.extend((state, row, i) for row, i in rows)
                continue
            for chunk in self._chunks(rows):  # no branchable state: this group's rows run whole
                chunk_rows = [row for row, _ in chunk]
                out = (self._rows_full(lead, chunk_rows) if lead.assets else
                       self._text_full([(lead.prepared.prefix_ids, row) for row in chunk_rows], False)[0])
                for h, (_, i) in zip(out, chunk):
                    hidden[i].append(h)
        for chunk in self._state_chunks(after):
            out = self._rows_after_states([(state, row) for state, row, _ in chunk])
            for h, (_, _, i) in zip(out, chunk):
                hidden[i].append(h)
        for chunk in self._chunks(whole):
            capture = self._caching and any(key not in bypassed for key, _ in chunk)
            out, states = self._text_full([(items[i].prepared.prefix_ids, items[i].prepared.rows[0])
                                           for _, i in chunk], capture)
            for (key, i), h, state in zip(chunk, out, states):
                hidden[i].append(h)
                if capture and key not in bypassed:
                    self._store(key, state)
        results = []
        first_of_group = {indices[0] for indices in groups.values()}
        for i, item in enumerate(items):
            prepared = item.prepared
            logits = [self.head.logits(h, labels) for h, labels in zip(hidden[i], prepared.row_labels)]
            l3 = outcome[prepared.prefix_key]
            reused = l3 == "hit" or (prepared.prefix_key in shared and i not in first_of_group)
            if l3 == "miss" and reused:
                l3 = "hit"  # a later item of the group reused the state its first item computed
            cached = len(prepared.prefix_ids) if reused else 0
            results.append(EngineResult(row_logits=logits, cached_tokens=cached, l3=l3))
        return results
