"""Admission, deadlines and micro-batching in front of the one model thread.

Requests are prepared concurrently on the event loop; model work runs serially on a single-thread
executor. While the model is busy, new jobs queue; when it frees, the scheduler takes the oldest jobs up to
the row budget and hands them to the engine as one batch (the engine shares prefixes within it).

A job is wanted while its client waits and its deadline has not passed. Jobs nobody wants are dropped before a
batch starts, and a running batch nobody wants any more stops between two layers (abandon.py); `abort` (on
shutdown) answers every job at once and stops the running batch the same way.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from jev_common.errors import DeadlineExceeded, ForwardFailed, Overloaded, ShuttingDown

from .abandon import ForwardAbandoned, LayerChecks
from .engine import EngineItem, EngineResult
from .protocols import Engine

log = logging.getLogger("jev.worker.scheduler")


@dataclass
class Job:
    item: EngineItem
    deadline: float           # loop time
    future: asyncio.Future
    expires: float = 0.0      # time.monotonic() of the deadline, read on the model thread
    abandoned: bool = False   # the client went away or stopped waiting
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def rows(self) -> int:
        return len(self.item.prepared.rows)

    def wanted(self) -> bool:
        """Someone waits for this job's answer (safe to ask from the model thread)."""
        return not self.abandoned and time.monotonic() < self.expires


class Scheduler:
    def __init__(self, engine: Engine, executor: ThreadPoolExecutor, *, max_queue: int, batching: bool,
                 max_batch_rows: int, max_wait_ms: float, checks: LayerChecks | None = None,
                 on_batch: Callable[[int, int, float], None] | None = None,
                 on_depth: Callable[[int], None] | None = None,
                 on_abandoned: Callable[[int, ForwardAbandoned], None] | None = None):
        self.engine = engine
        self.executor = executor
        self.max_queue = max(1, max_queue)
        self.batching = batching
        self.max_batch_rows = max(1, max_batch_rows)
        self.max_wait_s = max(0.0, max_wait_ms) / 1000
        self.checks = checks
        self._on_batch = on_batch
        self._on_depth = on_depth
        self._on_abandoned = on_abandoned
        self._pending: list[Job] = []
        self._batch: list[Job] = []  # the batch on the model thread now
        self._running = 0
        self._aborting = False
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None

    @property
    def depth(self) -> int:
        return len(self._pending) + self._running

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="jev-scheduler")

    def abort(self) -> None:
        """Answer every job now (503, shutting down) and stop the running batch at its next layer."""
        self._aborting = True
        for job in [*self._pending, *self._batch]:
            job.abandoned = True
            if not job.future.done():
                job.future.set_exception(ShuttingDown("worker is shutting down; retry on another replica"))
        self._pending.clear()
        self._report_depth()

    async def idle(self) -> None:
        """Return once no batch is on the model thread."""
        await self._idle.wait()

    async def stop(self) -> None:
        self.abort()
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def submit(self, item: EngineItem, timeout_s: float) -> EngineResult:
        if self._aborting:
            raise ShuttingDown("worker is shutting down; retry on another replica")
        if self.depth >= self.max_queue:
            raise Overloaded(f"worker queue is full ({self.max_queue} requests); retry shortly")
        loop = asyncio.get_running_loop()
        job = Job(item=item, deadline=loop.time() + timeout_s, future=loop.create_future(),
                  expires=time.monotonic() + timeout_s)
        self._pending.append(job)
        self._report_depth()
        self._wakeup.set()
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout=timeout_s)
        except asyncio.TimeoutError:
            job.abandoned = True
            raise DeadlineExceeded(f"no decision within the deadline of {timeout_s:g} s") from None
        except asyncio.CancelledError:
            job.abandoned = True  # the client went away: don't spend the model on it
            raise

    def _run(self, batch: list[Job]) -> list[EngineResult]:
        """On the model thread: the engine's forwards, each layer first asking whether the batch is wanted."""
        items = [job.item for job in batch]
        if self.checks is None:
            return self.engine.run(items)
        with self.checks.watching(lambda: not self._aborting and any(job.wanted() for job in batch)):
            return self.engine.run(items)

    def _report_depth(self) -> None:
        if self._on_depth:
            self._on_depth(self.depth)

    def _take_batch(self) -> list[Job]:
        now = asyncio.get_running_loop().time()
        live = []
        for job in self._pending:
            if job.abandoned or job.future.done():
                continue
            if job.deadline <= now:
                job.future.set_exception(DeadlineExceeded("deadline passed while queued"))
                continue
            live.append(job)
        self._pending = live
        if not live:
            return []
        first = live[0]
        batch, rows = [first], first.rows
        if self.batching:  # the engine groups the batch by prefix key itself
            for job in live[1:]:
                if rows + job.rows <= self.max_batch_rows:
                    batch.append(job)
                    rows += job.rows
        taken = set(map(id, batch))
        self._pending = [job for job in live if id(job) not in taken]
        return batch

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._pending:
                if self.batching and self.max_wait_s and len(self._pending) == 1:
                    await asyncio.sleep(self.max_wait_s)  # let a burst's siblings arrive
                batch = self._take_batch()
                if not batch:
                    break
                self._running, self._batch = len(batch), batch
                self._idle.clear()
                self._report_depth()
                started = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self.executor, self._run, batch)
                except ForwardAbandoned as stopped:
                    log.info("stopped a batch of %d nobody waits for before layer %d of %d", len(batch),
                             stopped.layer, stopped.layers)
                    if self._on_abandoned:
                        self._on_abandoned(sum(j.rows for j in batch), stopped)
                    for job in batch:
                        if not job.future.done():
                            job.future.set_exception(ShuttingDown("worker is shutting down") if self._aborting
                                                     else DeadlineExceeded("no decision within the deadline"))
                except Exception as exc:  # noqa: BLE001 - a failed forward fails its requests, not the worker
                    log.exception("model forward failed for a batch of %d", len(batch))
                    error = ForwardFailed(f"model forward failed: {type(exc).__name__}: {exc}")
                    for job in batch:
                        if not job.future.done():
                            job.future.set_exception(error)
                else:
                    for job, result in zip(batch, results):
                        if not job.future.done():
                            job.future.set_result(result)
                finally:
                    self._running, self._batch = 0, []
                    self._idle.set()
                    self._report_depth()
                if self._on_batch:
                    self._on_batch(len(batch), sum(j.rows for j in batch), time.perf_counter() - started)
