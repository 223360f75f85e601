"""The one request path. Both request forms (envelope.py, legacy.py) become a `Job`; `WorkerService.run` checks
it against what is served and hands it to the worker's strategy:

- `LocalPipeline` (a model in this process): L1 (prepared prompt records) -> L2 (image assets) ->
  scheduler (batches on the one model thread; L3 prefix states, the scheduler's) -> readout -> answers;
- `ExternalPipeline` (the family's own server runs the network, e.g. CLM): the readout translates the request,
  the backend posts it, the readout translates the answer back.

Each stage a job passes is marked on the request's timeline (jev_common.timeline): prepare, queue, batch, device,
readout. Nothing here speaks HTTP: what goes wrong is a domain error (jev_common.errors).
"""

from __future__ import annotations

import asyncio
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from jev_common.errors import DeadlineExceeded, ImagesNotSupported, InvalidRequest, validation_error
from jev_common.route_key import state_route_key
from jev_common.timeline import Timeline

from .questions import coherence
from .questions.plan import answers as plan_answers, rows_for
from .request.job import ImageSlot, Job
from .scheduling.batch import BatchTiming, EngineItem
from .scheduling.caches import BudgetLRU
from .scheduling.scheduler import Caller, Scheduler

if TYPE_CHECKING:
    from jev_common.assets import ImageAsset
    from jev_common.schema import SystemOneUsage

    from .loading.vision import AssetStore
    from .prompt.bounds import PromptBounds
    from .prompt.builder import PreparedRequest
    from .protocols import PromptBuilder, Readout
    from .registration import IndexLink
    from .telemetry.metrics import WorkerMetrics

log = logging.getLogger("jev.worker.pipeline")


@dataclass
class Decision:
    answers: dict  # question id -> typed answer
    prompt_tokens: int
    cached_tokens: int
    usage: SystemOneUsage | None = None  # an external server's own usage, when it reports one
    cache: dict = field(default_factory=dict)  # level -> hit | miss | off
    device_s: float | None = None  # the simulated device's seconds for the request's batches

    def headers(self) -> dict[str, str]:
        return {"x-jev-cache": ",".join(f"{lvl}={self.cache[lvl]}" for lvl in ("l1", "l2", "l3") if lvl in self.cache)}


class Pipeline(ABC):
    """How a job's questions are answered once the service has accepted it."""

    @abstractmethod
    async def answer(
        self, job: Job, started: float, timeout: float, caller: Caller = Caller(), timeline: Timeline | None = None
    ) -> Decision: ...


@dataclass(frozen=True)
class Images:
    """L2 and how a prompt stands for an image: a vision-language model's image assets (model.py)."""

    store: AssetStore
    placeholder: Callable[[ImageAsset], str]
    l2_on: bool  # JEV_L2_CACHE: whether a hit counts (and the frontends hear where the image is warm)


