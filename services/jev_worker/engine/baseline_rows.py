"""Calibration baselines computed once: an engine around the runner that, for requests carrying baseline rows
(prompt/scored_rows.py ScoredRequest), scores each baseline row the first time it is seen, in the same batch on
the model thread, and keeps its score (BaselineCache, bounded LRU, keyed by the row's baseline key). Every later
request with that question and option reads the kept score: a baseline depends on the question and its options,
never on the state, so it is computed once per question, not once per request.

Each scored row's result becomes [score, baseline score] (FP32), which the option-scoring question types read
(questions/scored.py); a request without baseline rows keeps its one-value rows."""

from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from ..prompt.builder import PreparedRequest
from ..prompt.scored_rows import ScoredRequest
from ..protocols import Engine
from ..scheduling.batch import BatchOutput, EngineItem, EngineResult, PrefixGroup


class BaselineCache:
    """Baseline scores by key, the least recently used dropped past `max_entries`."""

    def __init__(self, max_entries: int = 65536):
        self.max_entries = max_entries
        self._scores: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()
        self.computed = 0  # rows scored so far (each once, unless evicted)

    def get(self, key: str) -> float | None:
        with self._lock:
            score = self._scores.get(key)
            if score is not None:
                self._scores.move_to_end(key)
            return score

    def put(self, key: str, score: float) -> None:
        with self._lock:
            self._scores[key] = score
            self._scores.move_to_end(key)
            self.computed += 1
            while len(self._scores) > self.max_entries:
                self._scores.popitem(last=False)

    def __len__(self) -> int:
        return len(self._scores)

    def describe(self) -> dict:
        return {"entries": len(self), "max_entries": self.max_entries, "rows_computed": self.computed}


class BaselineEngine(Engine):
    """`inner` (the runner) with each batch's uncached baseline rows run beside it, after their own prefix."""

    def __init__(self, inner: Engine, cache: BaselineCache):
        self.inner = inner
        self.cache = cache
        self.reuses_prefix = inner.reuses_prefix

    def measure_reuse(self):
        return self.inner.measure_reuse()

    def describe(self) -> dict:
        return {**self.inner.describe(), "calibration_baseline": self.cache.describe()}

    def run(self, items: list[EngineItem], groups: list[PrefixGroup]) -> BatchOutput:
        missing = self._missing(items)
        extra_items = [EngineItem(prepared) for prepared in missing]
        extra_groups = [PrefixGroup(p.prefix_key, [len(items) + i]) for i, p in enumerate(missing)]
        out = self.inner.run(items + extra_items, groups + extra_groups)
        fresh = {}  # this batch's own, whatever the cache keeps
        for prepared, result in zip(missing, out.results[len(items) :]):
            for key, score in zip(prepared.plan, result.row_logits):
                fresh[key] = float(score[0])
                self.cache.put(key, fresh[key])
        results = [self._with_baseline(item, result, fresh) for item, result in zip(items, out.results)]
        return BatchOutput(results, out.states, out.device_s, out.ready)

    def _missing(self, items: list[EngineItem]) -> list[PreparedRequest]:
        """The batch's baseline rows not cached yet, each once, as one prepared request per baseline prefix (its
        plan: the rows' keys)."""
        by_prefix: dict[str, tuple[PreparedRequest, dict[str, tuple]]] = {}
        for item in items:
            prepared = item.prepared
            if not isinstance(prepared, ScoredRequest) or prepared.baseline is None:
                continue
            baseline = prepared.baseline
            for key, row, labels in zip(prepared.baseline_keys, baseline.rows, baseline.row_labels):
                if self.cache.get(key) is None:
                    by_prefix.setdefault(baseline.prefix_key, (baseline, {}))[1].setdefault(key, (row, labels))
        return [
            PreparedRequest(
                prefix_ids=baseline.prefix_ids,
                rows=tuple(row for row, _ in rows.values()),
                row_labels=tuple(labels for _, labels in rows.values()),
                image_keys=(),
                prefix_key=baseline.prefix_key,
                plan=tuple(rows),
            )
            for baseline, rows in by_prefix.values()
        ]

    def _with_baseline(self, item: EngineItem, result: EngineResult, fresh: dict[str, float]) -> EngineResult:
        prepared = item.prepared
        if not isinstance(prepared, ScoredRequest) or prepared.baseline is None:
            return result
        result.row_logits = [
            torch.stack(
                [score[0].to(torch.float32), torch.tensor(fresh.get(key, self.cache.get(key)), dtype=torch.float32)]
            )
            for score, key in zip(result.row_logits, prepared.baseline_keys)
        ]
        return result
