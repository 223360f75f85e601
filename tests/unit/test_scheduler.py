"""One request cannot hurt the others (jev_worker/scheduling/scheduler.py, watchdog.py): work stops when its caller
leaves, identical work is computed once (single flight, SDK retries joined), one client cannot starve the
others, the caller owns its deadline, and health says when the worker makes no progress."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from jev_common.errors import Overloaded
from jev_common.http import DEADLINE_HEADER, PRIORITY_HEADER, RETRY_COUNT_HEADER, SDK_HEADER
from jev_worker.scheduling.abandon import layer_stack
from jev_worker.scheduling.scheduler import Batch, Caller, Scheduler, flight_key
from jev_worker.telemetry.watchdog import Watchdog

from .test_prefix_scheduling import NoEngine, item
from .worker_helpers import worker_client


def ask(i: int = 0, state: str = "The lamp is on and the room is bright.") -> dict:
    return {
        "model": "jev-latest",
        "state": state,
        "questions": {
            "q": {"type": "choice", "instructions": f"Which is it? ({i})", "criteria": {"bright": None, "dark": None}}
        },
    }


@contextlib.contextmanager
def slow_layers(service, seconds: float):
    """Every decoder layer sleeps `seconds` first (after the abandon check, which is registered before)."""
    handles = [
        block.register_forward_pre_hook(lambda *_: time.sleep(seconds))
        for block in layer_stack(service.model.loaded.model)
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def flight(service, event: str) -> float:
    return service.metrics.flight.labels(event)._value.get()


def abandoned(service) -> float:
    return service.metrics.abandoned_batches._value.get()


async def until(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def leave_after(client, body: dict, seconds: float, headers: dict | None = None) -> None:
    """POST and disconnect after `seconds` (what `curl -m` or an SDK attempt timeout does)."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(client.post("/v1/systemone", json=body, headers=headers or {}), seconds)


