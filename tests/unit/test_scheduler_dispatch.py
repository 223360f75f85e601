"""The device never waits (scheduling/scheduler.py `_dispatch`): a job on an idle model thread starts at once, the
next batch is formed behind the running one and keeps taking the jobs that arrive until the model thread starts
it, and it starts the moment the running one ends, without waiting for the event loop. Checked on a scripted
engine whose batches block until the test lets them go; no timing is asserted."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import torch

from jev_worker.prompt.builder import PreparedRequest
from jev_worker.protocols import Engine
from jev_worker.scheduling.batch import BatchOutput, EngineItem, EngineResult
from jev_worker.scheduling.scheduler import Scheduler


class GatedEngine(Engine):
    """Each batch reports itself (`started`), then waits for its gate; it records, as it starts, whether the jobs
    of the batch before it were already answered on the event loop."""

    reuses_prefix = True

    def __init__(self):
        self.started: list[list[str]] = []
        self.gates: list[threading.Event] = []
        self.began = threading.Condition()
        self.previous_answered: list[bool] = []
        self.futures: dict[str, asyncio.Future] = {}

    def run(self, items, groups) -> BatchOutput:
        names = [item.prepared.prefix_key for item in items]
        with self.began:
            if self.started:
                self.previous_answered.append(all(self.futures[n].done() for n in self.started[-1]))
            gate = threading.Event()
            self.started.append(names)
            self.gates.append(gate)
            self.began.notify_all()
        assert gate.wait(30), "the test never let the batch go"
        return BatchOutput([EngineResult([torch.zeros(2)], cached_tokens=0) for _ in items])

    def wait_started(self, count: int) -> None:
        with self.began:
            assert self.began.wait_for(lambda: len(self.started) >= count, timeout=30), self.started


def item(name: str) -> EngineItem:
    prepared = PreparedRequest(prefix_ids=(1, 2), rows=((3,),), row_labels=((1, 2),), image_keys=(), prefix_key=name)
    return EngineItem(prepared=prepared)


def scheduler(engine: Engine, **options) -> Scheduler:
    settings = dict(max_queue=100, batching=True, max_batch_rows=8, max_wait_ms=0)
    settings.update(options)
    return Scheduler(engine, ThreadPoolExecutor(1), **settings)


async def submit(s: Scheduler, engine: GatedEngine, name: str) -> asyncio.Task:
    task = asyncio.ensure_future(s.submit(item(name), 30.0))
    engine.futures[name] = task
    await asyncio.sleep(0)  # the task runs up to its wait
    return task


async def test_a_job_on_an_idle_device_is_handed_to_the_model_thread_at_once():
    engine = GatedEngine()
    s = scheduler(engine)
    task = await submit(s, engine, "a")
    assert s.depth == 1 and not s._pending, "queued, not handed over"  # no timer, no loop iteration in between
    await asyncio.to_thread(engine.wait_started, 1)
    engine.gates[0].set()
    await task
    await s.stop()


async def test_the_jobs_that_arrive_while_a_batch_runs_form_the_next_one_which_starts_without_the_loop():
    engine = GatedEngine()
    s = scheduler(engine)
    first = await submit(s, engine, "a")
    await asyncio.to_thread(engine.wait_started, 1)
    later = [await submit(s, engine, name) for name in "bcde"]
    assert not s._pending and s.depth == 5  # b..e joined the batch formed behind the running one
    engine.gates[0].set()
    time.sleep(0.5)  # the event loop is blocked: only the model thread can start the next batch now
    assert len(engine.started) == 2 and engine.started[1] == list("bcde")
    assert engine.previous_answered == [False]  # it started before the loop had answered the first batch
    engine.gates[1].set()
    await asyncio.gather(first, *later)
    await s.stop()


async def test_a_pause_for_company_is_a_setting_and_off_by_default():
    engine = GatedEngine()
    s = scheduler(engine, max_wait_ms=200)
    task = await submit(s, engine, "a")
    assert s._pending and s.depth == 1  # JEV_MAX_WAIT_MS > 0: a lone job on an idle device waits for company
    await submit(s, engine, "b")
    await asyncio.to_thread(engine.wait_started, 1)
    assert engine.started[0] == ["a", "b"]
    engine.gates[0].set()
    await task
    await s.stop()


async def test_when_every_caller_of_the_next_batch_leaves_it_runs_nothing():
    engine = GatedEngine()
    s = scheduler(engine)
    first = await submit(s, engine, "a")
    await asyncio.to_thread(engine.wait_started, 1)
    leaving = await submit(s, engine, "b")
    leaving.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await leaving
    assert s.depth == 1  # b left the batch formed behind the running one
    engine.gates[0].set()
    await first
    await asyncio.sleep(0.2)
    assert len(engine.started) == 1
    await s.stop()
