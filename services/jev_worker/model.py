"""A recipe's model in this process: its readout and backend (serving.py), the checkpoint loaded on the one
model thread, the prompt builder, the runner that runs batches, the scheduler in front of it (it owns L3, the prefix cache), and
the image assets (L2) of vision-language recipes."""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor

import torch

from jev_common.checkpoint_files import ServingError
from jev_common.cpu import compute_threads

from .engine import kernels
from .engine.graphs import capture_for
from .engine.runner import ModelRunner
from .engine.simulated import SHAPES
from .loading.load_progress import LoadProgress
from .loading.loader import LoadedModel, pick_device
from .prompt.bounds import PromptBounds
from .scheduling.abandon import LayerChecks
from .scheduling.prefix_cache import L3PrefixCache
from .scheduling.reuse import ReusePolicy
from .scheduling.scheduler import Scheduler
from .serving import Serving, build_serving

log = logging.getLogger("jev.worker.model")


class LocalModel:
    def __init__(self, settings, identity: str, metrics, caches):
        self.serving: Serving | None = None  # the family's readout and backend, checked against the checkpoint
        self.settings = settings
        self.recipe = settings.recipe
        self.identity = identity
        self.metrics = metrics
        self.caches = caches  # caches.WorkerCaches: L2 goes to the asset store, L3 to the engine
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="jev-model")  # the one model thread
        self.loaded: LoadedModel | None = None
        self.kernels: dict = {}  # kernels.describe() of the loaded model (hybrid layers only)
        self.builder = None
        self.engine = None  # the runner (runner.py, or a backend's own Engine)
        self.prefix_cache = L3PrefixCache()  # L3, owned by the scheduler; sized once the backend is known
        self.scheduler: Scheduler | None = None
        self.assets = None  # vision.AssetStore on vision-language recipes (L2)
        self.vision = None
        self.progress = LoadProgress()  # how far loading is, for health while the worker loads
        self.bounds = PromptBounds(None)  # the longest prompt the model reads (bounds.py), known once loaded
        self.checks: LayerChecks | None = None

    @property
    def stage(self) -> str:
        return self.progress.describe()

    @property
    def readout(self):
        return self.serving.readout

    async def start(self) -> None:
        await asyncio.get_running_loop().run_in_executor(self.executor, self._load)
        s = self.settings
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
            on_batch=self.metrics.observe_batch,
            on_depth=self.metrics.queue_depth.set,
            on_abandoned=self.metrics.observe_abandoned,
            on_event=self.metrics.observe_flight,
        )

    def _load(self) -> None:
        s = self.settings
        torch.set_num_threads(compute_threads(s.threads))
        self.progress.enter("checking the checkpoint")
        self.serving = build_serving(self.recipe, s.model_path)
        readout = self.readout
        self.progress.enter("loading the weights", f"from {self.serving.folder}")
        simulated = SHAPES[s.simulated_shapes] if s.device == "simulated" else None
        device = "cpu" if simulated is not None else s.device  # a simulated device's checkpoint: tokenizer, head
        kernels.use_on(pick_device(device))  # before transformers imports the model's modules
        self.loaded = self.serving.load(device, s.dtype)
        kernels.warn_if_missing(self.loaded.model.config, self.loaded.device)
        self.kernels = kernels.describe(self.loaded.model.config)  # fixed once loaded: not re-read per /health
        self.progress.enter("building the prompt layout, head and engine")
        tokenizer = self.loaded.tokenizer
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        if self.recipe.model.modality == "vision-language":
            from .loading import vision

            self.vision = vision
            self.assets = vision.AssetStore(s.asset_dir, None, self.identity, self.caches.l2)
        self.builder = readout.prompt_builder(tokenizer, self.recipe, self.identity)
        readout.load(self.loaded, self.builder)
        self.bounds = PromptBounds.of(self.loaded.model.config, self.builder)
        l3 = self.caches.size_l3(self.serving.backend)
        self.prefix_cache = L3PrefixCache(l3, ReusePolicy(s.l3_reuse), self.loaded.device.type)
        self.engine = self.serving.backend.build(
            self.loaded,
            head=readout.head,
            batching=s.batching,
            max_batch_rows=s.max_batch_rows,
            pad_id=pad_id,
            vision=self.vision,
            graph_capture=capture_for(s.cuda_graphs, self.loaded.device),
            kv_budget_bytes=l3.budget,
            prefill_chunk=s.prefill_chunk_tokens,
            pack_tokens=s.pack_tokens,
            simulated=simulated,
        )
        if simulated is not None and not isinstance(self.engine, ModelRunner):
            raise ServingError(
                f"the simulated device replaces the generic runner's forwards; backend "
                f"{self.serving.backend.name!r} runs its own engine"
            )
        if self.prefix_cache.reuse.measures and l3.enabled:
            self.progress.enter("measuring L3 reuse on the device")
            costs = self.engine.measure_reuse()
            if costs is not None:
                self.prefix_cache.reuse.costs = costs
                log.info("L3 reuse measured on %s: %s", self.loaded.device, self.prefix_cache.reuse.describe())
        self.progress.enter("warming up")

    def image_placeholder(self, asset) -> str:
        return self.vision.image_placeholder(self.loaded.processor or self.loaded.tokenizer, asset)

    @property
    def depth(self) -> int:
        return self.scheduler.depth if self.scheduler else 0

    async def stop(self) -> None:
        if self.scheduler:
            await self.scheduler.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)

    @property
    def device(self) -> str:
        """Where the forwards run: the torch device, or `simulated` (engine/simulated.py)."""
        if self.settings.device == "simulated":
            return "simulated"
        return str(self.loaded.device) if self.loaded is not None else self.settings.device

    def describe(self) -> dict:
        if self.loaded is None:
            return {}
        return {
            "device": self.device,
            "dtype": str(self.loaded.dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "(default)"),
            **self.bounds.describe(),
            **self.kernels,
            **self.engine_paths(),
        }

    def engine_paths(self) -> dict:
        """The L3 reuse policy's decisions and the runner's paths (graphs), for /health and the metrics."""
        return {**self.prefix_cache.describe(), **(self.engine.describe() if self.engine is not None else {})}
