"""Worker metrics: decision latency, forward time, queue depth, batch sizes, cache counters, tokens."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from jev_common.metrics import LATENCY_BUCKETS, HttpMetrics, LoopHistogram
from jev_common.timeline import Timeline

STAGE_BUCKETS = (2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10)


class WorkerMetrics(HttpMetrics):
    """Every series carries `model` (the recipe served) when one is given, so per-model rules and dashboards need
    no target labels (deploy/prometheus/jev-rules.yml)."""

    def __init__(self, model: str = ""):
        super().__init__("worker", labels={"model": model} if model else None)
        r = self.registry
        self.decision_seconds = LoopHistogram(
            "jev_worker_decision_seconds", "Decision latency by kind", ["kind"], LATENCY_BUCKETS, r
        )
        self.decisions = Counter(
            "jev_worker_decisions_total", "Decisions by kind and outcome", ["kind", "outcome"], registry=r
        )
        self.forward_seconds = Histogram(
            "jev_worker_forward_seconds", "Model time per batch", buckets=LATENCY_BUCKETS, registry=r
        )
        self.batch_requests = Histogram(
            "jev_worker_batch_requests", "Requests per model batch", buckets=(1, 2, 4, 8, 16, 32, 64), registry=r
        )
        self.batch_rows = Histogram(
            "jev_worker_batch_rows", "Rows per model batch", buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r
        )
        self.queue_depth = Gauge("jev_worker_queue_depth", "Requests queued or running", registry=r)
        self.queue_limit = Gauge(
            "jev_worker_queue_limit", "JEV_MAX_QUEUE: the queue depth past which requests are refused (429)", registry=r
        )
        self.tokens = Counter("jev_worker_tokens_total", "Prompt tokens by source", ["source"], registry=r)
        self.prefix_boundary_mismatch = Counter(
            "jev_worker_prefix_boundary_mismatch_total",
            "Prepared requests whose rows disagreed on the state prefix's last tokens (prefix shortened "
            "to their common tokens; answers stay exact, L3 reuse may drop)",
            registry=r,
        )
        self.abandoned_batches = Counter(
            "jev_worker_abandoned_batches_total",
            "Batches stopped between two layers because no job in them was wanted any more (deadline passed, "
            "client gone, or shutting down)",
            registry=r,
        )
        self.abandoned_rows = Counter("jev_worker_abandoned_rows_total", "Rows of the stopped batches", registry=r)
        self.abandoned_layers = Counter(
            "jev_worker_abandoned_layers_total",
            "Layer passes the stopped batches did not run: compute freed for the requests behind them",
            registry=r,
        )
        self.flight = Counter(
            "jev_worker_flight_rows_total",
            "Rows by what became of them: computed (a batch finished) = answered (a waiter got them) + unwanted "
            "(finished for nobody: the caller left after its batch began, the batch running on for the others in "
            "it); joined (a request joined identical work in flight), kept (a retry answered from unwanted work "
            "while it lingered), client_limited (refused: the client's limit of work in flight)",
            ["event"],
            registry=r,
        )
        self.stalled = Gauge(
            "jev_worker_stalled",
            "1 while health reports a stall (no layer or chunk finished for "
            "JEV_STALL_S while a batch runs, or the event loop blocked)",
            registry=r,
        )
        self.progress_age = Gauge(
            "jev_worker_progress_age_seconds",
            "Seconds since the running batch last finished a layer or chunk (0 when idle)",
            registry=r,
        )
        self.stage_seconds = LoopHistogram(
            "jev_worker_stage_seconds",
            "Where a decision's time goes, by stage, back to back: parse (body read, decompressed, validated), "
            "asset (an image's asset looked up: L2, the index, the asset folder), prepare (admission, the job, the "
            "prompt built or taken from L1, bounds), queue (waiting for its batch "
            "to start on the model thread), batch (the batch planned against L3; on a simulated device also the "
            "runner's host work), device (the forwards: a simulated device's wait, else the runner's whole run), "
            "readout (from the model thread's end to the typed answers), respond (the response built)",
            ["stage"],
            STAGE_BUCKETS,
            r,
        )
        self.device_seconds = Counter(
            "jev_worker_device_seconds",
            "Seconds the device was busy with batches (a simulated device's waits, else each batch's run on the model "
            "thread): its rate is the device's busy fraction",
            registry=r,
        )
        self.device_info = Gauge(
            "jev_worker_device_info",
            "1 for the device the forwards run on (`simulated`: benchmarks)",
            ["device"],
            registry=r,
        )
        self.loop_lag = Gauge(
            "jev_worker_event_loop_lag_seconds", "The event loop's latest lag behind its heartbeat", registry=r
        )
        self._decided: dict[tuple[str, str], Counter] = {}
        self._flights: dict[str, Counter] = {}
        self._prompt_tokens = self.tokens.labels("prompt")
        self._cached_tokens = self.tokens.labels("cached")
        self._cache_source = None
        self._engine_source = None
        r.register(self)  # collect() below exports the caches' own counters

    def observe_batch(self, requests: int, rows: int, seconds: float, device_s: float | None = None) -> None:
        self.batch_requests.observe(requests)
        self.batch_rows.observe(rows)
        self.forward_seconds.observe(seconds)
        self.device_seconds.inc(device_s if device_s is not None else seconds)

    def observe_stages(self, timeline: Timeline) -> None:
        observe = self.stage_seconds.observe
        for stage in timeline.stages:
            observe((stage.name,), stage.seconds)

    def observe_decision(self, kind: str, outcome: str, seconds: float | None) -> None:
        """One decision by kind and outcome, and its latency when it was answered."""
        counter = self._decided.get((kind, outcome))
        if counter is None:
            counter = self._decided[(kind, outcome)] = self.decisions.labels(kind, outcome)
        counter.inc()
        if seconds is not None:
            self.decision_seconds.observe((kind,), seconds)

    def count_tokens(self, prompt: int, cached: int) -> None:
        self._prompt_tokens.inc(prompt)
        self._cached_tokens.inc(cached)

    def observe_abandoned(self, rows: int, stopped) -> None:
        """A batch stopped before layer `stopped.layer` of `stopped.layers` (abandon.ForwardAbandoned)."""
        self.abandoned_batches.inc()
        self.abandoned_rows.inc(rows)
        self.abandoned_layers.inc(stopped.layers - stopped.layer)

    def observe_flight(self, event: str, rows: int) -> None:
        counter = self._flights.get(event)
        if counter is None:
            counter = self._flights[event] = self.flight.labels(event)
        counter.inc(rows)

    def watch_caches(self, source) -> None:
        """source() -> jev_common.schema.CacheStats"""
        self._cache_source = source

    def watch_engine(self, source) -> None:
        """source() -> the engine's describe() (graphs and l3_reuse counters), {} before it is built"""
        self._engine_source = source

    def describe(self):
        return []

    def collect(self):
        yield from self._engine_families()
        if self._cache_source is None:
            return
        stats = self._cache_source()
        families = {
            "hits": CounterMetricFamily("jev_worker_cache_hits", "Cache hits by level", labels=["level"]),
            "misses": CounterMetricFamily("jev_worker_cache_misses", "Cache misses by level", labels=["level"]),
            "evictions": CounterMetricFamily("jev_worker_cache_evictions", "Cache evictions", labels=["level"]),
        }
        resident = GaugeMetricFamily("jev_worker_cache_resident_bytes", "Resident bytes by level", labels=["level"])
        entries = GaugeMetricFamily("jev_worker_cache_resident_entries", "Resident entries by level", labels=["level"])
        for level, s in stats.levels.items():
            families["hits"].add_metric([level], s.hits)
            families["misses"].add_metric([level], s.misses)
            families["evictions"].add_metric([level], s.evictions)
            resident.add_metric([level], s.resident_bytes)
            entries.add_metric([level], s.resident_entries)
        yield from families.values()
        yield resident
        yield entries

    def _engine_families(self):
        engine = self._engine_source() if self._engine_source is not None else {}
        graphs = engine.get("graphs")
        if graphs is not None:
            replays = CounterMetricFamily(
                "jev_worker_graph_replays",
                "Forwards replayed from a captured graph (or its static-buffer program without capture)",
            )
            replays.add_metric([], graphs["replays"])
            fallbacks = CounterMetricFamily(
                "jev_worker_graph_fallbacks",
                "Forwards that fit no graph bucket and ran eagerly, by reason",
                labels=["reason"],
            )
            for reason, count in sorted(graphs["fallbacks"].items()):
                fallbacks.add_metric([reason], count)
            yield replays
            yield fallbacks
        reuse = engine.get("l3_reuse")
        if reuse is not None:
            decisions = CounterMetricFamily(
                "jev_worker_l3_reuse_decisions",
                "L3 hits used (reuse) or not (recompute: the measured policy found recomputing cheaper)",
                labels=["decision"],
            )
            for decision, count in sorted(reuse["decisions"].items()):
                decisions.add_metric([decision], count)
            yield decisions
