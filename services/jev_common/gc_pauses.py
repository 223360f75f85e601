"""The garbage collector's pauses: a service's start-up heap frozen once it is loaded, and every pause counted.

A full collection walks every object the collector tracks, with the event loop and every thread stopped. A loaded
worker holds a model, a tokenizer and their modules, about 400,000 objects: under load its full collections took
about 250 ms each (sim-7.35b at c=64, Zen 4: five in 15 s, 1.27 s in all), and every request in flight waited them
out. `freeze_heap` (gc.freeze, as vLLM and SGLang do after start-up) moves what start-up made into the permanent
generation, which collections skip: the same full collections then took about 1.3 ms (docs/benchmarks.md, host
overhead). Objects made later are collected as before.

`GcPauses` exposes, per generation, the seconds the collector has paused the process
(`jev_<service>_gc_pause_seconds_total`), its longest pause (`jev_<service>_gc_pause_max_seconds`) and the objects
frozen (`jev_<service>_gc_frozen_objects`). One callback per process times the collections, whatever registry reads it.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

GENERATIONS = (0, 1, 2)


class _Pauses:
    """The collector's pauses since the process started timing them (a gc callback; collections never overlap)."""

    def __init__(self) -> None:
        self.seconds = [0.0 for _ in GENERATIONS]
        self.longest = [0.0 for _ in GENERATIONS]
        self.count = [0 for _ in GENERATIONS]
        self._began = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        generation = info.get("generation", 2)
        paused = time.perf_counter() - self._began
        self.seconds[generation] += paused
        self.count[generation] += 1
        self.longest[generation] = max(self.longest[generation], paused)


_pauses: _Pauses | None = None


def pauses() -> _Pauses:
    """The process's one pause timer, started on first use."""
    global _pauses
    if _pauses is None:
        _pauses = _Pauses()
    return _pauses


def freeze_heap() -> int:
    """Collect once, then freeze everything alive (the loaded model, its modules, the tokenizer) out of the collector's
    walks. -> the objects frozen. Call it once the service is loaded and warm, before it serves."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """A registry's collector of the process's garbage-collector pauses (read at the scrape)."""

    def __init__(self, service: str) -> None:
        self.prefix = f"jev_{service}_gc"
        self._pauses = pauses()

    def describe(self) -> list[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        yield from self._families()

    def _families(self) -> Iterator[Metric]:
        pauses = self._pauses
        total = CounterMetricFamily(
            f"{self.prefix}_pause_seconds",
            "Seconds the garbage collector paused the process, by generation (2: full collections)",
            labels=["generation"],
        )
        longest = GaugeMetricFamily(
            f"{self.prefix}_pause_max_seconds",
            "The garbage collector's longest pause since start, by generation",
            labels=["generation"],
        )
        for generation in GENERATIONS:
            total.add_metric([str(generation)], pauses.seconds[generation])
            longest.add_metric([str(generation)], pauses.longest[generation])
        yield total
        yield longest
        yield GaugeMetricFamily(
            f"{self.prefix}_frozen_objects",
            "Objects frozen out of the garbage collector's walks once the service was loaded (gc.freeze)",
            value=gc.get_freeze_count(),
        )
