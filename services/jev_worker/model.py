"""A recipe's model in this process: its readout and backend (serving.py), the checkpoint loaded on the one
model thread, the prompt builder, the runner that runs batches, the scheduler in front of it (it owns L3, the prefix
cache), and the image assets (L2) of vision-language recipes.

Loading makes the parts (`load_parts`, on the model thread), then `LocalModel` is made from them, complete:
`LocalModel.open` does both."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch

from jev_common.assets import ImageAsset
from jev_common.checkpoint_files import ServingError
from jev_common.cpu import compute_threads
from jev_common.index.assets import AssetIndex

from .engine import kernels
from .engine.graphs import capture_for
from .engine.runner import ModelRunner
from .engine.simulated import SHAPES
from .loading.load_progress import MEASURE_REUSE, LoadProgress
from .loading.loader import LoadedModel, pick_device
from .prompt.bounds import PromptBounds
from .protocols import Engine, PromptBuilder, Readout
from .scheduling.abandon import LayerChecks
from .scheduling.caches import WorkerCaches
from .scheduling.prefix_cache import L3PrefixCache
from .scheduling.reuse import ReuseCosts, ReusePolicy
from .scheduling.scheduler import Scheduler
from .serving import Serving, build_serving
from .settings import WorkerSettings
from .telemetry.metrics import WorkerMetrics

if TYPE_CHECKING:
    from .loading.vision import AssetStore

log = logging.getLogger("jev.worker.model")


@dataclass(frozen=True)
class LoadedParts:
    """What loading a recipe's checkpoint makes, on the model thread (`load_parts`)."""

    serving: Serving  # the family's readout and backend, checked against the checkpoint
    loaded: LoadedModel
    kernels: dict[str, Any]  # kernels.describe() of the loaded model (hybrid layers only)
    builder: PromptBuilder
    engine: Engine  # the runner (runner.py), or a backend's own Engine
    prefix_cache: L3PrefixCache  # L3, owned by the scheduler
    bounds: PromptBounds  # the longest prompt the model reads (bounds.py)
    vision: ModuleType | None  # loading.vision, on vision-language recipes
    assets: AssetStore | None  # on vision-language recipes (L2)


def load_parts(
    settings: WorkerSettings,
    identity: str,
    caches: WorkerCaches,
    asset_index: AssetIndex | None,
    progress: LoadProgress,
    on_serving: Callable[[Serving], None],
) -> LoadedParts:
    """The recipe's checkpoint loaded and its parts built (blocking: run it on the model thread). `on_serving` hears
    of the checked readout and backend as soon as they are known, so health can describe them if loading fails."""
    s = settings
    recipe = s.recipe
    torch.set_num_threads(compute_threads(s.threads))
    simulated = SHAPES[s.simulated_shapes] if s.device == "simulated" else None
    load_device = "cpu" if simulated is not None else s.device  # a simulated device's checkpoint: tokenizer, head
    device = pick_device(load_device)
    reuse = ReusePolicy(s.l3_reuse).resolved(device.type)
    if not reuse.measures:  # known before the first step, so the counter counts only the steps that run
        progress.skip(MEASURE_REUSE)
    progress.enter("checking the checkpoint")
    serving = build_serving(recipe, s.model_path)
    on_serving(serving)
    readout = serving.readout
    l3 = caches.size_l3(serving.backend)
    if not l3.enabled:
        progress.skip(MEASURE_REUSE)
    progress.enter("loading the weights", f"from {serving.folder}")
    kernels.use_on(device)  # before transformers imports the model's modules
    loaded = serving.load(load_device, s.dtype)
    kernels.warn_if_missing(loaded.model.config, loaded.device)
    described_kernels = kernels.describe(loaded.model.config)  # fixed once loaded: not re-read per /health
    progress.enter("building the prompt layout, head and engine")
    tokenizer = loaded.tokenizer
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    vision: ModuleType | None = None
    assets: AssetStore | None = None
    if recipe.model.modality == "vision-language":
        from .loading import vision as vision_module

        vision = vision_module
        assets = vision_module.AssetStore(s.asset_dir, asset_index, identity, caches.l2)
    builder = readout.prompt_builder(tokenizer, recipe, identity)
    readout.load(loaded, builder)
    bounds = PromptBounds.of(loaded.model.config, builder)
    prefix_cache = L3PrefixCache(l3, ReusePolicy(s.l3_reuse), loaded.device.type)
    engine = serving.backend.build(
        loaded,
        head=readout.head,
        batching=s.batching,
        max_batch_rows=s.max_batch_rows,
        pad_id=pad_id,
        vision=vision,
        graph_capture=capture_for(s.cuda_graphs, loaded.device),
        kv_budget_bytes=l3.budget,
        prefill_chunk=s.prefill_chunk_tokens,
        pack_tokens=s.pack_tokens,
        simulated=simulated,
    )
    if simulated is not None and not isinstance(engine, ModelRunner):
        raise ServingError(
            f"the simulated device replaces the generic runner's forwards; backend "
            f"{serving.backend.name!r} runs its own engine"
        )
    if prefix_cache.reuse.measures and l3.enabled:
        progress.enter(MEASURE_REUSE)
        costs = engine.measure_reuse()
        if isinstance(costs, ReuseCosts):
            prefix_cache.reuse.costs = costs
            log.info("L3 reuse measured on %s: %s", loaded.device, prefix_cache.reuse.describe())
    progress.enter("warming up")
    return LoadedParts(serving, loaded, described_kernels, builder, engine, prefix_cache, bounds, vision, assets)