async def test_a_caller_that_leaves_stops_its_forward(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        computed = flight(service, "computed")
        with slow_layers(service, 0.5):
            await leave_after(client, ask(), 0.2)
            await until(lambda: abandoned(service) == 1)  # stopped at its next layer, not run to the end
            await until(lambda: service.model.scheduler.depth == 0)
        assert flight(service, "computed") == computed
        response = await client.post("/v1/systemone", json=ask(1))
        assert response.status == 200


async def test_rows_finished_after_their_caller_left_are_counted_unwanted(worker_settings):
    """Two queued requests batched together; one caller leaves mid-batch: the batch runs on for the other, and the
    leaver's rows are computed for nobody, so computed = answered + unwanted."""
    async with worker_client(worker_settings()) as (client, service):
        scheduler = service.model.scheduler
        events = ("computed", "answered", "unwanted")
        before = {e: flight(service, e) for e in events}
        layers = len(layer_stack(service.model.loaded.model))
        with slow_layers(service, 1.0 / layers):  # each batch takes about 1 s
            blocker = asyncio.ensure_future(client.post("/v1/systemone", json=ask(0, state="The first state.")))
            await until(lambda: len(scheduler.running_jobs) == 1)  # the blocker runs; the next two queue behind it
            stay = asyncio.ensure_future(client.post("/v1/systemone", json=ask(1, state="The second state.")))
            leaver = asyncio.ensure_future(client.post("/v1/systemone", json=ask(2, state="The third state.")))
            await until(lambda: len(scheduler.running_jobs) == 2)  # the two, batched together, run
            await asyncio.sleep(0.3)
            leaver.cancel()  # its client leaves halfway through the batch
            with contextlib.suppress(asyncio.CancelledError):
                await leaver
            responses = [await blocker, await stay]
        assert all(r.status == 200 for r in responses)
        await until(lambda: scheduler.depth == 0)
        got = {e: flight(service, e) - before[e] for e in events}
        assert abandoned(service) == 0
        assert got == {"computed": 3, "answered": 2, "unwanted": 1}


async def test_identical_requests_in_flight_are_computed_once(worker_settings):
    async with worker_client(worker_settings(batching=False)) as (client, service):
        computed, joined = flight(service, "computed"), flight(service, "joined")
        with slow_layers(service, 0.1):
            responses = await asyncio.gather(*(client.post("/v1/systemone", json=ask()) for _ in range(3)))
        bodies = [await r.json() for r in responses]
        assert all(r.status == 200 for r in responses)
        assert bodies[0]["answers"] == bodies[1]["answers"] == bodies[2]["answers"]
        rows = 1
        assert flight(service, "computed") - computed == rows  # one forward for three requests
        assert flight(service, "joined") - joined == 2 * rows


async def test_an_sdk_retry_joins_the_work_its_first_attempt_left(worker_settings):
    async with worker_client(worker_settings(retry_linger_s=5.0)) as (client, service):
        computed = flight(service, "computed")
        with slow_layers(service, 0.3):
            await leave_after(client, ask(), 0.2, {SDK_HEADER: "python/0.7.5"})
            await asyncio.sleep(0.5)  # the SDK's backoff
            retry = await client.post(
                "/v1/systemone", json=ask(), headers={SDK_HEADER: "python/0.7.5", RETRY_COUNT_HEADER: "1"}
            )
        assert retry.status == 200
        assert flight(service, "computed") - computed == 1
        assert abandoned(service) == 0


async def test_work_finished_for_nobody_answers_the_retry_without_computing(worker_settings):
    async with worker_client(worker_settings(retry_linger_s=5.0)) as (client, service):
        computed, kept = flight(service, "computed"), flight(service, "kept")
        with slow_layers(service, 0.2):
            await leave_after(client, ask(), 0.1, {SDK_HEADER: "python/0.7.5"})
            await until(lambda: flight(service, "computed") - computed == 1)  # finished, nobody waiting
        retry = await client.post("/v1/systemone", json=ask(), headers={RETRY_COUNT_HEADER: "1"})
        assert retry.status == 200
        assert flight(service, "computed") - computed == 1 and flight(service, "kept") - kept == 1


async def test_without_the_retry_headers_nothing_lingers(worker_settings):
    async with worker_client(worker_settings(retry_linger_s=5.0)) as (client, service):
        computed = flight(service, "computed")
        with slow_layers(service, 0.5):
            await leave_after(client, ask(), 0.2)
            await until(lambda: abandoned(service) == 1)
            retry = await client.post("/v1/systemone", json=ask())
        assert retry.status == 200
        assert flight(service, "computed") - computed == 1  # computed again: the first was stopped


async def test_one_client_flooding_cannot_starve_another(worker_settings):
    async with worker_client(worker_settings(max_per_client=6, batching=False)) as (client, service):
        order: list[str] = []

        async def post(who: str, i: int):
            response = await client.post(
                "/v1/systemone", json=ask(i, state=f"{who} state {i}"), headers={"x-jev-client": who}
            )
            if response.status == 200:
                order.append(who)
            return response

        with slow_layers(service, 0.1):
            flood = [asyncio.ensure_future(post("flood", i)) for i in range(9)]
            await until(lambda: service.model.scheduler.depth >= 6)
            other = await post("other", 0)
            flooded = await asyncio.gather(*flood)
        statuses = sorted(r.status for r in flooded)
        assert statuses == [200] * 6 + [429] * 3  # six in flight at most, the rest told to retry
        limited = next(r for r in flooded if r.status == 429)
        assert limited.headers["Retry-After"] == "1"
        assert (await limited.json())["detail"]["error_type"] == "overloaded"
        assert other.status == 200
        # round-robin over clients: the other client's one request is not queued behind the flood's five
        assert order.index("other") <= 3, order


async def test_the_caller_owns_its_deadline(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        with slow_layers(service, 0.5):
            started = time.monotonic()
            response = await client.post("/v1/systemone", json=ask(), headers={DEADLINE_HEADER: "0.3"})
            assert response.status == 504 and time.monotonic() - started < 5
            await until(lambda: abandoned(service) == 1)
        for bad in ("0", "-1", "abc", "nan", "100000"):
            response = await client.post("/v1/systemone", json=ask(), headers={DEADLINE_HEADER: bad})
            assert response.status == 422, bad
            assert DEADLINE_HEADER in str(await response.json())


async def test_an_abandoned_forward_logs_one_info_line_and_no_unretrieved_future(worker_settings, caplog):
    caplog.set_level(logging.INFO)
    async with worker_client(worker_settings()) as (client, service):
        with slow_layers(service, 0.5):
            await client.post("/v1/systemone", json=ask(), headers={DEADLINE_HEADER: "0.3"})
            await until(lambda: abandoned(service) == 1)
            await until(lambda: service.model.scheduler.depth == 0)
        gc.collect()
        await asyncio.sleep(0.05)
    stopped = [r for r in caplog.records if "nobody waits for" in r.getMessage()]
    assert len(stopped) == 1 and stopped[0].levelno == logging.INFO
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_health_turns_503_when_no_layer_finishes(worker_settings):
    async with worker_client(worker_settings(stall_s=0.5)) as (client, service):
        with slow_layers(service, 1.5):
            pending = asyncio.ensure_future(client.post("/v1/systemone", json=ask()))
            await until(lambda: service.model.scheduler.running)
            await asyncio.sleep(0.8)
            health = await client.get("/health")
            body = await health.json()
            assert health.status == 503 and body["status"] == "stalled"
            assert "no layer or prefill chunk finished" in body["detail"]["error"]
            assert body["detail"]["error_type"] == "stalled"
            assert service.metrics.stalled._value.get() == 1
            live = await client.get("/livez")  # liveness fails on the stall only (a restart may cure it)
            assert live.status == 503 and (await live.json())["detail"]["error_type"] == "stalled"
            await pending
        health = await client.get("/health")
        assert health.status == 200
        assert (await client.get("/livez")).status == 200


async def test_watchdog_reports_a_blocked_event_loop():
    now = [0.0]
    dog = Watchdog(0.2, running=lambda: False, last_progress=lambda: now[0])
    dog.start()
    try:
        await asyncio.sleep(0.3)
        assert dog.problem() is None
        time.sleep(0.6)  # the loop is blocked
        await asyncio.sleep(0.3)
        problem = dog.problem()
        assert problem is not None and "event loop was blocked" in problem
    finally:
        await dog.stop()


@pytest.mark.parametrize("running,age,stalled", [(False, 100, False), (True, 0.05, False), (True, 5, True)])
def test_watchdog_stall_is_a_running_batch_without_progress(running, age, stalled):
    started = time.monotonic() - age
    dog = Watchdog(1.0, running=lambda: running, last_progress=lambda: started)
    assert (dog.problem() is not None) == stalled


async def test_a_queued_request_whose_caller_left_frees_its_place_at_once(worker_settings):
    """Work queued for nobody leaves the queue when its caller does, not when the model frees: otherwise
    callers that gave up fill the queue and everyone else gets 429."""
    async with worker_client(worker_settings(max_queue=2, batching=False)) as (client, service):
        with slow_layers(service, 0.5):
            running = asyncio.ensure_future(client.post("/v1/systemone", json=ask(0)))
            await until(lambda: service.model.scheduler.running)
            await leave_after(client, ask(1), 0.3)  # queued behind the first, then gone
            await until(lambda: service.model.scheduler.depth == 1, timeout=0.5)
            third = await client.post("/v1/systemone", json=ask(2))
            assert third.status == 200
            assert (await running).status == 200


# --- bulk work (x-jev-priority: bulk): a lower weight, capped batches, never ahead of interactive work --------------


def bulk_scheduler(**overrides) -> Scheduler:
    options = (
        dict(max_queue=200, batching=True, max_batch_rows=8, max_wait_ms=0, bulk_weight=0.25, bulk_max_rows=4)
        | overrides
    )
    return Scheduler(NoEngine(), ThreadPoolExecutor(1), **options)


def enqueue(s: Scheduler, client: str, prefixes: str, bulk: bool, prefix_tokens: int = 100) -> None:
    for prefix in prefixes:
        n = len(s._pending)
        job = item(prefix, n, prefix_tokens)
        s._new_job(job, flight_key(job), Caller(client, bulk=bulk).flow, 60.0, bulk=bulk)
        s._pending[-1].waiters = 1


def classes(batch) -> list[str]:
    return ["bulk" if job.bulk else "interactive" for job in batch]


async def test_an_interactive_request_waits_behind_at_most_one_capped_bulk_batch_of_its_own_key():
    s = bulk_scheduler()
    enqueue(s, "key:k", "A" * 20, bulk=True)  # a batch of 20 rows on one state, queued first
    enqueue(s, "key:k", "Z", bulk=False)  # then the same key asks one question interactively
    assert classes(s._take_batch()) == ["bulk"] * 4  # the bulk batch that was due, capped at 4 rows
    assert classes(s._take_batch()) == ["interactive"]  # next: not behind the key's own bulk backlog
    assert classes(s._take_batch()) == ["bulk"] * 4


async def test_a_batch_led_by_interactive_work_takes_no_bulk_job_even_of_its_prefix():
    s = bulk_scheduler()
    enqueue(s, "a", "A", bulk=False)
    enqueue(s, "b", "AAAA", bulk=True)
    assert classes(s._take_batch()) == ["interactive"]
    assert classes(s._take_batch()) == ["bulk"] * 4


async def test_a_bulk_batch_is_capped_in_tokens_too():
    """Three bulk jobs of different 100-token prefixes: a 250-token bulk cap takes two; interactive work keeps the
    batch budget."""
    s = bulk_scheduler(bulk_max_tokens=250, max_batch_tokens=1000)
    enqueue(s, "b", "ABC", bulk=True)
    assert len(s._take_batch()) == 2
    s = bulk_scheduler(bulk_max_tokens=250, max_batch_tokens=1000)
    enqueue(s, "a", "ABC", bulk=False)
    assert len(s._take_batch()) == 3


async def test_backlogged_bulk_work_gets_its_weight_of_the_rows():
    """Both flows backlogged: bulk rows cost 1/weight = 4, so interactive work is served four rows to bulk's one
    (a 4-row bulk batch, then two 8-row interactive batches, and so on)."""
    s = bulk_scheduler()
    enqueue(s, "b", "B" * 40, bulk=True)
    enqueue(s, "a", "I" * 80, bulk=False)
    served = Counter()
    for _ in range(9):
        batch = s._take_batch()
        assert len(set(classes(batch))) == 1  # a batch is of one class
        served.update(classes(batch))
    assert served == {"interactive": 48, "bulk": 12}


async def test_bulk_work_holds_at_most_half_the_queue():
    s = bulk_scheduler(max_queue=4)
    enqueue(s, "b", "AB", bulk=True)
    with pytest.raises(Overloaded, match="bulk work holds half"):
        enqueue(s, "c", "C", bulk=True)
    enqueue(s, "a", "DE", bulk=False)  # interactive callers still get the other half
    assert s.depth == 4


async def test_an_interactive_caller_joining_queued_bulk_work_takes_it_out_of_the_bulk_lane():
    """A request submitted now is dispatched now (scheduling/scheduler.py `_dispatch`): with a batch on the model
    thread, the interactive caller joining bulk work gets it into the batch formed behind the running one, ahead of
    the bulk lane."""
    from .test_scheduler_dispatch import GatedEngine, item as gated_item

    engine = GatedEngine()
    s = Scheduler(
        engine, ThreadPoolExecutor(1), max_queue=100, batching=True, max_batch_rows=8, max_wait_ms=0, bulk_max_rows=4
    )

    async def submit(name: str, caller: Caller) -> asyncio.Future:
        task = asyncio.ensure_future(s.submit(gated_item(name), 60.0, caller))
        engine.futures[name] = task
        await asyncio.sleep(0)
        return task

    running = await submit("x", Caller("c"))
    await asyncio.to_thread(engine.wait_started, 1)
    backlog = [await submit(name, Caller("b", bulk=True)) for name in "ABCDEFGH"]
    last = next(job for job in s._pending if job.item.prepared.prefix_key == "H")
    joined = await submit("H", Caller("a"))  # the same prompt, asked interactively
    assert s._flights[last.key] is last and last.promoted and last.waiters == 2
    expected = [["H"], list("ABCD"), list("EFG")]  # behind the running batch only, then the bulk lane, capped
    for n, names in enumerate(expected, start=1):
        engine.gates[n - 1].set()
        await asyncio.to_thread(engine.wait_started, n + 1)
        assert engine.started[n] == names, engine.started
    engine.gates[3].set()
    await asyncio.gather(running, joined, *backlog)
    await s.stop()


async def test_the_priority_header_marks_the_caller_bulk_and_refuses_other_values(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        seen = []
        original = service.model.scheduler.submit

        async def spy(item, timeout_s, caller):
            seen.append(caller)
            return await original(item, timeout_s, caller)

        service.model.scheduler.submit = spy
        for value, bulk in (("bulk", True), (" Bulk ", True), ("interactive", False), (None, False)):
            headers = {} if value is None else {PRIORITY_HEADER: value}
            response = await client.post("/v1/systemone", json=ask(len(seen)), headers=headers)
            assert response.status == 200 and seen[-1].bulk is bulk, value
        assert seen[0].flow != seen[2].flow  # a client's bulk work is a flow of its own
        response = await client.post("/v1/systemone", json=ask(), headers={PRIORITY_HEADER: "urgent"})
        assert response.status == 422 and PRIORITY_HEADER in str(await response.json())


async def test_through_the_worker_an_interactive_request_overtakes_a_bulk_backlog(worker_settings):
    """16 bulk requests of one key queued (bulk batches of at most 4 rows), then one interactive request of the same
    key: at most one bulk batch (the one running) is answered between its queueing and its answer."""
    async with worker_client(worker_settings(bulk_max_rows=4, max_per_client=32, max_queue=64)) as (client, service):
        answered: list[str] = []

        async def post(i: int, bulk: bool):
            headers = {PRIORITY_HEADER: "bulk"} if bulk else {}
            response = await client.post("/v1/systemone", json=ask(i, state=f"state {i % 3}"), headers=headers)
            assert response.status == 200
            answered.append("bulk" if bulk else "interactive")

        layers = len(layer_stack(service.model.loaded.model))
        with slow_layers(service, 0.2 / layers):  # each batch about 0.2 s
            backlog = [asyncio.ensure_future(post(i, bulk=True)) for i in range(16)]
            await until(lambda: service.model.scheduler.running and service.model.scheduler.depth == 16)
            interactive = asyncio.ensure_future(post(100, bulk=False))
            scheduler = service.model.scheduler
            await until(  # queued behind the backlog: waiting, or in the batch formed behind the running one
                lambda: any(not job.bulk for job in [*scheduler._pending, *(scheduler._queued or Batch([])).jobs])
            )
            bulk_before = len(answered)
            await interactive
            bulk_meanwhile = len(answered) - 1 - bulk_before
            await asyncio.gather(*backlog)
        assert bulk_meanwhile <= 4, answered
        assert answered.index("interactive") < 9, answered  # well before the backlog drained
