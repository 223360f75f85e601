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
from jev_worker.scheduling.scheduler import Caller, Scheduler


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


def item(name: str, rows: int = 1) -> EngineItem:
    prepared = PreparedRequest(
        prefix_ids=(1, 2), rows=((3,),) * rows, row_labels=((1, 2),) * rows, image_keys=(), prefix_key=name
    )
    return EngineItem(prepared=prepared)


def scheduler(engine: Engine, **options) -> Scheduler:
    settings = dict(max_queue=100, batching=True, max_batch_rows=8, max_wait_ms=0)
    settings.update(options)
    return Scheduler(engine, ThreadPoolExecutor(1), **settings)


async def submit(
    s: Scheduler, engine: GatedEngine, name: str, caller: Caller = Caller(), rows: int = 1
) -> asyncio.Task:
    task = asyncio.ensure_future(s.submit(item(name, rows), 30.0, caller))
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


async def test_interactive_work_waits_behind_the_running_bulk_batch_only():
    """The bulk batch formed behind a running one is formed anew, led by the interactive job that arrives."""
    engine = GatedEngine()
    s = scheduler(engine)
    bulk = Caller("batch-client", bulk=True)
    first = await submit(s, engine, "a", bulk)
    await asyncio.to_thread(engine.wait_started, 1)
    queued_bulk = [await submit(s, engine, name, bulk) for name in ("b", "c")]
    interactive = await submit(s, engine, "i", Caller("someone"))
    engine.gates[0].set()
    await asyncio.to_thread(engine.wait_started, 2)
    assert engine.started[1] == ["i"]  # not b and c: they run after it, in a bulk batch of their own
    engine.gates[1].set()
    await asyncio.to_thread(engine.wait_started, 3)
    assert engine.started[2] == ["b", "c"]
    engine.gates[2].set()
    await asyncio.gather(first, interactive, *queued_bulk)
    await s.stop()


class AsyncDevice(GatedEngine):
    """A device that runs asynchronously (CUDA, the simulated device): a batch's run returns at once after its launch,
    with the batch's device event (`BatchOutput.ready`), which is reached when the test lets the batch go."""

    def run(self, items, groups) -> BatchOutput:
        names = [item.prepared.prefix_key for item in items]
        gate = threading.Event()
        with self.began:
            self.started.append(names)
            self.gates.append(gate)
            self.began.notify_all()
        results = [EngineResult([torch.zeros(2)], cached_tokens=0) for _ in items]
        return BatchOutput(results, ready=lambda: assert_set(gate))


def assert_set(gate: threading.Event) -> None:
    assert gate.wait(30), "the test never let the batch go"


async def test_the_next_batch_launches_while_one_is_on_the_device_and_its_answers_come_back_meanwhile():
    engine = AsyncDevice()
    s = scheduler(engine)
    first = await submit(s, engine, "a")
    await asyncio.to_thread(engine.wait_started, 1)
    second = await submit(s, engine, "b")
    await asyncio.to_thread(engine.wait_started, 2)  # launched behind "a", which the device has not finished
    assert s.running and not first.done()
    engine.gates[0].set()  # the device reaches the first batch's event
    await asyncio.wait_for(first, 10)  # answered while the second is still on the device
    assert not second.done() and s.running
    engine.gates[1].set()
    await asyncio.wait_for(second, 10)
    await until_idle(s)
    assert not s.running
    await s.stop()


async def test_at_most_two_batches_are_on_the_device_and_a_third_keeps_taking_jobs_until_one_is_done():
    engine = AsyncDevice()
    s = scheduler(engine)
    tasks = [await submit(s, engine, "a")]
    await asyncio.to_thread(engine.wait_started, 1)
    tasks.append(await submit(s, engine, "b"))
    await asyncio.to_thread(engine.wait_started, 2)
    tasks += [await submit(s, engine, name) for name in "cd"]  # the third batch: formed, waiting for a slot
    await asyncio.sleep(0.3)
    assert len(engine.started) == 2 and s.depth == 4
    tasks.append(await submit(s, engine, "e"))  # still joins it
    engine.gates[0].set()
    await asyncio.to_thread(engine.wait_started, 3)
    assert engine.started[2] == list("cde")
    engine.gates[1].set()
    engine.gates[2].set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await s.stop()


