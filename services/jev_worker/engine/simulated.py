"""A simulated device, for benchmarks only (`JEV_DEVICE=simulated` with `JEV_BENCHMARK=1`): it takes the forwards'
place (forwards.py) under the real runner, so everything above it runs for real: HTTP, schema, prompt builder and
tokenizer, scheduler, prefix cache, runner, readout, response. What the host spends around a fast device is then
measured on a machine without one.

Each forward the real `Forwards` would run (the same paths: packed or padded, one per pack, a prefix forward) is
priced by a cost model of a real GPU and queued on a simulated stream, as a CUDA launch is: the call returns at once
and the device is busy until the forwards queued before it and this one are done. `completion()` is the batch's
event: waiting on it sleeps (`time.sleep` releases the GIL, as a device sync does) until the device reaches it, so
the host may prepare and launch the next batch meanwhile. Each batch's device seconds are counted
(`take_device_seconds`), so a benchmark subtracts them and sums them into the device's busy time. Hidden states are the
loaded model's input embedding of each row's last token (the right shape, deterministic, nearly free), so the
readout's real head turns them into logits. Prefix states hold KV whose byte size is the simulated model's (a
broadcast view: no memory behind it), so L3 fills up and evicts as it would on the device.

The cost of one forward is `fixed + per_token * tokens + per_pair * attention pairs` (pairs: each query token times
the keys it is scored against, as the dense-masked forwards compute them), fitted to the figures measured on one
H200 (../shared/gpu-baseline.md, 2026-12-04: a bare forward, graph-replayed where that was faster, eager where not).
`SHAPES[name].errors()` gives each measured point's relative error (all within 15%; tests check it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property

import torch

from ..scheduling.prefix_cache import PrefixState
from .forwards import packs


@dataclass(frozen=True)
class Measured:
    """One measured forward: `rows` sequences of `tokens` each after `past` cached tokens, padded into one batch."""

    rows: int
    tokens: int
    ms: float
    what: str

    @property
    def features(self) -> tuple[int, int]:
        return self.rows * self.tokens, self.rows * self.tokens * self.tokens


def fit(points: tuple[Measured, ...]) -> tuple[float, float, float]:
    """(fixed, per_token, per_pair) in seconds, least squares on the relative error (each point weighs the same)."""
    rows = [(1.0 / p.ms, p.features[0] / p.ms, p.features[1] / p.ms) for p in points]
    solution, *_ = torch.linalg.lstsq(
        torch.tensor(rows, dtype=torch.float64), torch.ones(len(rows), 1, dtype=torch.float64)
    )
    fixed, per_token, per_pair = (float(x) / 1000 for x in solution.flatten())
    return fixed, per_token, per_pair


@dataclass(frozen=True)
class Shapes:
    """A simulated model: its KV bytes per token (BF16, all layers) and the forwards measured on the device."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    measured: tuple[Measured, ...]

    @property
    def kv_bytes_per_token(self) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * 2  # keys and values, 2 bytes each (BF16)

    @cached_property
    def cost(self) -> tuple[float, float, float]:
        return fit(self.measured)

    def seconds(self, tokens: int, pairs: int) -> float:
        fixed, per_token, per_pair = self.cost
        return fixed + per_token * tokens + per_pair * pairs

    def errors(self) -> dict[str, float]:
        """Each measured point's relative error under the fitted cost."""
        return {p.what: self.seconds(*p.features) * 1000 / p.ms - 1 for p in self.measured}

    def describe(self) -> dict:
        fixed, per_token, per_pair = self.cost
        return {
            "shapes": self.name,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "cost": {
                "fixed_ms": round(fixed * 1e3, 4),
                "per_token_us": round(per_token * 1e6, 4),
                "per_kilopair_us": round(per_pair * 1e9, 4),
            },
        }


SHAPES = {
    "1.5b": Shapes(
        "1.5b",
        layers=28,
        kv_heads=2,
        head_dim=128,
        measured=(  # Qwen2-1.5B, BF16, graph replay
            Measured(1, 89, 4.6, "1 question, new state (89 tokens)"),
            Measured(1, 459, 6.7, "8 questions, one state (459 tokens)"),
            Measured(1, 2585, 24.2, "1 question, long state (2,585 tokens)"),
            Measured(8, 89, 7.6, "8 rows x 89 tokens"),
        ),
    ),
    "7.35b": Shapes(
        "7.35b",
        layers=36,
        kv_heads=8,
        head_dim=128,
        measured=(  # hidden 4096, GQA 32/8, BF16
            Measured(1, 89, 9.1, "1 question, new state (89 tokens; graph)"),
            Measured(1, 459, 17.3, "8 questions, one state (459 tokens; graph)"),
            Measured(1, 2585, 78.0, "1 question, long state (2,585 tokens; eager, faster than graph's 96)"),
        ),
    ),
}


