"""The worker service: lifecycle, the one request path's front (what is served, deadlines, outcomes), caches,
health. Answering itself is the strategy's (pipeline.py): a model in this process (`LocalPipeline` over
`model.LocalModel`) or the family's own server (`ExternalPipeline`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from jev_common.errors import (
    DeadlineExceeded,
    DomainError,
    ModelNotServed,
    NotReady,
    ShuttingDown,
    Stalled,
    UnsupportedRequestForm,
    domain_error_type,
)
from jev_common.http import CODE_VERSION_HEADER, DEVICE_SECONDS_HEADER, REVISION_HEADER, WORKER_HEADER
from jev_common.index import IndexConnection
from jev_common.index.owners import Owner
from jev_common.schema import (
    LATEST_ALIAS,
    CacheStats,
    DecisionRequest,
    DecisionResponse,
    SystemOneRequest,
    SystemOneResponse,
    SystemOneUsage,
)
from jev_common.timeline import Timeline
from jev_common.version import source_version
from jev_common.vl import checkpoint_identity

from .loading.load_progress import LoadProgress
from .pipeline import Decision, ExternalPipeline, Images, Job, LocalPipeline, Pipeline
from .protocols import ExternalBackend
from .questions import coherence
from .registration import IndexLink, WorkerIndex, WorkerRegistration
from .request import envelope, legacy
from .scheduling.caches import WorkerCaches
from .scheduling.scheduler import Caller
from .serving import Serving, build_serving, serves_externally
from .settings import WorkerSettings
from .telemetry.metrics import WorkerMetrics
from .telemetry.watchdog import Watchdog

if TYPE_CHECKING:  # model.py imports torch: loaded only by a worker that runs the network
    from .model import LocalModel

log = logging.getLogger("jev.worker")

WARMUP_REQUEST = SystemOneRequest.model_validate(
    dict(
        model=LATEST_ALIAS,
        state="The lamp is switched on and the room is bright.",
        questions={
            "on": {"type": "noul", "instructions": "Is the lamp on?"},
            "light": {
                "type": "choice",
                "instructions": "Is the room bright or dark?",
                "criteria": {"bright": None, "dark": None},
            },
            "level": {
                "type": "score",
                "instructions": "How bright is the room?",
                "criteria": ["dark", "dim", "bright"],
            },
        },
    )
)
WARMUP_TIMEOUT_S = 600.0  # the first forward also checks packing and prefix branching once: not a request's deadline


class WorkerService:
    def __init__(
        self,
        settings: WorkerSettings,
        metrics: WorkerMetrics | None = None,
        on_ready: Callable[[], None] | None = None,
    ):
        """`on_ready`: called once loaded and warm, before health says ok."""
        self.settings = settings
        self._on_ready = on_ready
        self.recipe = settings.recipe
        # the recipe's pin, or a content digest of JEV_MODEL_PATH: what image assets and index keys are made for
        self.identity = checkpoint_identity(self.recipe, settings.model_path)
        self.code_version = settings.code_version or source_version()  # named with every answer (_headers)
        self.metrics = metrics or WorkerMetrics(model=self.recipe.name)
        self.metrics.queue_limit.set(settings.max_queue)
        self.index_link = IndexLink(
            WorkerIndex.over(
                IndexConnection(settings.index_url), self.identity, Owner(settings.worker_id, settings.worker_url)
            )
        )
        self.caches = WorkerCaches(
            settings.cache, on_l3_insert=self.index_link.prefix_resident, on_l3_evict=self.index_link.prefix_evicted
        )
        self.serving: Serving | None = None
        self.progress: LoadProgress | None = None  # how far loading a model in this process is
        self.model: LocalModel | None = None  # when the network runs in this process
        self.pipeline: Pipeline | None = None
        self.registration: WorkerRegistration | None = None
        self.state = "loading"
        self.error: str | None = None
        self.warmup_seconds: float | None = None
        self.watchdog: Watchdog | None = None
        self.metrics.watch_caches(self.cache_stats)
        self.metrics.watch_engine(lambda: self.model.engine_paths() if self.model else {})
        self.metrics.watch_index("worker", lambda: self.index_link.index.connection)

    # ----- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            if serves_externally(self.recipe):
                self.serving = build_serving(self.recipe)
                self.pipeline = ExternalPipeline(self.serving.readout, self.serving.backend)
            else:
                from .model import LocalModel

                def known(serving: Serving) -> None:
                    self.serving = serving  # health describes it even when loading fails later

                def on_serving(serving: Serving) -> None:  # on the model thread
                    loop.call_soon_threadsafe(known, serving)

                self.progress = LoadProgress()
                model = await LocalModel.open(
                    self.settings,
                    self.identity,
                    self.metrics,
                    self.caches,
                    self.index_link.index.assets,
                    self.progress,
                    on_serving,
                )
                self.model, self.serving = model, model.serving
                self.metrics.device_info.labels(model.device).set(1)
                self.watchdog = Watchdog(
                    self.settings.stall_s,
                    lambda: model.scheduler.running,
                    lambda: model.checks.last_progress,
                    self.metrics,
                )
                self.watchdog.start()
            self.index_link.bind(loop)
            if self.model is not None:
                self.pipeline = self._local_pipeline(self.model)
                warmup = self.serving.readout.warmup_request(WARMUP_REQUEST)
                if warmup is not None:  # None: the readout answers nothing without the caller's data
                    started = time.perf_counter()
                    await self.systemone(warmup, timeout_s=WARMUP_TIMEOUT_S)
                    self.warmup_seconds = time.perf_counter() - started
                self.reset_counters()
            if self._on_ready is not None:
                self._on_ready()
            self.state = "ok"
            index = self.index_link.index
            self.registration = WorkerRegistration(
                index.directory, index.routes, self._registration_record, self.settings.register_ttl_s
            )
            self.registration.start()
            warmed = "no warmup decision" if self.warmup_seconds is None else f"warmup {self.warmup_seconds:.3f} s"
            log.info(
                "ready: %s%s", self.recipe.name, f" on {self.model.loaded.device} ({warmed})" if self.model else ""
            )
        except Exception as exc:  # noqa: BLE001 - health must say why the worker is not ready
            self.state = "unavailable"
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("worker failed to start")

    def _local_pipeline(self, model: LocalModel) -> LocalPipeline:
        store = model.assets
        images = None
        if store is not None:
            images = Images(store, model.image_placeholder, self.settings.cache.l2_on)
        return LocalPipeline(
            self.recipe.name,
            model.readout,
            model.builder,
            model.bounds,
            model.scheduler,
            images,
            self.caches.l1,
            self.index_link,
            self.metrics,
        )

    def _registration_record(self) -> dict:
        return {
            "worker_id": self.settings.worker_id,
            "url": self.settings.worker_url,
            "model": self.recipe.name,
            "ns": self.index_link.index.ns,
            "state": self.state,
            "queue_depth": self.depth,
            "max_queue": self.settings.max_queue,
        }

    async def drain(self, grace_s: float) -> None:
        """On SIGTERM: take no new work (503 with Retry-After: another replica may answer), let running decisions
        finish for up to `grace_s`, then answer the rest 503 and stop their forward at its next layer."""
        if self.state == "stopping":
            return
        self.state = "stopping"
        log.info("stopping: new requests are refused; %d running, %.3g s to finish", self.depth, grace_s)
        if self.registration is not None:  # frontends that discover workers stop sending here
            await self.registration.stop()
            self.registration = None
        if self.model is None:
            return
        scheduler = self.model.scheduler
        loop = asyncio.get_running_loop()
        until = loop.time() + grace_s
        while scheduler.depth and loop.time() < until:
            await asyncio.sleep(0.02)
        if scheduler.depth:
            log.warning(
                "stopping: %d decisions still running after %.3g s: answered 503, forward stopped",
                scheduler.depth,
                grace_s,
            )
        scheduler.abort()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(scheduler.idle(), timeout=max(1.0, grace_s))

    async def stop(self) -> None:
        if self.watchdog is not None:
            await self.watchdog.stop()
        if self.registration is not None:  # frontends stop sending here first
            await self.registration.stop()
        if self.model is not None:
            await self.model.stop()
        if isinstance(self.pipeline, LocalPipeline):
            self.pipeline.close()
        index = self.index_link.index  # no index entry may point at a stopped worker
        await asyncio.gather(index.unregister_owner(), return_exceptions=True)
        await index.close()
        if self.model is None and self.serving is not None and isinstance(self.serving.backend, ExternalBackend):
            await self.serving.backend.close()

    # ----- the request path ---------------------------------------------------------------------
    def accepts_model(self, name: str | None) -> bool:
        return name is None or name in (self.recipe.name, LATEST_ALIAS)

    def _admit(self, model: str | None, single_question: bool) -> Serving:
        """A request this worker answers now: ready, its model, its form. Returns what serves it."""
        if self.state == "stopping":
            raise ShuttingDown("worker is shutting down; retry on another replica")
        if self.pipeline is None or self.serving is None or self.state == "unavailable":
            raise NotReady(
                "the model is still loading"
                if self.state == "loading"
                else f"worker is {self.state}" + (f": {self.error}" if self.error else "")
            )
        if not self.accepts_model(model):
            raise ModelNotServed(
                f"model {model!r} is not served here; this worker serves {self.recipe.name!r} "
                f"(also as {LATEST_ALIAS!r}); GET /v1/models lists them"
            )
        serving = self.serving
        if single_question and not serving.readout.single_question_form:
            raise UnsupportedRequestForm(
                f"the single-question form (`kind`) is answered by label-token and JEV-VL recipes only; "
                f"{self.recipe.name} serves with readout {serving.readout.name!r}: send the System One envelope "
                "({model, state, questions})"
            )
        return serving

    async def run(
        self,
        label: str,
        make_job: Callable[[], Job],
        deadline_s: float | None = None,
        timeout_s: float | None = None,
        caller: Caller = Caller(),
        timeline: Timeline | None = None,
    ) -> tuple[Decision, float]:
        """The one path: the job made from its request, answered by the strategy within the deadline (the
        caller's `deadline_s` when it sent one, up to JEV_MAX_DEADLINE_S, else the worker's JEV_DEADLINE_S;
        `timeout_s` replaces both), counted by outcome (jev_worker_decisions_total{kind=label}). Returns the
        decision and the seconds it took."""
        started = time.perf_counter()
        timeout = timeout_s or min(deadline_s or self.settings.deadline_s, self.settings.max_deadline_s)
        pipeline = self.pipeline
        if pipeline is None:  # admitted work has one; a caller that skipped admission does not
            raise NotReady("the model is still loading")
        with self._counted(label, timeout):
            decision = await pipeline.answer(make_job(), started, timeout, caller, timeline)
        return decision, time.perf_counter() - started

    @contextlib.contextmanager
    def _counted(self, label: str, timeout: float):
        """Counts one decision by outcome (jev_worker_decisions_total) and an answered one's latency
        (jev_worker_decision_seconds); a wait that ran past the deadline becomes DeadlineExceeded."""
        outcome, started = "error", time.perf_counter()
        try:
            yield
            outcome = "ok"
        except TimeoutError:
            outcome = "deadline_exceeded"
            raise DeadlineExceeded(f"no decision within {timeout:g} s") from None
        except DomainError as exc:
            outcome = domain_error_type(exc)
            raise
        finally:
            answered = time.perf_counter() - started if outcome == "ok" else None
            self.metrics.observe_decision(label, outcome, answered)

    async def systemone(
        self,
        request: SystemOneRequest,
        parts: dict[str, bytes] | None = None,
        *,
        timeout_s: float | None = None,
        deadline_s: float | None = None,
        caller: Caller = Caller(),
        timeline: Timeline | None = None,
    ) -> tuple[SystemOneResponse, dict[str, str]]:
        """One System One request: every question a row (or rows) after the shared state prefix."""
        render = self._admit(request.model, single_question=False).readout.envelope_state
        decision, elapsed = await self.run(
            "systemone",
            lambda: envelope.job(request, parts or {}, render),
            deadline_s=deadline_s,
            timeout_s=timeout_s,
            caller=caller,
            timeline=timeline,
        )
        usage = (
            decision.usage
            if decision.usage is not None
            else SystemOneUsage(input_tokens=decision.prompt_tokens, output_tokens=0)
        )
        extra = {} if decision.usage is not None else {"x_cached_input_tokens": decision.cached_tokens}
        response = SystemOneResponse(
            model=self.recipe.name, answers=decision.answers, usage=usage, x_elapsed_seconds=elapsed, **extra
        )
        return response, self._headers(decision)

    def _headers(self, decision: Decision) -> dict[str, str]:
        """The decision's cache outcomes (x-jev-cache), which worker answered (x-jev-worker: its JEV_WORKER_ID) and
        what answered it (x-jev-revision: the checkpoint's identity, x-jev-code-version), passed through by the
        frontend: a changed answer can be traced to a changed model or code."""
        headers = {
            **decision.headers(),
            WORKER_HEADER: self.settings.worker_id,
            REVISION_HEADER: self.identity,
            CODE_VERSION_HEADER: self.code_version,
        }
        if self.settings.benchmark and decision.device_s is not None:  # a benchmark subtracts the device's wait
            headers[DEVICE_SECONDS_HEADER] = f"{decision.device_s:.6f}"
        return headers

    async def decide(
        self,
        request: DecisionRequest,
        *,
        caller: Caller = Caller(),
        deadline_s: float | None = None,
        timeline: Timeline | None = None,
    ) -> tuple[DecisionResponse, dict[str, str]]:
        """One request of the single-question form (the JEV-VL worker contract); its body's `deadline_s`
        (upstream's field) and the deadline header: the shorter wins."""
        form = self._admit(None, single_question=True).readout.single_question(self.recipe)

        def make_job() -> Job:
            assets = self.model.assets if self.model is not None else None
            return form.job(request, assets.key_for if assets is not None else None)

        deadlines = [d for d in (request.deadline_s, deadline_s) if d is not None]
        decision, elapsed = await self.run(
            request.kind, make_job, min(deadlines) if deadlines else None, caller=caller, timeline=timeline
        )
        fields = form.fields(request, decision.answers[legacy.QID])
        return (
            legacy.response(request, self.recipe.name, fields, decision.prompt_tokens, decision.cached_tokens, elapsed),
            self._headers(decision),
        )

    # ----- queue ---------------------------------------------------------------------------------
    @property
    def depth(self) -> int:
        return self.model.depth if self.model else 0

    # ----- caches -------------------------------------------------------------------------------
    def cache_stats(self) -> CacheStats:
        levels = self.caches.stats()
        prefix_reuse = self.serving.backend.prefix_reuse if self.serving else None
        return CacheStats(enabled=self.settings.cache.enabled, levels=levels, prefix_reuse=prefix_reuse)

    def reset_counters(self) -> None:
        self.caches.reset_counters()
        if self.model is not None and self.model.assets is not None:
            self.model.assets.reset_counters()  # and its index and disk counters

    # ----- health -------------------------------------------------------------------------------
    async def health(self) -> tuple[str, dict, DomainError | None]:
        """(status word, detail, why the worker is not ready: None while it is), for jev_common.health."""
        detail = {
            "recipe": self.recipe.name,
            "checkpoint": self.identity,
            "state": self.state,
            "worker_id": self.settings.worker_id,
            "queue_depth": self.depth,
        }
        if self.state == "loading" and self.progress is not None:
            detail["stage"] = self.progress.describe()  # how far loading is
        if self.model is not None:
            detail.update(self.model.describe())
        if self.serving is not None:
            detail["serving"] = self.serving.describe()
        if self.warmup_seconds is not None:
            detail["warmup_seconds"] = round(self.warmup_seconds, 4)
        if self.error:
            detail["error"] = self.error
        status, ready = self.state, self.state == "ok"
        if self.state == "ok":
            index_health = await self.index_link.index.connection.health(self.index_link.index.ns)
            detail["index"] = index_health
            if index_health.get("status") != "ok":
                status = "degraded"  # text decisions still work; image lookups fall back to files
        if self.state == "ok" and self.model is None:
            ready, status = await self._external_health(detail, ready, status)
        stalled = self.stalled()
        if stalled and self.state == "ok":
            detail["error"] = f"stalled: {stalled}"
            ready, status = False, "stalled"
        if ready:
            return status, detail, None
        message = f"worker is {status}" + (f": {detail['error']}" if detail.get("error") else "")
        return status, detail, Stalled(message) if status == "stalled" else NotReady(message)

    def coherence(self) -> tuple[list[str] | None, dict | None]:
        """The x_coherence modes this model accepts, and how each question type with an option order answers them
        (questions/coherence.py; None until the readout is known)."""
        if self.serving is None:
            return None, None
        kinds = self.serving.readout.kinds
        return coherence.offered(kinds), coherence.entries(kinds)

    def readout_name(self) -> str | None:
        """The readout that answers (GET /v1/models' x_readout; None until it is known)."""
        return self.serving.readout.name if self.serving is not None else None

    def stalled(self) -> str | None:
        """Why the worker makes no progress (a batch with no layer done for JEV_STALL_S, a blocked loop), or None."""
        return self.watchdog.problem() if self.watchdog is not None else None

    async def _external_health(self, detail: dict, ready: bool, status: str) -> tuple[bool, str]:
        """The family's own server's health is the worker's (503 naming it while it, or a server it needs
        such as CLM's embeddings server, is down)."""
        backend = self.serving.backend if self.serving is not None else None
        if not isinstance(backend, ExternalBackend):
            return ready, status
        reachable, remote = await backend.health()
        detail["external"] = remote
        problem = None if reachable else remote
        if reachable and isinstance(remote, dict) and remote.get("embedder") is False:
            problem = f"{backend.endpoint} reports its embeddings server down (embedder: false)"
        if problem is None:
            return ready, status
        detail["error"] = f"external server: {problem}"
        return False, "unavailable"
