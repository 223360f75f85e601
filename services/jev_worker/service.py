"""The worker's request path: validate -> (image asset) -> L1 prepare -> schedule -> decide."""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from jev_common.cache_index import CacheIndex
from jev_common.errors import ApiError
from jev_common.schema import CacheStats, DecisionRequest, DecisionResponse, Usage
from jev_common.vl import checkpoint_identity

from .caches import BudgetLRU
from .engine import DecisionEngine, EngineItem
from .kinds import decide
from .loader import LoadedModel, load_model
from .metrics import WorkerMetrics
from .prompt import PreparedRequest, PromptBuilder, l1_key
from .scheduler import Scheduler
from .settings import WorkerSettings

log = logging.getLogger("jev.worker")

WARMUP_REQUEST = DecisionRequest(
    kind="choice", state={"text": "The lamp is switched on and the room is bright."},
    question="Is the lamp on?", options=["yes", "no"],
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
        self.builder: PromptBuilder | None = None
        self.scheduler: Scheduler | None = None
        self.assets = None  # vision.AssetStore on vision-language recipes
        self.vision = None
        self.index: CacheIndex | None = None  # set once the model has loaded
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
            await self.decide(WARMUP_REQUEST)
            self.warmup_seconds = time.perf_counter() - started
            self.reset_counters()
            self.state = "ok"
            log.info("ready: %s on %s (warmup %.3f s)", self.recipe.name, self.loaded.device, self.warmup_seconds)
        except Exception as exc:  # noqa: BLE001 - health must say why the worker is not ready
            self.state = "unavailable"
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("worker failed to start")

    def _load(self) -> None:
        s = self.settings
        if s.threads > 0:
            torch.set_num_threads(s.threads)
        self.loaded = load_model(self.recipe, s.model_path, s.device, s.dtype)
        tokenizer = self.loaded.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        if self.recipe.model.modality == "vision-language":
            from . import vision

            self.vision = vision
            self.assets = vision.AssetStore(s.asset_dir, None, self.identity,
                                            s.cache.l2_bytes if s.cache.l2_on else 0)
        self.engine = DecisionEngine(
            self.loaded.model, self.loaded.device, l3_bytes=s.cache.l3_bytes if s.cache.l3_on else 0,
            batching=s.batching, max_batch_rows=s.max_batch_rows, pad_id=pad_id, vision=self.vision,
            checkpoint_dir=self.loaded.folder,
            on_l3_insert=self._prefix_resident, on_l3_evict=self._prefix_evicted,
        )
        self.builder = PromptBuilder(tokenizer, self.recipe, self.identity)

    def _connect_index(self, loop: asyncio.AbstractEventLoop) -> None:
        self.index = CacheIndex(self.settings.redis_url, self.identity, owner_id=self.settings.worker_id,
                                owner_url=self.settings.worker_url)
        if self.assets is not None:
            self.assets.index = self.index
        self._loop = loop

    def _prefix_resident(self, key: str, state) -> None:
        self._index_call(lambda index: index.register_prefix(key, None, state.length, state.nbytes))

    def _prefix_evicted(self, key: str, _state) -> None:
        self._index_call(lambda index: index.unregister_prefix(key))

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
        if self.scheduler:
            await self.scheduler.stop()
        if self.index is not None:  # no index entry may point at a stopped worker
            await asyncio.gather(self.index.unregister_owner(), return_exceptions=True)
            await self.index.close()
        self.model_executor.shutdown(wait=False, cancel_futures=True)
        self.prep_executor.shutdown(wait=False, cancel_futures=True)

    # ----- decisions ----------------------------------------------------------------------------
    async def _prepare(self, request: DecisionRequest) -> tuple[EngineItem, dict[str, str]]:
        levels: dict[str, str] = {}
        assets, placeholders, keys = [], [], ()
        if request.state.image is not None:
            if self.assets is None:
                raise ApiError(422, "image_not_supported", f"recipe {self.recipe.name} is text-only; "
                               "send state.text or use a vision-language recipe")
            asset, l2_hit = await self.assets.get(request.state.image)
            levels["l2"] = ("hit" if l2_hit else "miss") if self.settings.cache.l2_on else "off"
            assets = [asset]
            placeholders = [self.vision.image_placeholder(self.loaded.processor or self.loaded.tokenizer, asset)]
            keys = (asset.key,)
        key = l1_key(request, keys)
        prepared = self.l1.get(key)
        levels["l1"] = "hit" if prepared is not None else ("miss" if self.l1.enabled else "off")
        if prepared is None:
            loop = asyncio.get_running_loop()
            try:
                prepared = await loop.run_in_executor(self.prep_executor, self.builder.prepare, request,
                                                      placeholders, keys)
            except ValueError as exc:
                raise ApiError(422, "validation_error", str(exc)) from None
            self.l1.put(key, prepared)
        return EngineItem(prepared=prepared, assets=assets), levels

    async def decide(self, request: DecisionRequest) -> tuple[DecisionResponse, dict[str, str]]:
        if self.scheduler is None:
            raise ApiError(503, "not_ready", "the model is still loading")
        started = time.perf_counter()
        timeout = min(request.deadline_s or self.settings.deadline_s, self.settings.deadline_s)
        outcome = "error"
        try:
            item, levels = await asyncio.wait_for(self._prepare(request), timeout)
            remaining = timeout - (time.perf_counter() - started)
            if remaining <= 0:
                raise ApiError(504, "deadline_exceeded", "deadline passed while preparing the request")
            result = await self.scheduler.submit(item, remaining)
            levels["l3"] = result.l3
            fields = decide(item.prepared, result.row_logits, request.state.text)
            elapsed = time.perf_counter() - started
            response = DecisionResponse(
                request_id=request.request_id, kind=request.kind, model=self.recipe.name,
                usage=Usage(prompt_tokens=item.prepared.prompt_tokens, cached_tokens=result.cached_tokens),
                elapsed_seconds=elapsed, **fields,
            )
            outcome = "ok"
            self.metrics.tokens.labels("prompt").inc(item.prepared.prompt_tokens)
            self.metrics.tokens.labels("cached").inc(result.cached_tokens)
            self.metrics.decision_seconds.labels(request.kind).observe(elapsed)
            order = ("l1", "l2", "l3")
            header = ",".join(f"{lvl}={levels[lvl]}" for lvl in order if lvl in levels)
            return response, {"x-jev-cache": header}
        except asyncio.TimeoutError:
            raise ApiError(504, "deadline_exceeded", f"no decision within {timeout:g} s") from None
        except ApiError as exc:
            outcome = exc.type
            raise
        finally:
            self.metrics.decisions.labels(request.kind, outcome).inc()

    # ----- caches -------------------------------------------------------------------------------
    def cache_stats(self) -> CacheStats:
        levels = {"l1": self.l1.stats()}
        if self.assets is not None:
            levels["l2"] = self.assets.stats()
        else:
            levels["l2"] = BudgetLRU("l2", 0).stats()
        levels["l3"] = self.engine.l3.stats() if self.engine else BudgetLRU("l3", 0).stats()
        return CacheStats(enabled=self.settings.cache.enabled, levels=levels)

    def reset_counters(self) -> None:
        self.l1.reset_counters()
        if self.engine:
            self.engine.l3.reset_counters()
        if self.assets is not None:
            self.assets.reset_counters()

    async def health(self) -> tuple[int, dict]:
        detail = {"recipe": self.recipe.name, "checkpoint": self.identity, "state": self.state}
        if self.loaded:
            detail.update(device=str(self.loaded.device), dtype=str(self.loaded.dtype).removeprefix("torch."))
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
