"""Admission, deadlines, single flight, fairness and micro-batching in front of the one model thread.

Requests are prepared concurrently on the event loop; model work runs serially on a single-thread
executor. While the model is busy, new jobs queue; when it frees, the scheduler forms the next batch, matches
each of its prefixes in the prefix cache (L3, which the scheduler owns: prefix_cache.py), hands the runner the
batch with the states to start from, and inserts the states the runner computed for misses.

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
import hashlib
import logging
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import count

from jev_common.errors import ClientOverloaded, DeadlineExceeded, ForwardFailed, Overloaded, ShuttingDown

from ..protocols import Engine, PrefixCache
from .abandon import ForwardAbandoned, LayerChecks
from .batch import EngineItem, EngineResult, group_by_prefix
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
    """The work an item asks for: its prefix key (checkpoint, images, prefix ids), rows and their labels."""
    prepared = item.prepared
    digest = hashlib.sha256(prepared.prefix_key.encode())
    digest.update(repr((prepared.rows, prepared.row_labels)).encode())
    return digest.hexdigest()


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
        on_batch: Callable[[int, int, float], None] | None = None,
        on_depth: Callable[[int], None] | None = None,
        on_abandoned: Callable[[int, ForwardAbandoned], None] | None = None,
        on_event: Callable[[str, int], None] | None = None,
    ):
        self.engine = engine
        self.executor = executor
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
        self._batch: list[Flight] = []  # the batch on the model thread now
        self._flights: dict[str, Flight] = {}  # key -> the job queued or running for it
        self._kept: dict[str, KeptResult] = {}  # key -> a result finished for nobody while a retry may come
        self._per_client: Counter[str] = Counter()  # jobs queued or running per client (per flow)
        self._bulk_jobs = 0  # bulk jobs queued or running
        self._finish: dict[str, float] = {}  # client -> virtual finish of its latest job (fair queuing)
        self._vtime = 0.0  # virtual time: the start of the latest job taken
        self._seq = count()
        self._aborting = False
        self._wakeup = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task | None = None

    @property
    def depth(self) -> int:
        return len(self._pending) + len(self._batch)

    @property
    def running(self) -> bool:
        return bool(self._batch)

    @property
    def load(self) -> int:
        """Work someone waits for: queued jobs (a job nobody waits for leaves the queue at once) and the
        running batch's wanted jobs. Admission counts this, so that callers who left do not fill the queue."""
        return len(self._pending) + sum(1 for job in self._batch if job.wanted())

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="jev-scheduler")

    def abort(self) -> None:
        """Answer every job now (503, shutting down) and stop the running batch at its next layer."""
        self._aborting = True
        for job in [*self._pending, *self._batch]:
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
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

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
            if not job.wanted() and job in self._pending:  # queued for nobody: leaves the queue now
                self._pending.remove(job)
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
        self._wakeup.set()
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
        if error is not None:
            job.future.set_exception(error)
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
    def _run(self, batch: list[Flight]) -> list[EngineResult]:
        """On the model thread: each prefix matched in the cache, the runner's forwards (each layer first asking
        whether the batch is wanted), the states computed for misses inserted."""
        items = [job.item for job in batch]
        groups = group_by_prefix(items, self.prefix_cache, self.engine.reuses_prefix)
        if self.checks is None:
            out = self.engine.run(items, groups)
        else:
            with self.checks.watching(lambda: not self._aborting and any(job.wanted() for job in batch)):
                out = self.engine.run(items, groups)
        for key, state in out.states.items():
            self.prefix_cache.insert(key, state)
        return out.results

    def _report_depth(self) -> None:
        if self._on_depth:
            self._on_depth(self.depth)

    def _take_batch(self) -> list[Flight]:
        live = []
        for job in self._pending:
            if job.future.done() or not job.wanted():
                self._drop(job)
                continue
            live.append(job)
        if not live:
            self._pending = []
            return []
        order = [job for _, _, job in sorted((job.start, job.seq, job) for job in live)]  # fair: smallest start
        first = order[0]
        self._vtime = max(self._vtime, first.start)
        batch, rows, tokens = [first], first.rows, first.tokens
        if self.batching:
            bulk = first.batched_as_bulk
            max_rows, max_tokens = self._budget(bulk)
            prefixes = {first.prefix_key}
            rest = [job for job in order[1:] if job.batched_as_bulk == bulk]  # a batch is of its first job's class
            resident = {key for key in {job.prefix_key for job in rest} if self.prefix_cache.resident(key)}
            while rest:
                job = rest.pop(min(range(len(rest)), key=lambda k: (self._affinity(rest[k], prefixes, resident), k)))
                shares = job.prefix_key in prefixes or job.prefix_key in resident
                cost = job.row_tokens if shares else job.tokens
                if rows + job.rows <= max_rows and (not max_tokens or tokens + cost <= max_tokens):
                    batch.append(job)
                    prefixes.add(job.prefix_key)
                    rows += job.rows
                    tokens += cost
        taken = set(map(id, batch))
        self._pending = [job for job in live if id(job) not in taken]
        return batch

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
                self._batch = batch
                self._idle.clear()
                self._report_depth()
                started = time.perf_counter()
                rows = sum(j.rows for j in batch)
                try:
                    results = await loop.run_in_executor(self.executor, self._run, batch)
                except ForwardAbandoned as stopped:
                    log.info(
                        "stopped a batch of %d (%d rows) nobody waits for before layer %d of %d%s",
                        len(batch),
                        rows,
                        stopped.layer,
                        stopped.layers,
                        f" (prefill chunk {stopped.chunk})" if stopped.chunk else "",
                    )
                    if self._on_abandoned:
                        self._on_abandoned(rows, stopped)
                    for job in batch:
                        self._settle(
                            job,
                            error=ShuttingDown("worker is shutting down")
                            if self._aborting
                            else DeadlineExceeded("no decision within the deadline"),
                        )
                except Exception as exc:  # noqa: BLE001 - a failed forward fails its requests, not the worker
                    log.exception("model forward failed for a batch of %d", len(batch))
                    error = ForwardFailed(f"model forward failed: {type(exc).__name__}: {exc}")
                    for job in batch:
                        self._settle(job, error=error)
                else:
                    self._event("computed", rows)
                    for job, result in zip(batch, results):
                        self._settle(job, result)
                finally:
                    for job in batch:
                        self._release(job)
                    self._batch = []
                    self._idle.set()
                    self._report_depth()
                if self._on_batch:
                    self._on_batch(len(batch), rows, time.perf_counter() - started)