class LocalModel:
    def __init__(
        self, settings: WorkerSettings, parts: LoadedParts, executor: ThreadPoolExecutor, metrics: WorkerMetrics
    ) -> None:
        """`executor`: the one model thread the parts were loaded on; the scheduler runs batches there."""
        s = settings
        self.settings = settings
        self.recipe = settings.recipe
        self.executor = executor
        self.serving = parts.serving
        self.loaded = parts.loaded
        self.kernels = parts.kernels
        self.builder = parts.builder
        self.engine = parts.engine
        self.prefix_cache = parts.prefix_cache
        self.bounds = parts.bounds
        self.vision = parts.vision
        self.assets = parts.assets
        self.checks = LayerChecks(self.loaded.model)
        self.scheduler = Scheduler(
            self.engine,
            self.executor,
            max_queue=s.max_queue,
            batching=s.batching,
            max_batch_rows=s.max_batch_rows,
            max_wait_ms=s.max_wait_ms,
            checks=self.checks,
            max_per_client=s.max_per_client,
            max_batch_tokens=s.max_batch_tokens,
            prefix_cache=self.prefix_cache,
            prefix_aware=s.schedule == "prefix",
            linger_s=s.retry_linger_s,
            bulk_weight=s.bulk_weight,
            bulk_max_rows=s.bulk_max_rows,
            bulk_max_tokens=s.bulk_max_tokens,
            on_batch=metrics.observe_batch,
            on_depth=metrics.queue_depth.set,
            on_abandoned=metrics.observe_abandoned,
            on_event=metrics.observe_flight,
        )

    @classmethod
    async def open(
        cls,
        settings: WorkerSettings,
        identity: str,
        metrics: WorkerMetrics,
        caches: WorkerCaches,
        asset_index: AssetIndex | None,
        progress: LoadProgress,
        on_serving: Callable[[Serving], None] = lambda _serving: None,
    ) -> LocalModel:
        """The recipe's model, loaded on its own model thread (`load_parts`), `progress` telling how far."""
        executor = ThreadPoolExecutor(1, thread_name_prefix="jev-model")  # the one model thread
        try:
            parts = await asyncio.get_running_loop().run_in_executor(
                executor, load_parts, settings, identity, caches, asset_index, progress, on_serving
            )
        except BaseException:
            executor.shutdown(wait=False, cancel_futures=True)
            raise
        return cls(settings, parts, executor, metrics)

    @property
    def readout(self) -> Readout:
        return self.serving.readout

    def image_placeholder(self, asset: ImageAsset) -> str:
        assert self.vision is not None, "image placeholders are made on vision-language recipes only"
        return str(self.vision.image_placeholder(self.loaded.processor or self.loaded.tokenizer, asset))

    @property
    def depth(self) -> int:
        return self.scheduler.depth

    async def stop(self) -> None:
        await self.scheduler.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)

    @property
    def device(self) -> str:
        """Where the forwards run: the torch device, or `simulated` (engine/simulated.py)."""
        if self.settings.device == "simulated":
            return "simulated"
        return str(self.loaded.device)

    def describe(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "dtype": str(self.loaded.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
            **self.bounds.describe(),
            **self.kernels,
            **self.engine_paths(),
        }

    def engine_paths(self) -> dict[str, Any]:
        """The L3 reuse policy's decisions and the runner's paths (graphs), for /health and the metrics."""
        return {**self.prefix_cache.describe(), **self.engine.describe()}