async def test_a_batch_smaller_than_the_one_on_the_device_waits_for_it_and_keeps_taking_jobs():
    """Launching a small batch ahead would split the callers into small batches while the device is the bottleneck:
    it waits for the device, or until it is as big as the batch launched before it."""
    engine = AsyncDevice()
    s = scheduler(engine)
    tasks = [await submit(s, engine, "big", rows=3)]
    await asyncio.to_thread(engine.wait_started, 1)
    tasks.append(await submit(s, engine, "s"))
    await asyncio.sleep(0.3)
    assert len(engine.started) == 1  # one row behind three: held back, the device busy
    tasks += [await submit(s, engine, name) for name in "tu"]  # three rows now: launched ahead
    await asyncio.to_thread(engine.wait_started, 2)
    assert engine.started[1] == list("stu") and not tasks[0].done()
    tasks.append(await submit(s, engine, "v"))
    await asyncio.sleep(0.3)
    assert len(engine.started) == 2
    engine.gates[0].set()  # the device is done with the first, still busy with "stu": "v" stays held back
    await asyncio.wait_for(tasks[0], 10)
    await asyncio.sleep(0.3)
    assert len(engine.started) == 2
    engine.gates[1].set()  # the device is idle: the batch of one goes at once
    await asyncio.to_thread(engine.wait_started, 3)
    assert engine.started[2] == ["v"]
    engine.gates[2].set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await s.stop()


class FailingLaunch(AsyncDevice):
    """An async device whose launch of a batch holding `failing` raises (a launch error: out of memory, say)."""

    def __init__(self, failing: str):
        super().__init__()
        self.failing = failing

    def run(self, items, groups) -> BatchOutput:
        if any(item.prepared.prefix_key == self.failing for item in items):
            raise RuntimeError("launch failed")
        return super().run(items, groups)


async def test_a_failed_launch_leaves_the_batch_on_the_device_as_it_was():
    """The batch whose launch failed leaves the device's count, not the one still on it: a batch as big as that one
    launches ahead of it."""
    engine = FailingLaunch("bad")
    s = scheduler(engine)
    first = await submit(s, engine, "a")
    await asyncio.to_thread(engine.wait_started, 1)
    bad = await submit(s, engine, "bad", rows=3)  # as big as needed to launch ahead, then fails
    try:
        await asyncio.wait_for(bad, 10)
        raise AssertionError("a failed launch answered")
    except Exception as exc:  # noqa: BLE001 - the error is the answer
        assert type(exc).__name__ == "ForwardFailed"
    later = await submit(s, engine, "c", rows=2)  # as big as "a", still on the device: launched ahead of it
    await asyncio.to_thread(engine.wait_started, 2)
    assert engine.started[1] == ["c"] and not first.done()
    engine.gates[0].set()
    engine.gates[1].set()
    await asyncio.wait_for(asyncio.gather(first, later), 10)
    await s.stop()


async def test_a_batch_on_the_device_is_answered_on_shutdown():
    engine = AsyncDevice()
    s = scheduler(engine)
    task = await submit(s, engine, "a")
    await asyncio.to_thread(engine.wait_started, 1)
    await s.stop()
    try:
        await asyncio.wait_for(task, 5)
        raise AssertionError("answered with a result after shutdown")
    except Exception as exc:  # noqa: BLE001 - the error is the answer
        assert type(exc).__name__ == "ShuttingDown"
    engine.gates[0].set()


async def until_idle(s: Scheduler) -> None:
    await asyncio.wait_for(s.idle(), 10)
