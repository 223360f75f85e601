"""Whether continuing a cached prefix state (L3) pays, from costs measured once on the device.

On a CPU a cached prefix saves most of a compute-bound forward. On a GPU a forward is launch-bound, so
assembling a cached state's KV (copying it into the batch, masking its padding) can cost more than
recomputing the prefix in the one forward the row needs anyway: on an H200 an L3 hit was slower than L3
off (p50 83 vs 53 ms). The engine times both paths at start-up and, per request, uses the cached state
only when its measured cost at that prefix length is no higher than recomputing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..settings import REUSE_MODES


@dataclass(frozen=True)
class LinearCost:
    """seconds = fixed_s + per_token_s * prefix tokens, fitted through two measurements."""

    fixed_s: float
    per_token_s: float

    def at(self, tokens: int) -> float:
        return self.fixed_s + self.per_token_s * tokens

    @classmethod
    def through(cls, short: tuple[int, float], long: tuple[int, float]) -> LinearCost:
        (t1, s1), (t2, s2) = short, long
        slope = (s2 - s1) / (t2 - t1) if t2 != t1 else 0.0
        return cls(s1 - slope * t1, slope)


@dataclass(frozen=True)
class ReuseCosts:
    recompute: LinearCost  # the row's forward with its whole prefix recomputed, by prefix tokens
    reuse: LinearCost  # the row's forward after the cached state (KV assembled), by prefix tokens

    def to_dict(self) -> dict:
        return {
            name: {"fixed_ms": round(cost.fixed_s * 1e3, 4), "per_token_us": round(cost.per_token_s * 1e6, 4)}
            for name, cost in (("recompute", self.recompute), ("reuse", self.reuse))
        }


def reuse_pays(prefix_tokens: int, costs: ReuseCosts | None) -> bool:
    """Use a cached prefix state of this length? Always when nothing was measured."""
    return costs is None or costs.reuse.at(prefix_tokens) <= costs.recompute.at(prefix_tokens)


@dataclass
class ReusePolicy:
    """`always`: every L3 hit is used. `measured`: costs are measured at start-up and each hit is used
    only when it pays (until measured, every hit is). `auto`: measured on CUDA, always elsewhere."""

    mode: str = "always"
    costs: ReuseCosts | None = None
    decisions: dict[str, int] = field(default_factory=lambda: {"reuse": 0, "recompute": 0})

    def __post_init__(self):
        if self.mode not in REUSE_MODES:
            raise ValueError(f"L3 reuse policy must be one of {', '.join(REUSE_MODES)}, not {self.mode!r}")

    def resolved(self, device_type: str) -> ReusePolicy:
        if self.mode != "auto":
            return self
        return ReusePolicy("measured" if device_type == "cuda" else "always", self.costs)

    @property
    def measures(self) -> bool:
        return self.mode == "measured"

    def use_cached(self, prefix_tokens: int) -> bool:
        use = not self.measures or reuse_pays(prefix_tokens, self.costs)
        self.decisions["reuse" if use else "recompute"] += 1
        return use

    def describe(self) -> dict:
        out: dict = {"mode": self.mode, "decisions": dict(self.decisions)}
        if self.costs is not None:
            out["costs"] = self.costs.to_dict()
            out["reuse_pays"] = _break_even(self.costs)
        return out


def _break_even(costs: ReuseCosts) -> str:
    """For which prefix lengths reuse pays, in words (for /health): reuse(t) <= recompute(t)."""
    dfixed = costs.reuse.fixed_s - costs.recompute.fixed_s
    dslope = costs.recompute.per_token_s - costs.reuse.per_token_s
    if dslope == 0:
        return "always" if dfixed <= 0 else "never"
    tokens = dfixed / dslope
    if dslope > 0:
        return "always" if tokens <= 0 else f"from {tokens:.0f} prefix tokens"
    return "never" if tokens < 0 else f"up to {tokens:.0f} prefix tokens"
