"""The worker's request path: validate -> (image asset) -> L1 prepare -> schedule -> decide."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from jev_common.cache_index import CacheIndex
from jev_common.errors import ApiError, DomainError, UnsupportedRequestForm, domain_error_type, validation_error
from jev_common.route_key import render_state as route_state_text, state_route_key
from jev_common.schema import (
    LATEST_ALIAS, CacheStats, DecisionRequest, DecisionResponse, SystemOneRequest, SystemOneResponse,
    SystemOneUsage, Usage,
)
from jev_common.vl import checkpoint_identity

from .caches import BudgetLRU
from .engine import DecisionEngine, EngineItem
from . import envelope
from .kinds import decide
from .legacy import l1_key, prepare_legacy
from .loader import LoadedModel
from .metrics import WorkerMetrics
from .prompt import PreparedRequest
from .protocols import PromptBuilder
from .registration import RouteRegistry, WorkerRegistration
from .scheduler import Scheduler
from .serving import Serving, build_serving
from .settings import WorkerSettings

log = logging.getLogger("jev.worker")

WARMUP_REQUEST = SystemOneRequest(
    model=LATEST_ALIAS, state="The lamp is switched on and the room is bright.",
    questions={"on": {"type": "noul", "instructions": "Is the lamp on?"},
               "light": {"type": "choice", "criteria": {"bright": None, "dark": None}},
               "level": {"type": "score", "criteria": ["dark", "dim", "bright"]}},
)


class WorkerService:
    def __init__(self, settings: WorkerSettings, metrics: WorkerMetrics | None = None):
        self.settings = settings
        self.recipe = settings.recipe
        # the recipe's pin, or a content digest of JEV_MODEL_PATH: what image assets and index keys are made for
        self.identity = checkpoint_identity(self.recipe, settings.model_path)
        self.metrics = metrics or WorkerMetrics()
        self.model_executor = ThreadPoolExecutor(1, thread_name_prefix="jev-model")
        self.prep_executor = ThreadPoolExecutor(2, thread_name_prefix="jev-prep")
        self.l1: BudgetLRU[PreparedRequest] = BudgetLRU(
            "l1", settings.cache.l1_max if settings.cache.l1_on else 0, bytes_of=lambda p: p.nbytes)
        self.loaded: LoadedModel | None = None
        self.engine: DecisionEngine | None = None
        self.serving: Serving | None = None  # the recipe's backend + readout (serving.py)
        self.builder: PromptBuilder | None = None
        self.scheduler: Scheduler | None = None
        self.assets = None  # vision.AssetStore on vision-language recipes
        self.vision = None
        self.index: CacheIndex | None = None  # set once the model has loaded
        self.routes = RouteRegistry()  # route keys of resident prefixes, for prefix-aware frontends
        self.registration: WorkerRegistration | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the loop index calls hop to
        self.state = "loading"
        self.error: str | None = None
        self.warmup_seconds: float | None = None
        self.metrics.watch_caches(self.cache_stats)

    # ----- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self.model_executor, self._load)
            self._connect_index(loop)
            self.scheduler = Scheduler(
                self.engine, self.model_executor, max_queue=self.settings.max_queue,
                batching=self.settings.batching, max_batch_rows=self.settings.max_batch_rows,
                max_wait_ms=self.settings.max_wait_ms, on_batch=self.metrics.observe_batch,
                on_depth=self.metrics.queue_depth.set,
            )
            self.scheduler.start()
            started = time.perf_counter()
            await self.systemone(self._warmup_request())
            self.warmup_seconds = time.perf_counter() - started
            self.reset_counters()
            self.state = "ok"
            self.registration = WorkerRegistration(self.index, self._registration_record,
                                                   self.settings.register_ttl_s)
            self.registration.start()
            log.info("ready: %s on %s (warmup %.3f s)", self.recipe.name, self.loaded.device, self.warmup_seconds)
        except Exception as exc:  # noqa: BLE001 - health must say why the worker is not ready
            self.state = "unavailable"
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("worker failed to start")

    def _warmup_request(self) -> SystemOneRequest:
        """The warmup decision, asking only the question types the readout answers."""
        served = self.serving.readout.question_types
        questions = {qid: q for qid, q in WARMUP_REQUEST.questions.items() if q.type in served}
        return WARMUP_REQUEST.model_copy(update={"questions": questions})

    def _load(self) -> None:
        s = self.settings
        if s.threads > 0:
            torch.set_num_threads(s.threads)
        self.serving = build_serving(self.recipe, s.model_path)  # the family's readout and backend, checked
        readout = self.serving.readout
        self.loaded = self.serving.load(s.device, s.dtype)
        tokenizer = self.loaded.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        if self.recipe.model.modality == "vision-language":
            from . import vision

            self.vision = vision
            self.assets = vision.AssetStore(s.asset_dir, None, self.identity,
                                            s.cache.l2_bytes if s.cache.l2_on else 0)
        self.builder = readout.prompt_builder(tokenizer, self.recipe, self.identity)
        readout.load(self.loaded, self.builder)
        self.engine = self.serving.backend.build(
            self.loaded, head=readout.head, l3_bytes=s.cache.l3_bytes if s.cache.l3_on else 0,
            batching=s.batching, max_batch_rows=s.max_batch_rows, pad_id=pad_id, vision=self.vision,
            on_l3_insert=self._prefix_resident, on_l3_evict=self._prefix_evicted,
        )

    def _connect_index(self, loop: asyncio.AbstractEventLoop) -> None:
        self.index = CacheIndex(self.settings.redis_url, self.identity, owner_id=self.settings.worker_id,
                                owner_url=self.settings.worker_url)
        if self.assets is not None:
            self.assets.index = self.index
        self._loop = loop

    def _prefix_resident(self, key: str, state) -> None:
        self._index_call(lambda index: index.register_prefix(key, None, state.length, state.nbytes))
        self._index_call(lambda index: self.routes.resident(index, key))

    def _prefix_evicted(self, key: str, _state) -> None:
        self._index_call(lambda index: index.unregister_prefix(key))
        self._index_call(lambda index: self.routes.evicted(index, key))

    def _registration_record(self) -> dict:
        return {"worker_id": self.settings.worker_id, "url": self.settings.worker_url, "model": self.recipe.name,
                "ns": self.index.ns if self.index else "", "state": self.state,
                "queue_depth": self.scheduler.depth if self.scheduler else 0, "max_queue": self.settings.max_queue}

    def _index_call(self, call) -> None:
        """Called on the model thread; the index is async, so hop to the loop and never wait."""
        index, loop = self.index, self._loop
        if index is None or loop is None:
            return

        def schedule() -> None:
            task = loop.create_task(call(index))
            task.add_done_callback(lambda t: t.exception())  # a down index only degrades, never fails
        loop.call_soon_threadsafe(schedule)

    async def stop(self) -> None:
        if self.registration is not None:  # frontends stop sending here first
            await self.registration.stop()
        if self.scheduler:
            await self.scheduler.stop()
        if self.index is not None:  # no index entry may point at a stopped worker
            await asyncio.gather(self.index.unregister_owner(), return_exceptions=True)
            await self.index.close()
        self.model_executor.shutdown(wait=False, cancel_futures=True)
        self.prep_executor.shutdown(wait=False, cancel_futures=True)

    # ----- decisions ----------------------------------------------------------------------------
    def _timeout(self, deadline_s: float | None) -> float:
        return min(deadline_s or self.settings.deadline_s, self.settings.deadline_s)

    async def _prepared(self, key: str, build) -> tuple[PreparedRequest, str]:
        """L1: the prepared prompt for `key`, built on the prep threads on a miss."""
        prepared = self.l1.get(key)
        level = "hit" if prepared is not None else ("miss" if self.l1.enabled else "off")
        if prepared is None:
            loop = asyncio.get_running_loop()
            try:
                prepared = await loop.run_in_executor(self.prep_executor, build)
            except ValueError as exc:
                raise validation_error(str(exc)) from None
            if prepared.boundary_mismatch:
                self.metrics.prefix_boundary_mismatch.inc()
            self.l1.put(key, prepared)
        return prepared, level

    async def _run(self, item: EngineItem, started: float, timeout: float):
        remaining = timeout - (time.perf_counter() - started)
        if remaining <= 0:
            raise ApiError(504, "deadline_exceeded", "deadline passed while preparing the request")
        return await self.scheduler.submit(item, remaining)

    def _ready(self) -> None:
        if self.scheduler is None:
            raise ApiError(503, "not_ready", "the model is still loading")

    def _cache_header(self, levels: dict[str, str]) -> dict[str, str]:
        return {"x-jev-cache": ",".join(f"{lvl}={levels[lvl]}" for lvl in ("l1", "l2", "l3") if lvl in levels)}

    def _account(self, kind: str, prepared: PreparedRequest, cached: int, elapsed: float) -> None:
        self.metrics.tokens.labels("prompt").inc(prepared.prompt_tokens)
        self.metrics.tokens.labels("cached").inc(cached)
        self.metrics.decision_seconds.labels(kind).observe(elapsed)

    async def _image(self, key: str, levels: dict[str, str]):
        asset, l2_hit = await self.assets.get_by_key(key)
        if self.index is not None and self.settings.cache.l2_on:  # a routing hint: where this image is warm
            task = asyncio.get_running_loop().create_task(self.index.register_l2(key))
            task.add_done_callback(lambda t: t.exception())
        if self.settings.cache.l2_on:
            levels["l2"] = "miss" if levels.get("l2") == "miss" or not l2_hit else "hit"
        else:
            levels["l2"] = "off"
        placeholder = self.vision.image_placeholder(self.loaded.processor or self.loaded.tokenizer, asset)
        return asset, placeholder

    @contextlib.contextmanager
    def _counted(self, kind: str, timeout: float):
        """Counts one decision by outcome (jev_worker_decisions_total); a wait that ran past the
        deadline becomes the API's 504. Yields a one-item list the caller sets to "ok"."""
        outcome = ["error"]
        try:
            yield outcome
        except asyncio.TimeoutError:
            outcome[0] = "deadline_exceeded"
            raise ApiError(504, "deadline_exceeded", f"no decision within {timeout:g} s") from None
        except ApiError as exc:
            outcome[0] = exc.type
            raise
        except DomainError as exc:
            outcome[0] = domain_error_type(exc)
            raise
        finally:
            self.metrics.decisions.labels(kind, outcome[0]).inc()

    def accepts_model(self, name: str) -> bool:
        return name in (self.recipe.name, LATEST_ALIAS)

    async def systemone(self, request: SystemOneRequest, parts: dict[str, bytes] | None = None
                        ) -> tuple[SystemOneResponse, dict[str, str]]:
        """One System One request: every question a row (or rows) after the shared state prefix."""
        self._ready()
        if not self.accepts_model(request.model):
            raise ApiError(400, "api_usage_error", f"model {request.model!r} is not served here; this worker serves "
                           f"{self.recipe.name!r} (also as {LATEST_ALIAS!r}); GET /v1/models lists them")
        started = time.perf_counter()
        timeout = self._timeout(None)
        with self._counted("systemone", timeout) as outcome:
            refs = envelope.image_refs(request, parts or {})
            if refs and self.assets is None:
                raise ApiError(422, "image_not_supported", f"model {self.recipe.name} is text-only; send a text "
                               "state or use a vision-language recipe")
            levels: dict[str, str] = {}
            state_text = envelope.render_state(request)
            envelope.refuse_images_in_questions(request, refs, state_text)
            self.builder.check_user_text(state_text, "state")
            assets, pieces, keys, at = [], [], [], 0
            for start, end, ref in envelope.state_occurrences(state_text, refs):
                asset, placeholder = await asyncio.wait_for(self._image(ref.key, levels), timeout)
                pieces += [state_text[at:start], placeholder]
                assets.append(asset)
                keys.append(ref.key)
                at = end
            state_text = "".join(pieces) + state_text[at:]
            keys = tuple(keys)

            def build() -> PreparedRequest:
                rows, plan = envelope.question_rows(request, self.builder, self.serving.readout.kinds,
                                                    self.serving.readout.name)
                return self.builder.prepare(state_text, rows, keys, plan)

            prepared, levels["l1"] = await asyncio.wait_for(
                self._prepared(envelope.l1_key(request, keys), build), timeout)
            self.routes.note(self.index, prepared.prefix_key,
                             state_route_key(route_state_text(request.state), [r.key for r in refs]))
            result = await self._run(EngineItem(prepared=prepared, assets=assets), started, timeout)
            levels["l3"] = result.l3
            answers = envelope.answers(prepared.plan, result.row_logits, self.builder, self.serving.readout.kinds)
            elapsed = time.perf_counter() - started
            response = SystemOneResponse(
                model=self.recipe.name, answers=answers,
                usage=SystemOneUsage(input_tokens=prepared.prompt_tokens, output_tokens=0),
                x_cached_input_tokens=result.cached_tokens, x_elapsed_seconds=elapsed,
            )
            outcome[0] = "ok"
            self._account("systemone", prepared, result.cached_tokens, elapsed)
            return response, self._cache_header(levels)

    async def decide(self, request: DecisionRequest) -> tuple[DecisionResponse, dict[str, str]]:
        """One request of the single-question form (the JEV-VL worker contract)."""
        self._ready()
        if not self.serving.readout.single_question_form:
            raise UnsupportedRequestForm(
                f"the single-question form (`kind`) is answered by label-token recipes only; "
                f"{self.recipe.name} serves with readout {self.serving.readout.name!r}: send the System One "
                "envelope ({model, state, questions})")
        started = time.perf_counter()
        timeout = self._timeout(request.deadline_s)
        with self._counted(request.kind, timeout) as outcome:
            levels: dict[str, str] = {}
            assets, placeholders, keys = [], [], ()
            if request.state.image is not None:
                if self.assets is None:
                    raise ApiError(422, "image_not_supported", f"recipe {self.recipe.name} is text-only; "
                                   "send state.text or use a vision-language recipe")
                key = self.assets.key_for(request.state.image)
                asset, placeholder = await asyncio.wait_for(self._image(key, levels), timeout)
                assets, placeholders, keys = [asset], [placeholder], (key,)

            def build() -> PreparedRequest:
                return prepare_legacy(self.builder, request, placeholders, keys)

            prepared, levels["l1"] = await asyncio.wait_for(self._prepared(l1_key(request, keys), build), timeout)
            self.routes.note(self.index, prepared.prefix_key, state_route_key(request.state.text or "", keys))
            result = await self._run(EngineItem(prepared=prepared, assets=assets), started, timeout)
            levels["l3"] = result.l3
            fields = decide(prepared.plan, result.row_logits, request.state.text)
            elapsed = time.perf_counter() - started
            response = DecisionResponse(
                request_id=request.request_id, kind=request.kind, model=self.recipe.name,
                usage=Usage(prompt_tokens=prepared.prompt_tokens, cached_tokens=result.cached_tokens),
                elapsed_seconds=elapsed, **fields,
            )
            outcome[0] = "ok"
            self._account(request.kind, prepared, result.cached_tokens, elapsed)
            return response, self._cache_header(levels)

    # ----- caches -------------------------------------------------------------------------------
    def cache_stats(self) -> CacheStats:
        levels = {"l1": self.l1.stats()}
        if self.assets is not None:
            levels["l2"] = self.assets.stats()
        else:
            levels["l2"] = BudgetLRU("l2", 0).stats()
        levels["l3"] = self.engine.l3.stats() if self.engine else BudgetLRU("l3", 0).stats()
        prefix_reuse = self.serving.backend.prefix_reuse if self.serving else None
        return CacheStats(enabled=self.settings.cache.enabled, levels=levels, prefix_reuse=prefix_reuse)

    def reset_counters(self) -> None:
        self.l1.reset_counters()
        if self.engine:
            self.engine.l3.reset_counters()
        if self.assets is not None:
            self.assets.reset_counters()

    async def health(self) -> tuple[int, dict]:
        detail = {"recipe": self.recipe.name, "checkpoint": self.identity, "state": self.state,
                  "worker_id": self.settings.worker_id,
                  "queue_depth": self.scheduler.depth if self.scheduler else 0}
        if self.loaded:
            detail.update(device=str(self.loaded.device), dtype=str(self.loaded.dtype).removeprefix("torch."))
        if self.serving is not None:
            detail["serving"] = self.serving.describe()
        if self.warmup_seconds is not None:
            detail["warmup_seconds"] = round(self.warmup_seconds, 4)
        if self.error:
            detail["error"] = self.error
        status = self.state
        if self.index is not None and self.state == "ok":
            index_health = await self.index.health()
            detail["index"] = index_health
            if index_health.get("status") != "ok":
                status = "degraded"  # text decisions still work; image lookups fall back to files
        code = 200 if self.state == "ok" else 503
        return code, {"status": status, "detail": detail}
