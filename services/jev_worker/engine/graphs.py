"""CUDA graphs for the engine's forwards: one static-buffer program per shape bucket, captured once and
replayed for every batch that fits it; batches that fit no bucket run eagerly, counted by reason.

Eager PyTorch on a GPU is launch-bound (on an H200 a 1.5B forward costs ~25-35 ms whatever its length,
its graph replay 5-8 ms), so the engine's forwards replay graphs when they can.

A bucket is (rows, padded row width, padded prefix KV length, shared). Rows are right-padded to the width
and the bucket's extra rows are all padding: attention is causal, so real tokens never see what follows
them, and each row's hidden state is read at its own last real position. Rows after cached prefix states
read the prefix KV from a static pool (sized from the L3 budget: a state larger than L3 was never
cached); a 4D boolean mask lets each row see its own prefix's real positions and itself causally, so the
pool's padding (and another state's KV) is never attended to.

How a program is captured is injected: `CudaGraphCapture` records it in a torch.cuda.CUDAGraph (warmed up
on a side stream, as the PyTorch docs prescribe); `NoCapture` runs the same static-buffer program eagerly
on every call, so on CPU everything but the capture itself is exercised and tested.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

log = logging.getLogger("jev.worker.graphs")

LENGTH_BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
MAX_MASK_ELEMENTS = 1 << 26  # a bucket's [rows, 1, width, prefix + width] mask beyond this runs eagerly
MAX_PROGRAMS = 64


@dataclass(frozen=True)
class Bucket:
    rows: int
    width: int  # padded tokens per row
    prefix: int = 0  # padded prefix KV length; 0: whole sequences, no prefix state read
    shared: bool = False  # every row continues one prefix state: its KV is held once and expanded


@dataclass(frozen=True)
class Fallback:
    reason: str


def row_buckets(max_rows: int) -> tuple[int, ...]:
    sizes = [n for n in (1, 2, 4, 8, 16, 32, 64, 128, 256) if n < max_rows]
    return (*sizes, max_rows)


def round_up(value: int, buckets: tuple[int, ...]) -> int | None:
    return next((b for b in buckets if b >= value), None)


def choose_bucket(
    rows: int, width: int, prefix: int = 0, shared: bool = False, *, max_rows: int, kv_capacity: int = 0
) -> Bucket | Fallback:
    """The smallest bucket that holds `rows` rows of up to `width` tokens after prefix states of up to
    `prefix` tokens (0: none), or why none does. `kv_capacity` is the static KV pool in tokens x rows."""
    padded_rows = round_up(rows, row_buckets(max_rows))
    if padded_rows is None:
        return Fallback("rows")
    padded_width = round_up(width, LENGTH_BUCKETS)
    if padded_width is None:
        return Fallback("length")
    if prefix == 0:
        return Bucket(padded_rows, padded_width)
    padded_prefix = round_up(prefix, LENGTH_BUCKETS)
    if padded_prefix is None:
        return Fallback("prefix_length")
    if (1 if shared else padded_rows) * padded_prefix > kv_capacity:
        return Fallback("kv_budget")
    if padded_rows * padded_width * (padded_prefix + padded_width) > MAX_MASK_ELEMENTS:
        return Fallback("mask_size")
    return Bucket(padded_rows, padded_width, padded_prefix, shared)


class Capture(Protocol):
    name: str

    def capture(self, program: Callable[[], None]) -> Callable[[], None]:
        """A replay of `program`: running it reads the program's static inputs and rewrites its outputs."""


class NoCapture:
    """The static-buffer path without a graph: every replay runs the program eagerly (CPU, tests)."""

    name = "eager"

    def capture(self, program):
        return program


class CudaGraphCapture:
    """torch.cuda.CUDAGraph per program, all in one memory pool (programs replay one at a time, on the
    model thread, and their outputs are copied out before the next replay)."""

    name = "cuda-graph"

    def __init__(self, device: torch.device, warmup: int = 2):
        self.device = device
        self.warmup = warmup
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, program):
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # lazy initialisations and autotuning happen here, not in the graph
            for _ in range(self.warmup):
                program()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            program()
        return graph.replay


def capture_for(mode: str, device: torch.device) -> Capture | None:
    """The capture JEV_CUDA_GRAPHS asks for on `device`: `auto` captures on CUDA and keeps the plain eager
    engine elsewhere; `on` also runs the static-buffer path on CPU (without capture); `off` never."""
    if mode == "off" or (mode == "auto" and device.type != "cuda"):
        return None
    return CudaGraphCapture(device) if device.type == "cuda" else NoCapture()


# forward(input_ids, position_ids, attention_mask or None, cache or None) -> last_hidden_state
Forward = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", object], torch.Tensor]


