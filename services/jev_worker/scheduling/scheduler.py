"""Admission, deadlines, single flight, fairness and micro-batching in front of the one model thread.

Requests are prepared concurrently on the event loop; model work runs serially on a single-thread
executor. While the model is busy, new jobs queue; when it frees, the scheduler forms the next batch, matches
each of its prefixes in the prefix cache (L3, which the scheduler owns: prefix_cache.py), hands the runner the
batch with the states to start from, and inserts the states the runner computed for misses.

- **Overlap.** Where the device runs asynchronously (CUDA, the simulated device), a batch's run on the model thread
  launches its forwards and returns with the batch's device event; a second thread (`completer`) waits on that
  event and hands the answers back, while the model thread launches the next batch behind it. So the next batch is
  formed while one is on the device, and a batch's answers are read out while the next runs. A batch launches ahead
  of the one on the device (at most `max_launched` on it, 2) only once it has at least as many rows as the last one
  launched; until then it keeps taking jobs, and it launches the moment the device is done. Launching ahead keeps the
  device fed when the host is the bottleneck (c=64: the model thread's launch no longer waits for the interpreter
  in the gap between batches), and holding a small batch back keeps batches whole when the device is (c=8: launching
  every batch at once split eight callers into batches of 2.7 and cost 20% of the throughput; benchmarks/RESULTS.md).

- **Batches, by prefix.** A batch takes jobs up to the row budget and the token budget (the first job whatever
  its size). Its first job is the fair queue's first (below): whatever else is waiting, no job waits for more
  batches than there are jobs fair-ahead of it, so a popular prefix cannot starve the rest. The rest of the
  batch is filled prefix-first (`prefix_aware`, JEV_SCHEDULE=prefix): jobs whose prefix is already in the
  batch, then jobs whose prefix state is resident in L3, then the others, each in fair order; a job whose
  prefix the batch already holds or L3 has costs only its rows' tokens. Same-prefix rows then run after one
  state, and a prefix is computed once per batch instead of once per job (`fifo`: fair order only). The token
  budget keeps a batch short: a batch runs while any of its jobs is wanted, so one waiting caller keeps its
  batch-mates' rows computing.

- **Single flight.** A job is the work for one prepared prompt (prefix, rows, labels). A request whose
  prompt is already queued or running joins that job instead of computing it again (a client's retry, or
  two clients asking the same thing), and a job that finished for nobody while it lingered (below) answers a
  retry from its kept result.
- **Wanted.** A job is wanted while one of its waiters waits and the latest of their deadlines has not passed.
  When the last waiter leaves, the job is abandoned at once, unless that caller said it retries (the SDK's
  headers, `Caller.retries`): then it stays wanted for `linger_s` (the SDK's longest backoff) so that the
  retry can join it. Jobs nobody wants are dropped before a batch starts; a running batch nobody wants stops
  at its next layer or prefill chunk (abandon.py).
- **Fairness.** Each job belongs to a client (API key, or address without keys). A client may have at most
  `max_per_client` jobs queued or running (429 past it, the others still served), and batches are filled by
  start-time fair queuing: a job's virtual start is the later of the scheduler's virtual time and the end of
  its client's previous job (a job costs its rows), and the smallest start goes first. A client that floods
  queues behind its own work; a client arriving then starts at the current virtual time, next in line.
- **Bulk.** A caller may mark its work bulk (`x-jev-priority: bulk`, what `jev batch` sends): it only lowers the
  caller's own priority. A client's bulk work is a flow of its own (with its own `max_per_client`, so it never
  queues the same client's interactive requests behind it) whose jobs cost their rows divided by `bulk_weight`;
  bulk jobs together hold at most half the queue. A batch is of one class, its first job's: a batch led by
  interactive work takes no bulk job, and a bulk batch takes at most `bulk_max_rows` rows and `bulk_max_tokens`
  tokens, so an interactive request waits behind at most one capped bulk batch.

`abort` (on shutdown) answers every job at once and stops the running batch the same way.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import count

from jev_common.errors import ClientOverloaded, DeadlineExceeded, ForwardFailed, Overloaded, ShuttingDown

from ..protocols import Engine, PrefixCache
from .abandon import ForwardAbandoned, LayerChecks
from .batch import BatchOutput, BatchTiming, EngineItem, EngineResult, plan_by_prefix
from .prefix_cache import L3PrefixCache

log = logging.getLogger("jev.worker.scheduler")

ANONYMOUS = "-"


@dataclass(frozen=True)
class Caller:
    """Who waits for a job: the fairness key, and whether the client retries a request it gave up on."""

    client: str = ANONYMOUS
    retries: bool = False
    bulk: bool = False  # the caller marked its work bulk (x-jev-priority: bulk)

    @property
    def flow(self) -> str:
        """The fair queue's flow: the client, and its bulk work as a flow of its own."""
        return f"{self.client} (bulk)" if self.bulk else self.client


