"""Admission, deadlines and micro-batching in front of the one model thread.

Requests are prepared concurrently on the event loop; model work runs serially on a single-thread
executor. While the model is busy, new jobs queue; when it frees, the scheduler takes the oldest jobs up to
the row budget and hands them to the engine as one batch (the engine shares prefixes within it).
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from jev_common.errors import DeadlineExceeded, ForwardFailed, Overloaded, ShuttingDown

from .engine import DecisionEngine, EngineItem, EngineResult

log = logging.getLogger("jev.worker.scheduler")


@dataclass
class Job:
    item: EngineItem
    deadline: float
    future: asyncio.Future
    abandoned: bool = False
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def rows(self) -> int:
        return len(self.item.prepared.rows)


class Scheduler:
    def __init__(self, engine: DecisionEngine, executor: ThreadPoolExecutor, *, max_queue: int, batching: bool,
                 max_batch_rows: int, max_wait_ms: float,
                 on_batch: Callable[[int, int, float], None] | None = None,
                 on_depth: Callable[[int], None] | None = None):
        self.engine = engine
        self.executor = executor
        self.max_queue = max(1, max_queue)
        self.batching = batching
        self.max_batch_rows = max(1, max_batch_rows)
        self.max_wait_s = max(0.0, max_wait_ms) / 1000
        self._on_batch = on_batch
        self._on_depth = on_depth
        self._pending: list[Job] = []
        self._running = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None

    @property
    def depth(self) -> int:
        return len(self._pending) + self._running

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="jev-scheduler")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for job in self._pending:
            if not job.future.done():
                job.future.set_exception(ShuttingDown("worker is shutting down"))
        self._pending.clear()

    async def submit(self, item: EngineItem, timeout_s: float) -> EngineResult:
        if self.depth >= self.max_queue:
            raise Overloaded(f"worker queue is full ({self.max_queue} requests); retry shortly")
        loop = asyncio.get_running_loop()
        job = Job(item=item, deadline=loop.time() + timeout_s, future=loop.create_future())
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
                self._running = len(batch)
                self._report_depth()
                started = time.perf_counter()
                try:
                    results = await loop.run_in_executor(self.executor, self.engine.run, [j.item for j in batch])
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
                    self._running = 0
                    self._report_depth()
                if self._on_batch:
                    self._on_batch(len(batch), sum(j.rows for j in batch), time.perf_counter() - started)