class Program:
    """One bucket's static inputs, its forward over them, and where its results land after a replay."""

    def __init__(self, bucket: Bucket, device: torch.device, pad_id: int, kv: list | None, keep_kv: bool):
        self.bucket = bucket
        rows, width = bucket.rows, bucket.width
        self.ids = torch.full((rows, width), pad_id, dtype=torch.long, device=device)
        self.positions = torch.arange(width, device=device).repeat(rows, 1)
        self.last = torch.zeros(rows, dtype=torch.long, device=device)
        self.mask = (
            torch.zeros(rows, 1, width, bucket.prefix + width, dtype=torch.bool, device=device)
            if bucket.prefix
            else None
        )
        self.kv = kv  # [(keys, values)] per layer: views of the static pool, [kv rows, heads, prefix, dim]
        self.keep_kv = keep_kv
        self.out: torch.Tensor | None = None  # [rows, hidden] after a replay
        self.cache = None  # the cache the forward filled (keep_kv), read after a replay
        self.replay: Callable[[], None] | None = None

    def run(self, forward: Forward, new_cache: Callable[[], object]) -> None:
        from transformers import DynamicCache

        rows = self.bucket.rows
        if self.kv is not None:
            layers = [(k.expand(rows, -1, -1, -1), v.expand(rows, -1, -1, -1)) for k, v in self.kv]
            cache = DynamicCache(ddp_cache_data=layers)
        else:
            cache = new_cache() if self.keep_kv else None
        hidden = forward(self.ids, self.positions, self.mask, cache)
        self.cache = cache if self.keep_kv else None
        self.out = hidden[torch.arange(rows, device=hidden.device), self.last]