def flight_key(item: EngineItem) -> str:
    """The work an item asks for (its prepared request's work key)."""
    return item.prepared.work_key


def _retrieve(future: asyncio.Future) -> None:
    """A job's exception is read even when nobody awaited it (no 'exception was never retrieved' log)."""
    if not future.cancelled():
        future.exception()


@dataclass(eq=False)  # identity: a job is one piece of work
class Flight:
    item: EngineItem
    key: str
    client: str  # the fair queue's flow (Caller.flow)
    expires: float  # time.monotonic() of the latest waiter's deadline
    future: asyncio.Future
    seq: int = 0
    start: float = 0.0  # virtual start (fair queuing): jobs are taken smallest first
    waiters: int = 0
    linger_until: float = 0.0  # wanted without waiters until then (a retrying caller left)
    aborted: bool = False
    bulk: bool = False  # a bulk caller's job (counted against the bulk share of the queue)
    promoted: bool = False  # an interactive caller joined it: batched as interactive work from then on
    queued_at: float = field(default_factory=time.perf_counter)

    @property
    def rows(self) -> int:
        return len(self.item.prepared.rows)

    @property
    def tokens(self) -> int:
        return self.item.prepared.prompt_tokens

    @property
    def prefix_key(self) -> str:
        return self.item.prepared.prefix_key

    @property
    def row_tokens(self) -> int:
        """What the job costs a batch whose prefix state it shares: its rows' tokens."""
        return self.tokens - len(self.item.prepared.prefix_ids)

    @property
    def batched_as_bulk(self) -> bool:
        return self.bulk and not self.promoted

    def wanted(self) -> bool:
        """Someone waits (or may come back) for this job's answer (safe to ask from the model thread)."""
        now = time.monotonic()
        return not self.aborted and now < self.expires and (self.waiters > 0 or now < self.linger_until)