class SimulatedForwards:
    """Forwards' interface (whole, after, prefix_state) for text causal LMs whose head reads each row's last token;
    every forward priced by `shapes` and slept out."""

    graphs = None  # no graph path: the cost model already is the device's best

    def __init__(
        self,
        model: torch.nn.Module,
        shapes: Shapes,
        pack_tokens: int = 0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.model = model
        self.shapes = shapes
        self.embed = model.get_input_embeddings()
        self.pack_tokens = max(0, pack_tokens)
        self.packing = True
        self.prefix_mode = "kv"
        self._sleep = sleep
        self._clock = clock
        self._busy_until = 0.0  # when the device finishes what was launched so far (the stream's end)
        self._launched = 0.0  # device seconds launched since the last take_device_seconds
        self._lock = threading.Lock()

    # ----- the device ---------------------------------------------------------------------------
    def _run(self, tokens: int, pairs: int) -> None:
        """Launch one forward: it starts when the device has finished what was launched before it."""
        cost = self.shapes.seconds(tokens, pairs)
        with self._lock:
            self._busy_until = max(self._clock(), self._busy_until) + cost
            self._launched += cost

    def completion(self) -> Callable[[], None]:
        """An event after everything launched so far: calling it waits until the device is there."""
        with self._lock:
            until = self._busy_until

        def wait() -> None:
            left = until - self._clock()
            if left > 0:
                self._sleep(left)

        return wait

    def synchronize(self) -> None:
        self.completion()()

    def take_device_seconds(self) -> float:
        """Device seconds of the forwards launched since the last call (the runner reads it once per batch)."""
        with self._lock:
            launched, self._launched = self._launched, 0.0
        return launched

    def _hidden(self, rows) -> torch.Tensor:
        ids = torch.tensor([row[-1] for row in rows], dtype=torch.long)
        return self.embed(ids).float()

    def _state(self, length: int) -> PrefixState:
        """KV of the simulated model's byte size for `length` tokens, as one broadcast (memory-free) key/value pair."""
        half = self.shapes.kv_bytes_per_token // 4  # BF16 elements in the keys (or the values) of one token
        view = torch.zeros(1, dtype=torch.bfloat16).expand(1, 1, length, half)
        return PrefixState(kv=[(view, view)], length=length)

    # ----- the forwards ---------------------------------------------------------------------------
    def whole(self, sequences, capture: bool):
        full = [len(prefix) + len(row) for prefix, row in sequences]
        if len(full) > 1 and self.packing:
            total = sum(full)
            self._run(total, total * total)  # one packed forward, its mask dense over the pack
        else:
            width = max(full)
            self._run(len(full) * width, len(full) * width * width)
        states = [self._state(len(prefix)) for prefix, _ in sequences] if capture else [None] * len(sequences)
        return self._hidden([prefix + row for prefix, row in sequences]), states

    def prefix_state(self, prefix_ids, assets: list) -> PrefixState:
        self._refuse_images(assets)
        n = len(prefix_ids)
        self._run(n, n * n)
        return self._state(n)

    def after(self, pairs):
        rows = [row for _, row in pairs]
        if len(pairs) > 1 and self.packing:
            for pack in packs(pairs, self.pack_tokens):
                kv = sum({id(pairs[s.rows[0]][0]): pairs[s.rows[0]][0].length for s in pack}.values())
                tokens = sum(s.tokens(pairs) for s in pack)
                self._run(tokens, tokens * (kv + tokens))
        else:
            width = max(len(row) for row in rows)
            past = max(state.length for state, _ in pairs)
            self._run(len(rows) * width, len(rows) * width * (past + width))
        return self._hidden(rows)

    def with_images(self, prefix_ids, assets, rows):
        self._refuse_images(assets)

    def sequence(self, ids, assets):
        raise RuntimeError("the simulated device runs rows read at their last token only")

    @staticmethod
    def _refuse_images(assets) -> None:
        if assets:
            raise RuntimeError("the simulated device runs text prompts only")