class LocalPipeline(Pipeline):
    """L1 -> L2 -> scheduler -> readout -> answers, for a model loaded in this process (model.py's parts)."""

    def __init__(
        self,
        model_name: str,
        readout: Readout,
        builder: PromptBuilder,
        bounds: PromptBounds,
        scheduler: Scheduler,
        images: Images | None,
        l1: BudgetLRU[PreparedRequest],
        index_link: IndexLink,
        metrics: WorkerMetrics,
    ) -> None:
        """`images`: None when the model reads text states only."""
        self.model_name = model_name
        self.readout = readout
        self.builder = builder
        self.bounds = bounds
        self.scheduler = scheduler
        self.images = images
        self.l1 = l1
        self.index_link = index_link
        self.metrics = metrics
        self.prep_executor = ThreadPoolExecutor(2, thread_name_prefix="jev-prep")

    def close(self) -> None:
        self.prep_executor.shutdown(wait=False, cancel_futures=True)

    async def answer(
        self, job: Job, started: float, timeout: float, caller: Caller = Caller(), timeline: Timeline | None = None
    ) -> Decision:
        timeline = timeline if timeline is not None else Timeline(started)
        images = self.images
        if job.images and images is None:
            raise ImagesNotSupported(
                f"model {self.model_name} reads text states only; send a text state or serve a vision-language recipe"
            )
        for piece in job.pieces:
            if isinstance(piece, str):
                self.builder.check_user_text(piece, job.where)
        cache: dict[str, str] = {}
        state_parts, assets = [], []
        for piece in job.pieces:
            if isinstance(piece, ImageSlot):
                assert images is not None  # job.images is set whenever a piece is an image
                asset, placeholder = await asyncio.wait_for(self._image(images, piece.key, cache), timeout)
                timeline.mark("asset", key=piece.key, l2=cache["l2"])  # the trace names the preencoder's asset
                self.builder.check_image(asset, job.where)
                assets.append(asset)
                state_parts.append(placeholder)
            else:
                state_parts.append(piece)
        state_text = "".join(state_parts)
        kinds = {**job.extra_kinds, **self.readout.kinds}
        groups = self.builder.prefix_groups(job.questions)
        keys = [job.l1_key] if len(groups) == 1 else [f"{job.l1_key}|{i}" for i in range(len(groups))]
        sequences = [
            self._sequence(job, questions, key, state_text, assets, kinds, started, timeout, caller, timeline)
            for questions, key in zip(groups, keys)
        ]
        parts = [await sequences[0]] if len(sequences) == 1 else await asyncio.gather(*sequences)
        answered = {qid: answer for part in parts for qid, answer in part.answers.items()}
        out = {qid: answered[qid] for qid in job.questions}
        prompt_tokens = sum(part.prompt_tokens for part in parts)
        cached_tokens = sum(part.cached_tokens for part in parts)
        cache.update({level: _level([part.cache[level] for part in parts]) for level in ("l1", "l3")})
        self.metrics.count_tokens(prompt_tokens, cached_tokens)
        waits = [part.device_s for part in parts if part.device_s is not None]
        return Decision(out, prompt_tokens, cached_tokens, cache=cache, device_s=sum(waits) if waits else None)

    async def _sequence(
        self,
        job: Job,
        questions: dict,
        l1_key: str,
        state_text: str,
        assets: list,
        kinds: dict,
        started: float,
        timeout: float,
        caller: Caller,
        timeline: Timeline,
    ) -> Decision:
        """One prefix group's questions (PromptBuilder.prefix_groups): prepared (L1), then run after its prefix."""
        builder, bounds = self.builder, self.bounds
        began = timeline.last  # prepare counts from where the request's last stage ended (its parse)

        def build():
            rows, plan = rows_for(questions, job.state, builder, kinds, self.readout.name, job.coherence)
            # bounds before compute: cheapest first, the exact count last
            bounds.check_chars(state_text, questions, job.where)
            bounds.check_state_tokens(builder.tokenizer, state_text, job.where)
            prepared = builder.prepare(state_text, rows, job.image_keys, plan)
            bounds.check_prepared(prepared, job.where)
            return prepared

        prepared, l1 = self._cached(l1_key)
        if prepared is None:
            prepared = await asyncio.wait_for(self._build(l1_key, build), timeout)
        self.index_link.note_route(prepared.prefix_key, state_route_key(job.route_text, job.route_images))
        remaining = timeout - (time.perf_counter() - started)
        if remaining <= 0:
            raise DeadlineExceeded("deadline passed while preparing the request")
        submitted = time.perf_counter()
        result = await self.scheduler.submit(EngineItem(prepared=prepared, assets=assets), remaining, caller)
        out = plan_answers(prepared.plan, result.row_logits, builder, kinds)
        timing = result.timing
        if timing is not None:
            _mark(timeline, began, submitted, timing, result.l3)
        return Decision(
            out,
            prepared.prompt_tokens,
            result.cached_tokens,
            cache={"l1": l1, "l3": result.l3},
            device_s=timing.device_s if timing is not None else None,
        )

    def _cached(self, key: str):
        """L1: the prepared prompt for `key` and the level's outcome (hit | miss | off); None on a miss."""
        prepared = self.l1.get(key)
        return prepared, "hit" if prepared is not None else ("miss" if self.l1.enabled else "off")

    async def _build(self, key: str, build):
        """A prepared prompt built on the prep threads (an L1 miss), then kept in L1."""
        try:
            prepared = await asyncio.get_running_loop().run_in_executor(self.prep_executor, build)
        except InvalidRequest:
            raise
        except ValueError as exc:
            raise validation_error(str(exc)) from None
        if prepared.boundary_mismatch:
            self.metrics.prefix_boundary_mismatch.inc()
        self.l1.put(key, prepared)
        return prepared

    async def _image(self, images: Images, key: str, cache: dict[str, str]) -> tuple[ImageAsset, str]:
        """L2: the image's asset (and the prompt text standing for it)."""
        asset, l2_hit = await images.store.get_by_key(key)
        if images.l2_on:
            self.index_link.register_l2(key)  # a routing hint: where this image is warm
            cache["l2"] = "miss" if cache.get("l2") == "miss" or not l2_hit else "hit"
        else:
            cache["l2"] = "off"
        return asset, images.placeholder(asset)


def _mark(timeline: Timeline, began: float, submitted: float, timing: BatchTiming, l3: str) -> None:
    """One job's stages on its request's timeline, back to back: prepare, queue (from its submission, or the job's
    own queueing when this request joined it later), batch and device (the batch's run on the model thread, split
    by the simulated device's wait where known; the device stage carries the batch's size and the prefix cache's
    outcome, for its span), readout (from the model thread's end to the answers, now)."""
    queued = max(submitted, timing.queued)
    timeline.add("prepare", began, queued)
    timeline.add("queue", queued, max(queued, timing.started))
    batch = {"rows": timing.rows, "requests": timing.requests, "l3": l3}
    if timing.device_s is not None:
        host_end = max(timing.started, timing.finished - timing.device_s)
        timeline.add("batch", timing.started, host_end)
        timeline.add("device", host_end, timing.finished, **batch)
    else:
        timeline.add("device", timing.started, timing.finished, **batch)
    timeline.add("readout", timing.finished, time.perf_counter())


def _level(outcomes: list[str]) -> str:
    """One cache level's outcome over a request's sequences: a miss if any missed, off if all were off, a
    bypass (L3: cached but recomputed, the measured reuse policy) if none was used but some were cached."""
    if "miss" in outcomes:
        return "miss"
    if all(o == "off" for o in outcomes):
        return "off"
    return "bypass" if "hit" not in outcomes and "bypass" in outcomes else "hit"


class ExternalPipeline(Pipeline):
    """The family's own server runs the network: translate, post within the deadline, translate back."""

    def __init__(self, readout, backend):
        self.readout = readout
        self.backend = backend

    async def answer(
        self, job: Job, started: float, timeout: float, caller: Caller = Caller(), timeline: Timeline | None = None
    ) -> Decision:
        if job.images:
            raise ImagesNotSupported("this model reads text states only; send a text state")
        coherence.check(job.request.questions, self.readout.kinds, job.coherence, self.readout.name)
        timeline = timeline if timeline is not None else Timeline(started)
        body = self.readout.request_body(job.request)
        timeline.mark("prepare")
        raw = await self.backend.post("/v1/systemone", body, timeout)
        timeline.mark("device")  # the family's own server
        answers, usage = self.readout.answers(job.request, raw)
        timeline.mark("readout")
        return Decision(answers, usage.input_tokens, 0, usage=usage, cache={"l1": "off", "l3": "off"})
