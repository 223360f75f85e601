"""The numbers of the page's status view, per backend: decisions/s and p50/p99 over the last minute (from the
frontend's own per-backend latency histogram, `jev_frontend_route_request_seconds`), and the L3 hit ratio (from
the worker's `/v1/cache/stats` counters).

Both come from cumulative counters, so a rate needs two readings: every status request takes one (`Reading`),
and `StatusHistory` keeps those of the last `window_s` seconds; the rates are the difference between the newest
and the oldest reading kept. No reading is taken while nobody looks, so the first view has no rates yet (None).
The percentiles are estimated from the histogram's buckets as Prometheus' `histogram_quantile` does: linear
within the bucket that holds the rank.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import Histogram

from jev_common.schema import CacheStats

WINDOW_S = 60.0


@dataclass(frozen=True)
class Latencies:
    """One backend's decision-latency histogram at one moment: cumulative counts per upper bound (+Inf last)."""

    bounds: tuple[float, ...]
    cumulative: tuple[float, ...]

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def since(self, earlier: Latencies | None) -> Latencies:
        """The decisions answered between `earlier` and this reading (all of them when there is no earlier one)."""
        if earlier is None or earlier.bounds != self.bounds:
            return self
        return Latencies(self.bounds, tuple(now - then for now, then in zip(self.cumulative, earlier.cumulative)))

    def quantile(self, q: float) -> float | None:
        """The q-quantile of these latencies in seconds (None when there are none), interpolated within its bucket;
        one in the +Inf bucket reads as the largest finite bound."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        lower, below = 0.0, 0.0
        for bound, cumulative in zip(self.bounds, self.cumulative):
            if cumulative >= rank and cumulative > below:
                if math.isinf(bound):
                    return lower
                return lower + (bound - lower) * (rank - below) / (cumulative - below)
            lower, below = bound, cumulative
        return lower


def latencies_by_backend(histogram: Histogram) -> dict[str, Latencies]:
    """The per-backend histogram (labelled `backend`) read into one `Latencies` per backend URL."""
    buckets: dict[str, list[tuple[float, float]]] = {}
    for family in histogram.collect():
        for sample in family.samples:
            if sample.name.endswith("_bucket"):
                bound = float(sample.labels["le"])
                buckets.setdefault(sample.labels["backend"], []).append((bound, sample.value))
    return {
        url: Latencies(tuple(b for b, _ in sorted(pairs)), tuple(c for _, c in sorted(pairs)))
        for url, pairs in buckets.items()
    }


@dataclass(frozen=True)
class L3Counts:
    hits: int
    misses: int

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    @property
    def hit_ratio(self) -> float | None:
        return self.hits / self.lookups if self.lookups else None

    def since(self, earlier: L3Counts | None) -> L3Counts | None:
        """The lookups between `earlier` and now; None when the counters went back (the worker restarted or its
        counters were reset), since then nothing between the two readings is known."""
        if earlier is None:
            return None
        if self.hits < earlier.hits or self.misses < earlier.misses:
            return None
        return L3Counts(self.hits - earlier.hits, self.misses - earlier.misses)


def l3_counts(stats: CacheStats) -> L3Counts | None:
    """A worker's L3 counters from its cache stats; None when it has no L3 or it is off."""
    level = stats.levels.get("l3")
    if level is None or not level.enabled:
        return None
    return L3Counts(level.hits, level.misses)


@dataclass(frozen=True)
class Reading:
    at: float
    latencies: dict[str, Latencies] = field(default_factory=dict)
    l3: dict[str, L3Counts] = field(default_factory=dict)


@dataclass(frozen=True)
class BackendRates:
    decisions_per_s: float | None  # None: no earlier reading in the window yet
    p50_s: float | None  # None also when no decision was answered in the window
    p99_s: float | None
    l3: dict | None  # None: the worker reports no L3

    def to_json(self) -> dict:
        return {
            "decisions_per_s": _rounded(self.decisions_per_s),
            "p50_s": _rounded(self.p50_s, 4),
            "p99_s": _rounded(self.p99_s, 4),
            "l3": self.l3,
        }


class StatusHistory:
    """The readings of the last `window_s` seconds, and each backend's rates from the newest against the oldest."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        if not window_s > 0:
            raise ValueError(f"window_s must be > 0, got {window_s}")
        self.window_s = window_s
        self.clock = clock
        self._readings: deque[Reading] = deque()

    def record(self, latencies: dict[str, Latencies], l3: dict[str, L3Counts]) -> tuple[Reading, Reading | None]:
        """Keep a reading taken now; returns it and the oldest earlier reading within the window (or None)."""
        now = Reading(self.clock(), latencies, l3)
        while self._readings and now.at - self._readings[0].at > self.window_s:
            self._readings.popleft()
        baseline = self._readings[0] if self._readings else None
        self._readings.append(now)
        return now, baseline

    def rates(self, urls: Iterable[str], now: Reading, baseline: Reading | None) -> dict[str, BackendRates]:
        span = now.at - baseline.at if baseline is not None else 0.0
        out = {}
        for url in urls:
            latencies = now.latencies.get(url)
            recent = latencies.since(baseline.latencies.get(url)) if latencies and baseline else None
            out[url] = BackendRates(
                decisions_per_s=(recent.count if recent else 0.0) / span if baseline is not None and span > 0 else None,
                p50_s=recent.quantile(0.5) if recent else None,
                p99_s=recent.quantile(0.99) if recent else None,
                l3=_l3_json(now.l3.get(url), baseline.l3.get(url) if baseline else None),
            )
        return out

    @property
    def covered_s(self) -> float:
        """How many seconds the kept readings span (at most window_s)."""
        return self._readings[-1].at - self._readings[0].at if len(self._readings) > 1 else 0.0


def _l3_json(now: L3Counts | None, earlier: L3Counts | None) -> dict | None:
    if now is None:
        return None
    recent = now.since(earlier)
    return {
        "hits": now.hits,
        "misses": now.misses,
        "hit_ratio": _rounded(now.hit_ratio, 4),  # since the worker started (or its counters were reset)
        "recent_hit_ratio": _rounded(recent.hit_ratio, 4) if recent else None,  # within the window
    }


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