class KVPool:
    """Static per-layer key and value storage that every prefix bucket views in its own shape: programs
    run one at a time and each rewrites what it reads before its replay."""

    def __init__(self, like: list[tuple[torch.Tensor, torch.Tensor]], budget_bytes: int, max_tokens: int):
        per_token = sum((k.shape[1] * k.shape[3] + v.shape[1] * v.shape[3]) * k.element_size() for k, v in like)
        self.capacity = max(0, min(budget_bytes // max(1, per_token), max_tokens))  # tokens x rows
        self.keys = [
            torch.zeros(self.capacity * k.shape[1] * k.shape[3], dtype=k.dtype, device=k.device) for k, _ in like
        ]
        self.values = [
            torch.zeros(self.capacity * v.shape[1] * v.shape[3], dtype=v.dtype, device=v.device) for _, v in like
        ]
        self.shapes = [(k.shape[1], k.shape[3], v.shape[1], v.shape[3]) for k, v in like]
        self.nbytes = self.capacity * per_token

    def views(self, rows: int, prefix: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [
            (
                keys[: rows * hk * prefix * dk].view(rows, hk, prefix, dk),
                values[: rows * hv * prefix * dv].view(rows, hv, prefix, dv),
            )
            for keys, values, (hk, dk, hv, dv) in zip(self.keys, self.values, self.shapes)
        ]


class GraphRunner:
    """The engine's forwards through bucketed static-buffer programs. `whole` and `after` return None
    when the batch fits no bucket (the engine then runs it eagerly); `fallbacks` counts why."""

    def __init__(
        self,
        forward: Forward,
        new_cache: Callable[[], object],
        device: torch.device,
        *,
        capture: Capture,
        max_rows: int,
        kv_budget_bytes: int,
        pad_id: int = 0,
        max_programs: int = MAX_PROGRAMS,
    ):
        self.forward = forward
        self.new_cache = new_cache
        self.device = device
        self.capture = capture
        self.max_rows = max(1, max_rows)
        self.kv_budget_bytes = max(0, kv_budget_bytes)
        self.pad_id = pad_id
        self.max_programs = max_programs
        self.programs: dict[tuple[Bucket, bool], Program] = {}
        self.pool: KVPool | None = None
        self.replays = 0
        self.capture_seconds = 0.0
        self.fallbacks: dict[str, int] = {}

    # ----- accounting ---------------------------------------------------------------------------
    def refuse(self, reason: str, detail: str = "") -> None:
        """Count an eager fallback; the first of each reason is logged at info, later ones at debug."""
        first = reason not in self.fallbacks
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1
        (log.info if first else log.debug)(
            "graph fallback (%s): running eagerly%s", reason, f" ({detail})" if detail else ""
        )

    def describe(self) -> dict:
        return {
            "capture": self.capture.name,
            "programs": len(self.programs),
            "replays": self.replays,
            "fallbacks": dict(self.fallbacks),
            "capture_seconds": round(self.capture_seconds, 3),
            "kv_pool_bytes": self.pool.nbytes if self.pool else 0,
        }

    # ----- programs -----------------------------------------------------------------------------
    def _program(self, bucket: Bucket, keep_kv: bool) -> Program | None:
        key = (bucket, keep_kv)
        program = self.programs.get(key)
        if program is not None:
            return program
        if len(self.programs) >= self.max_programs:
            self.refuse("graph_limit", f"{len(self.programs)} programs captured")
            return None
        kv = self.pool.views(1 if bucket.shared else bucket.rows, bucket.prefix) if bucket.prefix else None
        program = Program(bucket, self.device, self.pad_id, kv, keep_kv)
        started = time.perf_counter()
        try:
            program.replay = self.capture.capture(lambda: program.run(self.forward, self.new_cache))
        except Exception as exc:  # noqa: BLE001 - a shape the capture cannot take runs eagerly, visibly
            self.refuse("capture_failed", f"{bucket}: {type(exc).__name__}: {exc}")
            return None
        self.capture_seconds += time.perf_counter() - started
        self.programs[key] = program
        log.debug("captured %s (keep_kv=%s) with %s", bucket, keep_kv, self.capture.name)
        return program

    def _replay(self, program: Program) -> None:
        program.replay()
        self.replays += 1

    # ----- entry points -------------------------------------------------------------------------
    def whole(
        self, sequences: list[tuple[tuple[int, ...], tuple[int, ...]]], keep_cache: bool
    ) -> tuple[torch.Tensor, object] | None:
        """Whole (prefix + row) sequences from position 0: each row's last hidden state, and with keep_cache
        the cache the forward filled (rows in order; the caller cuts each prefix's KV from it, valid until
        the next replay)."""
        full = [prefix + row for prefix, row in sequences]
        bucket = choose_bucket(len(full), max(len(s) for s in full), max_rows=self.max_rows)
        if isinstance(bucket, Fallback):
            self.refuse(bucket.reason, f"{len(full)} rows, {max(len(s) for s in full)} tokens")
            return None
        program = self._program(bucket, keep_cache)
        if program is None:
            return None
        ids = torch.full((bucket.rows, bucket.width), self.pad_id, dtype=torch.long)
        last = torch.zeros(bucket.rows, dtype=torch.long)
        for i, seq in enumerate(full):
            ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
            last[i] = len(seq) - 1
        program.ids.copy_(ids)
        program.last.copy_(last)
        self._replay(program)
        return program.out[: len(full)].clone(), program.cache

    def after(self, pairs: list[tuple[object, tuple[int, ...]]]) -> torch.Tensor | None:
        """Rows, each after its own prefix state (engine.PrefixState with plain KV), in one replay."""
        states = [state for state, _ in pairs]
        first = states[0]
        shared = all(state is first for state in states)
        longest = max(state.length for state in states)
        width = max(len(row) for _, row in pairs)
        if self.pool is None:
            self.pool = KVPool(first.kv, self.kv_budget_bytes, self.max_rows * LENGTH_BUCKETS[-1])
            log.info("static prefix KV pool: %d token rows, %.1f MiB", self.pool.capacity, self.pool.nbytes / 2**20)
        bucket = choose_bucket(
            len(pairs), width, longest, shared, max_rows=self.max_rows, kv_capacity=self.pool.capacity
        )
        if isinstance(bucket, Fallback):
            self.refuse(bucket.reason, f"{len(pairs)} rows, {width} tokens after {longest}")
            return None
        program = self._program(bucket, False)
        if program is None:
            return None
        self._fill_after(program, pairs, shared)
        self._replay(program)
        return program.out[: len(pairs)].clone()

    def _fill_after(self, program: Program, pairs, shared: bool) -> None:
        bucket = program.bucket
        rows, width, prefix = bucket.rows, bucket.width, bucket.prefix
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        positions = torch.arange(width).repeat(rows, 1)
        last = torch.zeros(rows, dtype=torch.long)
        mask = torch.zeros(rows, 1, width, prefix + width, dtype=torch.bool)
        mask[:, 0, :, prefix:] = torch.ones(width, width, dtype=torch.bool).tril()  # padding rows too: no empty row
        for i, (state, row) in enumerate(pairs):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
            positions[i] += state.length
            last[i] = len(row) - 1
            mask[i, 0, :, : state.length] = True
        for i, (state, _) in enumerate(pairs[:1] if shared else pairs):
            for (keys, values), (k, v) in zip(program.kv, state.kv):
                keys[i, :, : state.length].copy_(k[0])
                values[i, :, : state.length].copy_(v[0])
        program.ids.copy_(ids)
        program.positions.copy_(positions)
        program.last.copy_(last)
        program.mask.copy_(mask)
