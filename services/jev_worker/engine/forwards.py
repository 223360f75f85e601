"""The forwards a runner chooses from (runner.py): whole sequences and rows after prefix states, packed end to
end under a block mask or right-padded, eager or replayed from a graph bucket (graphs.py), with prefill in
chunks. What differs by architecture comes from the backend's forward adapter (adapters.py).

Rows are right-padded and need no attention mask in a causal model: a real token never sees the padding after
it, and each row's hidden state is read at its own last real position. Packing is checked once per path against
the padded batch, and turned off when the model's attention does not honour a custom mask.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from ..protocols import ForwardAdapter
from ..scheduling.abandon import ForwardAbandoned
from ..scheduling.prefix_cache import PrefixState, layer_tensors

log = logging.getLogger("jev.worker.forwards")


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def plain_kv(cache) -> bool:
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
    if not plain_kv(cache):
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


@dataclass(frozen=True)
class Segment:
    """Consecutive rows (indices into a forward's pairs) after one prefix state whose first `stem` tokens are the
    same: the stem runs once and each row carries only its rest (stem 0: the rows share nothing)."""

    rows: tuple[int, ...]
    stem: int = 0

    def tokens(self, pairs) -> int:
        return self.stem + sum(len(pairs[r][1]) - self.stem for r in self.rows)


MIN_STEM = 8  # fewer shared leading tokens are not worth a stem (e.g. `Question:` alone)


def shared_length(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def segments(pairs, least: int = MIN_STEM) -> list[Segment]:
    """The rows as segments: consecutive rows after the same prefix state that begin with at least `least` same
    tokens (a choice's shifted listings share their question line) share a stem, shortened so that every row
    keeps at least its last token to read."""
    out: list[list] = []  # [rows, stem]
    for i, (state, row) in enumerate(pairs):
        if out:
            rows, stem = out[-1]
            first_state, first = pairs[rows[0]]
            if first_state is state:
                bound = stem if len(rows) > 1 else len(first) - 1
                shared = min(shared_length(first[:bound], row), len(row) - 1)
                if shared >= least:
                    out[-1] = [rows + [i], shared]
                    continue
        out.append([[i], 0])
    return [Segment(tuple(rows), stem if len(rows) > 1 else 0) for rows, stem in out]


def packs(pairs, budget: int) -> list[list[Segment]]:
    """The rows' segments in packed forwards of at most `budget` tokens each (0: one pack), in order: a packed
    forward's attention is dense over all its tokens (the mask hides what a row may not see), so its cost grows
    with the square of its length. A segment over the budget is split (its stem then runs once per part); a row
    over it runs alone."""
    pieces = segments(pairs)
    if budget:
        split = []
        for segment in pieces:
            part: list[int] = []
            for r in segment.rows:
                if part and Segment(tuple(part + [r]), segment.stem).tokens(pairs) > budget:
                    split.append(Segment(tuple(part), segment.stem if len(part) > 1 else 0))
                    part = []
                part.append(r)
            split.append(Segment(tuple(part), segment.stem if len(part) > 1 else 0))
        pieces = split
    out: list[list[Segment]] = []
    used = 0
    for segment in pieces:
        cost = segment.tokens(pairs)
        if out and (not budget or used + cost <= budget):
            out[-1].append(segment)
            used += cost
        else:
            out.append([segment])
            used = cost
    return out


def _causal_block(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


class Forwards:
    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        adapter: ForwardAdapter,
        pad_id: int = 0,
        prefill_chunk: int = 0,
        pack_tokens: int = 0,
    ):
        self.model = model
        self.device = device
        self.adapter = adapter
        self.pad_id = pad_id
        self.backbone = model.get_decoder()
        self.embed = model.get_input_embeddings()
        params = inspect.signature(self.backbone.forward).parameters
        self.cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.prefill_chunk = prefill_chunk  # tokens per prefill chunk (0: one pass): JEV_PREFILL_CHUNK_TOKENS
        self.pack_tokens = max(0, pack_tokens)  # tokens per packed forward of rows (0: unbounded): JEV_PACK_TOKENS
        self.packing = adapter.packs
        self.packing_verified: set[str] = set()  # paths ("rows", "whole") checked against a padded batch
        self.prefix_mode: str | None = None  # "kv" (plain attention) or "snapshot" (recurrent/sliding state)
        self.graphs = None  # graphs.GraphRunner, when the runner replays graphed forwards

    # ----- the device ----------------------------------------------------------------------------
    def completion(self) -> Callable[[], None] | None:
        """An event after every kernel launched so far, to wait on from another thread while this one launches the
        next batch (CUDA launches return before the device is done); None where the forwards ran synchronously."""
        if self.device.type != "cuda":
            return None
        event = torch.cuda.Event()
        event.record()
        return event.synchronize

    def synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ----- inputs and the forward ---------------------------------------------------------------
    def ids(self, rows: list[tuple[int, ...]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        return ids.to(self.device), torch.tensor([len(r) for r in rows], dtype=torch.long).to(self.device)

    def positions(self, start: int, length: int, batch: int, rope_delta) -> torch.Tensor:
        return self.adapter.positions(start, length, batch, rope_delta, self.device)

    def prefix_inputs(self, prefix_ids, assets: list) -> tuple[dict, int]:
        ids = torch.tensor([prefix_ids], dtype=torch.long, device=self.device)
        return self.adapter.prefix_inputs(self.model, ids, assets)

    def new_cache(self) -> DynamicCache:
        """A cache whose layer types follow the model's config (sliding, linear-attention or full)."""
        return DynamicCache(config=self.model.config)

    def forward(self, **kwargs) -> torch.Tensor:
        """The backbone's last hidden states; a sequence longer than `prefill_chunk` tokens is prefilled in
        chunks (chunked_forward) so that no layer step is long and a forward nobody waits for stops soon."""
        return chunked_forward(
            self.backbone_forward,
            kwargs,
            self.prefill_chunk if self.adapter.causal else 0,
            self.cache_kwarg,
            self.new_cache,
        )

    def backbone_forward(self, **kwargs) -> torch.Tensor:
        return self.backbone(**kwargs).last_hidden_state

    def graph_forward(self, ids, positions, mask, cache) -> torch.Tensor:
        kwargs = {"input_ids": ids, "position_ids": positions, "use_cache": cache is not None}
        if mask is not None:
            kwargs["attention_mask"] = mask
        if cache is not None:
            kwargs[self.cache_kwarg] = cache
        return self.backbone_forward(**kwargs)  # graph buckets are bounded in length: one pass

    def read(self, hidden: torch.Tensor, lengths: torch.Tensor):
        """What the head reads of each right-padded row: its last real position, or every real position."""
        if self.adapter.reads == "last":
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), lengths - 1]
        return [hidden[i, :n] for i, n in enumerate(lengths.tolist())]

    # ----- prefix states ------------------------------------------------------------------------
    def branchable(self, cache) -> list | None:
        """The cache's per-layer KV layers when it is plain attention KV, else None (snapshot mode)."""
        layers = getattr(cache, "layers", [])
        if plain_kv(cache):
            self.prefix_mode = "kv"
            return layers
        if self.prefix_mode != "snapshot":
            log.info(
                "model cache layers are %s: prefix states are cache snapshots",
                sorted({type(x).__name__ for x in layers}),
            )
        self.prefix_mode = "snapshot"
        return None

    def branch_snapshot(self, state: PrefixState, batch: int):
        cache = copy.deepcopy(state.snapshot)
        if batch > 1:
            for layer in cache.layers:
                for owner, key, tensor in list(layer_tensors(layer)):
                    owner[key] = tensor.repeat_interleave(batch, dim=0)
        return cache

    def prefix_state(self, prefix_ids, assets: list) -> PrefixState:
        """One forward over the prefix: its KV (plain attention) or a snapshot of its whole cache."""
        if self.graphs is not None and not assets and self.prefix_mode == "kv":
            graphed = self.whole_graphed([(prefix_ids, prefix_ids[:0])], True)
            if graphed is not None and graphed[1][0] is not None:
                return graphed[1][0]
        inputs, rope_delta = self.prefix_inputs(prefix_ids, assets)
        cache = self.new_cache()
        self.forward(**inputs, use_cache=True, **{self.cache_kwarg: cache})
        layers = self.branchable(cache)
        if layers is not None:
            return PrefixState(
                kv=[(layer.keys, layer.values) for layer in layers], length=len(prefix_ids), rope_delta=rope_delta
            )
        return PrefixState(kv=[], length=len(prefix_ids), rope_delta=rope_delta, snapshot=cache)

    def states_of_padded(self, cache, sequences) -> list[PrefixState | None]:
        """Each row's prefix state cut from a right-padded batch's cache (None where it is not plain KV)."""
        layers = self.branchable(cache)
        if layers is None:
            return [None] * len(sequences)
        return [
            PrefixState(
                kv=[
                    (layer.keys[i : i + 1, :, : len(prefix)].clone(), layer.values[i : i + 1, :, : len(prefix)].clone())
                    for layer in layers
                ],
                length=len(prefix),
            )
            for i, (prefix, _) in enumerate(sequences)
        ]

    # ----- whole sequences ----------------------------------------------------------------------
    def whole_graphed(self, sequences, capture: bool):
        if self.graphs is None:
            return None
        if capture and self.prefix_mode == "snapshot":
            self.graphs.refuse("snapshot_cache", "prefix state is a cache snapshot, not plain attention KV")
            return None
        got = self.graphs.whole(sequences, capture)
        if got is None:
            return None
        hidden, cache = got
        return hidden, self.states_of_padded(cache, sequences) if capture else [None] * len(sequences)

    def whole(self, sequences: list[tuple[tuple[int, ...], tuple[int, ...]]], capture: bool):
        """Whole (prefix + row) text sequences, any prefixes, in one forward. With capture, each row's prefix
        KV is cut from the same forward (causal: positions < len(prefix) never saw the row), so a miss costs
        one forward and still fills L3. Packed when the cache is plain KV, else right-padded; through a graph
        bucket when one fits. -> (what the head reads per row, prefix states or None)."""
        graphed = self.whole_graphed(sequences, capture)
        if graphed is not None:
            return graphed
        if len(sequences) > 1 and self.packing and self.prefix_mode == "kv" and self.adapter.reads == "last":
            packed = self._whole_packed(sequences, capture)
            if self._packing_agrees("whole", packed[0], lambda: self._whole_padded(sequences, False)[0]):
                return packed
        return self._whole_padded(sequences, capture)

    def _whole_packed(self, sequences, capture: bool):
        """Sequences end to end in one row, each attending causally to itself only (a block-diagonal mask),
        positions restarting at 0: no padding, and each sequence's KV is what it alone makes."""
        full = [prefix + row for prefix, row in sequences]
        total = sum(len(seq) for seq in full)
        ids = torch.tensor([[token for seq in full for token in seq]], dtype=torch.long, device=self.device)
        mask = torch.zeros(1, 1, total, total, dtype=torch.bool, device=self.device)
        starts, ends, positions, start = [], [], [], 0
        for seq in full:
            n = len(seq)
            mask[0, 0, start : start + n, start : start + n] = _causal_block(n, self.device)
            positions.append(self.positions(0, n, 1, 0))
            starts.append(start)
            start += n
            ends.append(start - 1)
        cache = self.new_cache() if capture else None
        extra = {self.cache_kwarg: cache} if capture else {}
        hidden = self.forward(
            input_ids=ids, position_ids=torch.cat(positions, dim=-1), attention_mask=mask, use_cache=capture, **extra
        )
        states: list[PrefixState | None] = [None] * len(sequences)
        layers = self.branchable(cache) if capture else None
        if layers is not None:
            for i, ((prefix, _), begin) in enumerate(zip(sequences, starts)):
                states[i] = PrefixState(
                    kv=[
                        (
                            layer.keys[:, :, begin : begin + len(prefix)].clone(),
                            layer.values[:, :, begin : begin + len(prefix)].clone(),
                        )
                        for layer in layers
                    ],
                    length=len(prefix),
                )
        return hidden[0, torch.tensor(ends, device=hidden.device)], states

    def _whole_padded(self, sequences, capture: bool):
        ids, lengths = self.ids([prefix + row for prefix, row in sequences])
        positions = self.positions(0, ids.shape[1], ids.shape[0], 0)
        mask = self.adapter.whole_mask(lengths, ids.shape[1], self.embed.weight.dtype)
        extra = {"attention_mask": mask} if mask is not None else {}
        if not capture:
            hidden = self.forward(input_ids=ids, position_ids=positions, use_cache=False, **extra)
            return self.read(hidden, lengths), [None] * len(sequences)
        cache = self.new_cache()
        hidden = self.forward(
            input_ids=ids, position_ids=positions, use_cache=True, **{self.cache_kwarg: cache}, **extra
        )
        return self.read(hidden, lengths), self.states_of_padded(cache, sequences)

    def with_images(self, prefix_ids, assets: list, rows: list[tuple[int, ...]]):
        """Rows of one image-bearing prompt, each forwarded whole after the spliced prefix."""
        inputs, rope_delta = self.prefix_inputs(prefix_ids, assets)
        ids, lengths = self.ids(rows)
        batch = ids.shape[0]
        embeds = torch.cat([inputs["inputs_embeds"].expand(batch, -1, -1), self.embed(ids)], dim=1)
        row_positions = self.positions(len(prefix_ids), ids.shape[1], batch, rope_delta)
        positions = torch.cat([inputs["position_ids"].expand(-1, batch, -1), row_positions], dim=-1)
        hidden = self.forward(inputs_embeds=embeds, position_ids=positions, use_cache=False)
        return self.read(hidden, lengths + len(prefix_ids))

    def sequence(self, ids, assets: list) -> torch.Tensor:
        """One prompt's every position (a head that reads a whole request)."""
        inputs, _ = self.prefix_inputs(ids, assets)
        return self.forward(**inputs, use_cache=False)[0]

    # ----- rows after prefix states -------------------------------------------------------------
    def after(self, pairs: list[tuple[PrefixState, tuple[int, ...]]]):
        """Rows, each after its own prefix state (a snapshot state is never mixed with another), in one forward:
        packed when the model's attention takes a custom mask (checked once against the padded batch), else
        right-padded; through a graph bucket when one fits."""
        ids, lengths = self.ids([row for _, row in pairs])
        batch, width = ids.shape
        first = pairs[0][0]
        if first.snapshot is not None:
            if self.graphs is not None:
                self.graphs.refuse("snapshot_cache", "prefix state is a cache snapshot, not plain attention KV")
            positions = self.positions(first.length, width, batch, first.rope_delta)
            hidden = self.forward(
                input_ids=ids,
                position_ids=positions,
                use_cache=True,
                **{self.cache_kwarg: self.branch_snapshot(first, batch)},
            )
            return self.read(hidden, lengths)
        if self.graphs is not None:
            graphed = self.graphs.after(pairs)
            if graphed is not None:
                return graphed
        if batch > 1 and self.packing and self.adapter.reads == "last":
            packed = torch.cat([self._after_packed(pairs, segments) for segments in packs(pairs, self.pack_tokens)])
            if self._packing_agrees("rows", packed, lambda: self._after_padded(pairs, ids, lengths)):
                return packed
        return self._after_padded(pairs, ids, lengths)

    def _packing_agrees(self, path: str, packed: torch.Tensor, padded) -> bool:
        """Once per model and path: the packed hidden states must equal the padded batch's (`padded()`),
        or the model's attention does not honour a custom mask and packing is turned off."""
        if path in self.packing_verified:
            return True
        error = relative_error(packed, padded())  # (a forward stopped in padded() leaves the path unchecked)
        self.packing_verified.add(path)
        if error <= 1e-3:
            return True
        log.warning("packed %s differ from a padded batch (relative %.2e): packing disabled", path, error)
        self.packing = False
        return False

    def _after_padded(self, pairs, ids: torch.Tensor, lengths: torch.Tensor):
        """Right-padded rows after their prefix states. One shared state: its KV is expanded (a view) across
        the rows. Several: each state's KV padded to the longest, the padding masked."""
        batch, width = ids.shape
        states = [state for state, _ in pairs]
        first = states[0]
        if all(state is first for state in states):
            cache = DynamicCache(
                ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in first.kv]
            )
            positions = self.positions(first.length, width, batch, first.rope_delta)
            hidden = self.forward(input_ids=ids, position_ids=positions, use_cache=True, **{self.cache_kwarg: cache})
            return self.read(hidden, lengths)
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
            mask[i, state.length : longest] = 0
        positions = torch.cat([self.positions(state.length, width, 1, state.rope_delta) for state in states], dim=-2)
        hidden = self.forward(
            input_ids=ids,
            position_ids=positions,
            attention_mask=mask,
            use_cache=True,
            **{self.cache_kwarg: DynamicCache(ddp_cache_data=padded)},
        )
        return self.read(hidden, lengths)

    def _after_packed(self, pairs, segments: list[Segment]) -> torch.Tensor:
        """The `segments` (packs()) of rows after their prefix states in one packed sequence, without padding: the
        distinct prefix states' KV side by side, then each segment's stem once and its rows' rests end to end. A
        stem attends to its prefix's KV and causally to itself; a row's rest to its prefix's KV, its stem and
        causally to itself, positions continuing from the prefix and stem: so every row computes exactly what it
        would alone, and its last token is read. -> the rows' hidden states, in the segments' order."""
        order: dict[int, int] = {}
        states: list[PrefixState] = []
        for segment in segments:
            state = pairs[segment.rows[0]][0]
            if id(state) not in order:
                order[id(state)] = sum(s.length for s in states)
                states.append(state)
        kv_length = sum(s.length for s in states)
        pieces = []  # (state, token ids, the stem's start in the pack or None, the stem's length, read it?)
        start = 0
        for segment in segments:
            state, first = pairs[segment.rows[0]]
            stem_start = None
            if segment.stem:
                pieces.append((state, first[: segment.stem], None, 0, False))
                stem_start, start = start, start + segment.stem
            for r in segment.rows:
                rest = pairs[r][1][segment.stem :]
                pieces.append((state, rest, stem_start, segment.stem, True))
                start += len(rest)
        total = start
        ids = torch.tensor([[token for piece in pieces for token in piece[1]]], dtype=torch.long, device=self.device)
        mask = torch.zeros(1, 1, total, kv_length + total, dtype=torch.bool, device=self.device)
        ends, positions, start = [], [], 0
        for state, tokens, stem_start, stem, read in pieces:
            n, kv = len(tokens), order[id(state)]
            mask[0, 0, start : start + n, kv : kv + state.length] = True
            if stem_start is not None:
                mask[0, 0, start : start + n, kv_length + stem_start : kv_length + stem_start + stem] = True
            mask[0, 0, start : start + n, kv_length + start : kv_length + start + n] = _causal_block(n, self.device)
            positions.append(self.positions(state.length + stem, n, 1, state.rope_delta))
            start += n
            if read:
                ends.append(start - 1)
        kv = [
            (torch.cat([s.kv[layer][0] for s in states], dim=2), torch.cat([s.kv[layer][1] for s in states], dim=2))
            if len(states) > 1
            else states[0].kv[layer]
            for layer in range(len(states[0].kv))
        ]
        hidden = self.forward(
            input_ids=ids,
            position_ids=torch.cat(positions, dim=-1),
            attention_mask=mask,
            use_cache=True,
            **{self.cache_kwarg: DynamicCache(ddp_cache_data=kv)},
        )
        return hidden[0, torch.tensor(ends, device=hidden.device)]