@dataclass(frozen=True)
class KeptResult:
    result: EngineResult
    until: float


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        executor: ThreadPoolExecutor,
        *,
        max_queue: int,
        batching: bool,
        max_batch_rows: int,
        max_wait_ms: float,
        checks: LayerChecks | None = None,
        max_batch_tokens: int = 0,
        prefix_cache: PrefixCache | None = None,
        prefix_aware: bool = True,
        max_per_client: int = 0,
        linger_s: float = 5.0,
        bulk_weight: float = 0.25,
        bulk_max_rows: int = 8,
        bulk_max_tokens: int = 1024,
        on_batch: Callable[[int, int, float, float | None], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        on_abandoned: Callable[[int, ForwardAbandoned], None] | None = None,
        on_event: Callable[[str, int], None] | None = None,
        completer: ThreadPoolExecutor | None = None,
        max_launched: int = 2,
    ):
        self.engine = engine
        self.executor = executor
        # waits on launched batches' device events (a thread of its own: the model thread launches meanwhile)
        self.completer = completer or ThreadPoolExecutor(1, thread_name_prefix="jev-device-wait")
        self.max_launched = max(1, max_launched)
        self.prefix_cache = prefix_cache if prefix_cache is not None else L3PrefixCache()
        self.prefix_aware = prefix_aware
        self.max_queue = max(1, max_queue)
        self.max_per_client = max(0, max_per_client)  # 0: no per-client limit
        self.linger_s = max(0.0, linger_s)
        self.batching = batching
        self.max_batch_rows = max(1, max_batch_rows)
        self.max_batch_tokens = max(0, max_batch_tokens)  # 0: rows alone bound a batch
        self.max_wait_s = max(0.0, max_wait_ms) / 1000
        if not bulk_weight > 0:
            raise ValueError(f"bulk_weight must be > 0, got {bulk_weight}")
        self.bulk_weight = bulk_weight
        self.bulk_max_rows = max(1, bulk_max_rows)
        self.bulk_max_tokens = max(0, bulk_max_tokens)  # 0: the batch token budget alone
        self.checks = checks
        self._on_batch = on_batch
        self._on_depth = on_depth
        self._on_abandoned = on_abandoned
        self._on_event = on_event  # (event, rows): joined, kept, computed, answered, unwanted, client_limited
        self._pending: list[Flight] = []
        self._running: Batch | None = None  # the batch on the model thread now
        self._launched: list[Batch] = []  # launched on the device, waited on by the completer
        self._queued: Batch | None = None  # the next batch, handed to the executor, still taking jobs
        self._handoff = threading.RLock()  # the model thread starts `_queued` / the loop adds to it: one at a time
        # the batches launched and not done, oldest first (the model thread adds, the completer takes); notified when
        # one is done and when the queued batch grows (_may_launch)
        self._on_device: list[Batch] = []
        self._launchable = threading.Condition(self._handoff)
        self._company_timer: asyncio.TimerHandle | None = None
        self._flights: dict[str, Flight] = {}  # key -> the job queued or running for it
        self._kept: dict[str, KeptResult] = {}  # key -> a result finished for nobody while a retry may come
        self._per_client: Counter[str] = Counter()  # jobs queued or running per client (per flow)
        self._bulk_jobs = 0  # bulk jobs queued or running
        self._finish: dict[str, float] = {}  # client -> virtual finish of its latest job (fair queuing)
        self._vtime = 0.0  # virtual time: the start of the latest job taken
        self._seq = count()
        self._aborting = False
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def depth(self) -> int:
        return len(self._pending) + sum(len(batch.jobs) for batch in self._in_flight())

    @property
    def running(self) -> bool:
        """A batch is on the model thread or on the device (the watchdog's question)."""
        return self._running is not None or bool(self._launched)

    @property
    def running_jobs(self) -> list[Flight]:
        """The jobs of the batches on the model thread and on the device now."""
        with self._handoff:
            batches = [batch for batch in (self._running, *self._launched) if batch is not None]
        return [job for batch in batches for job in batch.jobs]

    def _in_flight(self) -> list[Batch]:
        with self._handoff:
            return [batch for batch in (self._running, *self._launched, self._queued) if batch is not None]

    @property
    def load(self) -> int:
        """Work someone waits for: queued jobs (a job nobody waits for leaves the queue at once) and the
        running batch's wanted jobs. Admission counts this, so that callers who left do not fill the queue."""
        return len(self._pending) + sum(1 for batch in self._in_flight() for job in batch.jobs if job.wanted())

    def abort(self) -> None:
        """Answer every job now (503, shutting down) and stop the running batch at its next layer."""
        self._aborting = True
        for job in [*self._pending, *(job for batch in self._in_flight() for job in batch.jobs)]:
            job.aborted = True
            self._settle(job, error=ShuttingDown("worker is shutting down; retry on another replica"))
        for job in self._pending:
            self._release(job)
        self._pending.clear()
        self._report_depth()

    async def idle(self) -> None:
        """Return once no batch is on the model thread."""
        await self._idle.wait()

    async def stop(self) -> None:
        self.abort()
        if self._company_timer is not None:
            self._company_timer.cancel()
            self._company_timer = None
        self.completer.shutdown(wait=False, cancel_futures=True)

    # ----- admission ----------------------------------------------------------------------------
    async def submit(self, item: EngineItem, timeout_s: float, caller: Caller = Caller()) -> EngineResult:
        if self._aborting:
            raise ShuttingDown("worker is shutting down; retry on another replica")
        key = flight_key(item)
        kept = self._kept_result(key)
        if kept is not None:
            self._event("kept", len(item.prepared.rows))
            return kept
        job = self._flights.get(key)
        if job is not None and not job.future.done() and not job.aborted:
            self._event("joined", job.rows)
            if job.batched_as_bulk and not caller.bulk:  # an interactive caller never waits in the bulk lane
                job.promoted = True
                job.start = min(job.start, max(self._vtime, self._finish.get(caller.flow, 0.0)))
        else:
            job = self._new_job(item, key, caller.flow, timeout_s, bulk=caller.bulk)
        job.waiters += 1
        job.expires = max(job.expires, time.monotonic() + timeout_s)
        self._dispatch()  # a new job starts now if the model thread is idle, or joins the batch formed behind it
        left = "answered"
        try:
            return await asyncio.wait_for(asyncio.shield(job.future), timeout=timeout_s)
        except TimeoutError:
            left = "deadline"
            raise DeadlineExceeded(f"no decision within the deadline of {timeout_s:g} s") from None
        except asyncio.CancelledError:
            left = "gone"  # the client went away: don't spend the model on it, unless it comes back
            raise
        finally:
            job.waiters -= 1
            if left == "gone" and caller.retries and self.linger_s:
                job.linger_until = max(job.linger_until, time.monotonic() + self.linger_s)
            if not job.wanted():  # queued for nobody: leaves the queue (or the batch not started yet) now
                self._withdraw(job)

    def _withdraw(self, job: Flight) -> None:
        if job in self._pending:
            self._pending.remove(job)
        else:
            with self._handoff:
                queued = self._queued
                if queued is None or job not in queued.jobs:
                    return  # running, or done: the batch runs on for the others in it
                queued.remove(job)
        self._drop(job)
        self._report_depth()

    def _new_job(self, item: EngineItem, key: str, client: str, timeout_s: float, bulk: bool = False) -> Flight:
        """A job of the fair queue's flow `client` (Caller.flow); `bulk`: a bulk caller's job."""
        if self.load >= self.max_queue:
            raise Overloaded(f"worker queue is full ({self.max_queue} requests); retry shortly")
        if bulk and self._bulk_jobs >= max(1, self.max_queue // 2):
            raise Overloaded(f"bulk work holds half the worker queue ({self._bulk_jobs} requests); retry shortly")
        if self.max_per_client and self._per_client[client] >= self.max_per_client:
            self._event("client_limited", len(item.prepared.rows))
            raise ClientOverloaded(
                f"this client has {self._per_client[client]} requests queued or running, the most "
                f"one client may (JEV_MAX_PER_CLIENT); retry once one is answered"
            )
        loop = asyncio.get_running_loop()
        start = max(self._vtime, self._finish.get(client, 0.0))  # start-time fair queuing, a job costs its rows
        self._finish[client] = start + len(item.prepared.rows) / (self.bulk_weight if bulk else 1.0)
        job = Flight(
            item=item,
            key=key,
            client=client,
            expires=time.monotonic() + timeout_s,
            future=loop.create_future(),
            seq=next(self._seq),
            start=start,
            bulk=bulk,
        )
        job.future.add_done_callback(_retrieve)
        self._flights[key] = job
        self._per_client[client] += 1
        self._bulk_jobs += bulk
        self._pending.append(job)
        self._report_depth()
        return job

    def _kept_result(self, key: str) -> EngineResult | None:
        now = time.monotonic()
        for stale in [k for k, kept in self._kept.items() if kept.until <= now]:
            del self._kept[stale]
        kept = self._kept.pop(key, None)
        return kept.result if kept is not None else None

    def _release(self, job: Flight) -> None:
        """The job leaves the queue or the model thread: its client's slot and its flight entry are free."""
        self._per_client[job.client] -= 1
        self._bulk_jobs -= job.bulk
        if self._per_client[job.client] <= 0:
            del self._per_client[job.client]
            if self._finish.get(job.client, 0.0) <= self._vtime:  # nothing of its own ahead: forget it
                self._finish.pop(job.client, None)
        if self._flights.get(job.key) is job:
            del self._flights[job.key]

    def _drop(self, job: Flight) -> None:
        """A queued job nobody waits for (its deadline passed, or its callers left) leaves without a forward."""
        self._settle(
            job,
            error=DeadlineExceeded(
                "deadline passed while queued"
                if time.monotonic() >= job.expires
                else "nobody waits for this decision any more"
            ),
        )
        self._release(job)

    def _settle(self, job: Flight, result: EngineResult | None = None, error: Exception | None = None) -> None:
        if job.future.done():
            return
        if error is not None or result is None:
            job.future.set_exception(error if error is not None else RuntimeError("a job settled without a result"))
            return
        job.future.set_result(result)
        if job.waiters:
            self._event("answered", job.rows)
            return
        # finished for nobody (its caller left after the batch began, which ran on for the others in it)
        self._event("unwanted", job.rows)
        if job.linger_until > time.monotonic():  # while its caller may retry: kept
            self._kept[job.key] = KeptResult(result, job.linger_until)

    def _event(self, event: str, rows: int) -> None:
        if self._on_event:
            self._on_event(event, rows)

    # ----- batches ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Keep the model thread fed, on the event loop, without waiting: with nothing running, a batch of what is
        queued starts at once; while one runs, the next is formed behind it (already handed to the model thread's
        executor) and keeps taking the jobs that arrive until the model thread starts it. Batches so form from what
        queued while the previous one ran, and the next starts the moment the last ends, with no event-loop hop
        between them."""
        if self._aborting or not self._pending:
            return
        with self._handoff:
            queued = self._queued
            if queued is not None:  # formed, not started yet: the model thread cannot start it meanwhile
                if queued.bulk and any(not job.batched_as_bulk for job in self._pending):
                    # interactive work waits behind at most the bulk batch running: the one behind it is formed anew
                    self._pending.extend(queued.jobs)
                    queued.reform(self._take_batch(interactive_first=True))
                elif self.batching:
                    self._fill_from(queued)
                self._launchable.notify_all()  # it may now be big enough to launch ahead
                return
            idle = self._running is None and not self._launched
        if idle and self._wait_for_company():
            return
        jobs = self._take_batch()
        if not jobs:
            return
        batch = Batch(jobs)
        with self._handoff:
            self._queued = batch
        self._idle.clear()
        loop = asyncio.get_running_loop()
        # the model thread launches the batch and goes on with whatever was handed to it next; the batch's answers
        # come back once its device event is reached (_complete)
        self.executor.submit(self._run, batch).add_done_callback(
            lambda launched: self._on_launched(batch, launched, loop)
        )
        self._report_depth()

    def _wait_for_company(self) -> bool:
        """JEV_MAX_WAIT_MS > 0 (0 by default): a lone job on an idle model thread waits that long for others to batch
        with; True while it should wait (a timer dispatches it then)."""
        if not (self.batching and self.max_wait_s and len(self._pending) == 1):
            return False
        waited = time.perf_counter() - self._pending[0].queued_at
        if waited >= self.max_wait_s:
            return False
        if self._company_timer is None:
            self._company_timer = asyncio.get_running_loop().call_later(self.max_wait_s - waited, self._company_due)
        return True

    def _company_due(self) -> None:
        self._company_timer = None
        self._dispatch()

    def _run(self, batch: Batch) -> tuple[BatchOutput, float]:
        """On the model thread, once the batch may launch (_may_launch; until then it stays queued, taking jobs): the
        batch taken (no job joins it now), each prefix planned from its match in the prefix cache, the runner's
        forwards launched (each layer first asking whether the batch is wanted), the states the plan keeps inserted.
        -> the output (its results' L3 outcomes set, its device event to wait on) and when the batch started. The
        batch counts as on the device until it is done (_complete)."""
        with self._launchable:
            while not self._may_launch(batch):
                if self._aborting:
                    raise ForwardAbandoned(0, 0)
                self._launchable.wait(timeout=0.05)
            self._on_device.append(batch)
        try:
            return self._launch(batch)
        except BaseException:
            self._done_on_device(batch)
            raise

    def _may_launch(self, batch: Batch) -> bool:
        """An idle device takes any batch; a busy one takes another (up to `max_launched`) only as big as the last."""
        on_device = self._on_device
        return not on_device or (len(on_device) < self.max_launched and batch.rows >= on_device[-1].rows)

    def _done_on_device(self, batch: Batch) -> None:
        with self._launchable:
            self._on_device.remove(batch)
            self._launchable.notify_all()

    def _launch(self, batch: Batch) -> tuple[BatchOutput, float]:
        started = time.perf_counter()
        with self._handoff:
            self._running = batch
            if self._queued is batch:
                self._queued = None
            jobs = list(batch.jobs)
        try:
            if not jobs:  # every caller left while it waited behind the previous batch
                return BatchOutput([]), started
            if self._aborting or not any(job.wanted() for job in jobs):
                raise ForwardAbandoned(0, 0)
            items = [job.item for job in jobs]
            groups, outcomes = plan_by_prefix(items, self.prefix_cache, self.engine.reuses_prefix)
            if self.checks is None:
                out = self.engine.run(items, groups)
            else:
                with self.checks.watching(lambda: not self._aborting and any(job.wanted() for job in jobs)):
                    out = self.engine.run(items, groups)
            for key, state in out.states.items():
                self.prefix_cache.insert(key, state)
            for item, result in zip(items, out.results):
                outcome = outcomes[item.prepared.prefix_key]
                # a miss whose rows continued the state its group computed in this batch is a hit for them
                result.l3 = "hit" if outcome == "miss" and result.cached_tokens else outcome
            return out, started
        finally:
            with self._handoff:
                self._running = None
                self._launched.append(batch)  # until _finished: on the device, or failed and being answered

    def _on_launched(self, batch: Batch, launched: Future, loop: asyncio.AbstractEventLoop) -> None:
        """On the model thread (or the loop, if the launch was already done): a launched batch's device event is
        waited on by the completer; a batch that ran synchronously, or failed, is answered at once."""
        if launched.cancelled() or launched.exception() is not None:
            loop.call_soon_threadsafe(self._finished, batch, launched)
            return
        out, started = launched.result()
        if out.ready is None:
            done: Future = Future()
            done.set_result(self._complete(batch, out, started))
            loop.call_soon_threadsafe(self._finished, batch, done)
            return
        try:
            completed = self.completer.submit(self._complete, batch, out, started)
        except RuntimeError:  # the completer was shut down (the worker stops): the batch is answered as cancelled
            self._done_on_device(batch)
            cancelled: Future = Future()
            cancelled.cancel()
            loop.call_soon_threadsafe(self._finished, batch, cancelled)
            return
        completed.add_done_callback(lambda done: loop.call_soon_threadsafe(self._finished, batch, done))

    def _complete(
        self, batch: Batch, out: BatchOutput, started: float
    ) -> tuple[list[EngineResult], float, float, float | None]:
        """Once the batch's device event is reached (on the completer, where the device runs asynchronously):
        -> the results, when the batch started and ended, the device's seconds for it. The device is done with it."""
        try:
            if out.ready is not None:
                out.ready()
            return out.results, started, time.perf_counter(), out.device_s
        finally:
            self._done_on_device(batch)

    def _finished(self, batch: Batch, done: Future) -> None:
        """On the event loop, the moment the model thread is done with `batch` (the next one already runs there):
        its jobs answered, the next batch formed."""
        with self._handoff:
            if self._running is batch:
                self._running = None
            if batch in self._launched:
                self._launched.remove(batch)
            if self._queued is batch:  # never started: the executor was shut down
                self._queued = None
        jobs, rows = batch.jobs, batch.rows
        error = None if done.cancelled() else done.exception()
        if done.cancelled():
            for job in jobs:
                self._settle(job, error=ShuttingDown("worker is shutting down"))
        elif isinstance(error, ForwardAbandoned):
            log.info(
                "stopped a batch of %d (%d rows) nobody waits for before layer %d of %d%s",
                len(jobs),
                rows,
                error.layer,
                error.layers,
                f" (prefill chunk {error.chunk})" if error.chunk else "",
            )
            if self._on_abandoned:
                self._on_abandoned(rows, error)
            for job in jobs:
                self._settle(
                    job,
                    error=ShuttingDown("worker is shutting down")
                    if self._aborting
                    else DeadlineExceeded("no decision within the deadline"),
                )
        elif error is not None:
            log.error("model forward failed for a batch of %d", len(jobs), exc_info=error)
            failed = ForwardFailed(f"model forward failed: {type(error).__name__}: {error}")
            for job in jobs:
                self._settle(job, error=failed)
        elif jobs:
            results, started, finished, device_s = done.result()
            self._event("computed", rows)
            for job, result in zip(jobs, results):
                result.timing = BatchTiming(job.queued_at, started, finished, device_s, len(jobs), rows)
                self._settle(job, result)
            if self._on_batch:
                self._on_batch(len(jobs), rows, finished - started, device_s)
        for job in jobs:
            self._release(job)
        if self._running is None and not self._launched and self._queued is None:
            self._idle.set()
        self._dispatch()
        self._report_depth()

    def _report_depth(self) -> None:
        if self._on_depth:
            self._on_depth(self.depth)

    def _live(self) -> list[Flight]:
        """The queued jobs someone still waits for, in fair order (smallest virtual start first); the others are
        dropped now, without a forward."""
        live = []
        for job in self._pending:
            if job.future.done() or not job.wanted():
                self._drop(job)
                continue
            live.append(job)
        return [job for _, _, job in sorted((job.start, job.seq, job) for job in live)]

    def _take_batch(self, interactive_first: bool = False) -> list[Flight]:
        """A new batch: led by the fair queue's first job (`interactive_first`: its first interactive one), then
        filled (`_fill_from`)."""
        order = self._live()
        if not order:
            self._pending = []
            return []
        first = next((job for job in order if not job.batched_as_bulk), order[0]) if interactive_first else order[0]
        self._vtime = max(self._vtime, first.start)
        batch = Batch([first])
        self._pending = [job for job in order if job is not first]
        if self.batching:
            self._fill_from(batch)
        return batch.jobs

    def _fill_from(self, batch: Batch) -> None:
        """Queued jobs join `batch` while its row and token budgets allow (its first job whatever its size), prefix
        first (`_affinity`), in fair order within; a job whose prefix the batch holds or L3 has costs its rows'
        tokens. On the event loop, for a batch the model thread has not started."""
        max_rows, max_tokens = self._budget(batch.bulk)
        rest = [job for job in self._live() if job.batched_as_bulk == batch.bulk]  # a batch is of its first job's class
        resident = {key for key in {job.prefix_key for job in rest} if self.prefix_cache.resident(key)}
        taken = set()
        while rest:
            job = rest.pop(min(range(len(rest)), key=lambda k: (self._affinity(rest[k], batch.prefixes, resident), k)))
            shares = job.prefix_key in batch.prefixes or job.prefix_key in resident
            cost = job.row_tokens if shares else job.tokens
            if batch.rows + job.rows <= max_rows and (not max_tokens or batch.tokens + cost <= max_tokens):
                batch.add(job, cost)
                taken.add(id(job))
        self._pending = [job for job in self._pending if id(job) not in taken]

    def _budget(self, bulk: bool) -> tuple[int, int]:
        """A batch's row and token budgets (tokens 0: unbounded): a bulk batch's are capped further."""
        if not bulk:
            return self.max_batch_rows, self.max_batch_tokens
        tokens = [t for t in (self.max_batch_tokens, self.bulk_max_tokens) if t]
        return min(self.max_batch_rows, self.bulk_max_rows), min(tokens, default=0)

    def _affinity(self, job: Flight, prefixes: set[str], resident: set[str]) -> int:
        """Which jobs fill a batch first (smaller first, fair order within): prefix-aware, the batch's own
        prefixes (0), then prefixes resident in L3 (1), then the others (2); fifo, fair order alone."""
        if not self.prefix_aware:
            return 0
        return 0 if job.prefix_key in prefixes else 1 if job.prefix_key in resident else 2


class Batch:
    """The jobs of one batch: formed on the event loop and, until the model thread starts it, still taking the jobs
    that arrive meanwhile and losing those whose callers leave (the scheduler's handoff lock keeps the model thread
    from starting it meanwhile)."""

    def __init__(self, jobs: list[Flight]):
        self.reform(jobs)

    def reform(self, jobs: list[Flight]) -> None:
        self.jobs = list(jobs)
        self.bulk = bool(jobs) and jobs[0].batched_as_bulk  # its first job's class (bulk has budgets of its own)
        self._count()

    def _count(self) -> None:
        """Its row and token budgets used (a job whose prefix an earlier job brings costs its rows' tokens)."""
        self.rows = sum(job.rows for job in self.jobs)
        self.prefixes: set[str] = set()
        self.tokens = 0
        for job in self.jobs:
            self.tokens += job.row_tokens if job.prefix_key in self.prefixes else job.tokens
            self.prefixes.add(job.prefix_key)

    def add(self, job: Flight, cost: int) -> None:
        self.jobs.append(job)
        self.rows += job.rows
        self.tokens += cost
        self.prefixes.add(job.prefix_key)

    def remove(self, job: Flight) -> None:
        self.jobs.remove(job)
        self._count()
