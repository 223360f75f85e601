"""`jev batch`: every line of the input sent through the frontend, each answer written as it is final.

The input is read ahead over a bounded window and sent a state's requests together (window.py), at a bounded
concurrency that adapts to the stack's 429/503 (pacing.py), marked bulk (`x-jev-priority: bulk`): the worker serves
interactive callers first and caps the batches it forms of this work. 429, 502, 503, 504 and failed connections are
retried (after Retry-After when the stack says, else after a growing, jittered backoff) up to `max_retries` times.
Answers go to OUTPUT, lines that got none (or an error status) to the errors file (output.py: the shape, resuming,
durability). Exit status: 0 when every line was answered, 1 when some failed, 2 when the run could not start,
130 when interrupted (the lines in flight then are sent again on the next run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO

import aiohttp

from .inputs import CsvSpec, InputError, Line, count_lines, open_text, read_csv, read_jsonl
from .output import InOrder, OutputError, ResultFile, answered, unanswered
from .pacing import Pacer
from .progress import Progress, Tally, summary
from .window import StateWindow

PRIORITY_HEADER = "x-jev-priority"  # jev_common.http.PRIORITY_HEADER (the CLI imports nothing of the services)
RETRIED = (429, 502, 503, 504)
MAX_BACKOFF_S = 30.0
READ_YIELD_EVERY = 1000  # lines read between two yields to the event loop (a resume skips many at once)


@dataclass(frozen=True)
class BatchOptions:
    input: str
    output: str
    errors: str
    url: str
    api_key: str | None = None
    model: str = "jev-latest"
    csv: CsvSpec | None = None  # CSV input (with its questions file); None: JSONL
    concurrency: int = 16
    window: int = 2048
    ordered: bool = False
    max_retries: int = 8
    timeout_s: float = 300.0
    fsync_interval_s: float = 1.0
    progress: bool = True
    progress_every_s: float = 10.0


def errors_path_for(output: str) -> str:
    """out.jsonl -> out.errors.jsonl; anything else gets `.errors.jsonl` appended."""
    return output[: -len(".jsonl")] + ".errors.jsonl" if output.endswith(".jsonl") else output + ".errors.jsonl"


def retry_after(headers) -> float | None:
    raw = headers.get("Retry-After")
    try:
        value = float(raw) if raw is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides
    return value if value is not None and 0 <= value <= 3600 else None


def backoff(attempt: int) -> float:
    return min(MAX_BACKOFF_S, 0.5 * 2**attempt) * random.uniform(0.5, 1.0)


class BatchRun:
    def __init__(self, options: BatchOptions, stderr: IO[str] | None = None):
        self.options = options
        self.stderr = stderr or sys.stderr
        self.tally = Tally()
        self.pacer = Pacer(options.concurrency)
        self.results = ResultFile(options.output, options.fsync_interval_s)
        self.errors = ResultFile(options.errors, options.fsync_interval_s)
        self.window = StateWindow(options.window)
        self.in_order = InOrder(self.results.write) if options.ordered else None
        self.url = options.url.rstrip("/") + "/v1/systemone"
        self._tasks: set[asyncio.Task] = set()
        self._stopping = asyncio.Event()
        self._seq = 0  # lines read for sending or reporting, in input order

    def say(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stderr.write(text + "\n")
            self.stderr.flush()

    async def run(self) -> int:
        try:
            done = self.results.open_for_resume()
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.options.errors)  # the last run's failures are retried now
            handle = open_text(self.options.input)
        except (OutputError, InputError) as exc:
            self.say(f"jev batch: {exc}")
            self.results.close()
            return 2
        self.tally.earlier = len(done)
        counting = asyncio.ensure_future(
            asyncio.to_thread(count_lines, self.options.input, self.options.csv is not None)
        )
        counting.add_done_callback(self._counted)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self._stopping.set)
        stream = self.stderr
        tty = self.options.progress and stream.isatty()
        unicode = (getattr(stream, "encoding", "") or "").lower().replace("-", "") in ("utf8", "utf16", "utf32")
        progress = Progress(self.tally, stream, tty=tty, every=self.options.progress_every_s, unicode=unicode)
        ticker = asyncio.ensure_future(self._tick(progress))
        connector = aiohttp.TCPConnector(limit=self.options.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.options.timeout_s)
        code = 0
        try:
            async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
                try:
                    await self._dispatch(session, self._lines(handle), done)
                except InputError as exc:
                    self.say(f"\njev batch: {exc}")
                    code = 2
                await self._drain()
        finally:
            handle.close()
            ticker.cancel()
            counting.cancel()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(sig)
            self.results.close()
            self.errors.close()
        if self.options.progress:
            progress.finish(self.pacer.in_flight)
        elapsed = time.monotonic() - self.tally.started
        self.say(
            summary(
                self.tally,
                elapsed=elapsed,
                output=self.options.output,
                errors=self.options.errors,
                lowest=self.pacer.lowest,
                maximum=self.pacer.maximum,
            )
        )
        if self._stopping.is_set():
            self.say("jev batch: interrupted; run the same command again to send the lines not in OUTPUT")
            return 130
        return code or (1 if self.tally.failed else 0)

    def _counted(self, future: asyncio.Future) -> None:
        if not future.cancelled() and future.exception() is None:
            self.tally.total = future.result()

    def _lines(self, handle):
        if self.options.csv is not None:
            return read_csv(handle, self.options.csv)
        return read_jsonl(handle, self.options.model)

    # ----- reading and sending ------------------------------------------------------------------
    async def _dispatch(self, session: aiohttp.ClientSession, lines, done: set[str]) -> None:
        seen: set[str] = set()  # custom_ids read this run (a second one is a duplicate)
        exhausted = False
        while not self._stopping.is_set():
            read = 0
            while not exhausted and not self._read_enough():
                line = next(lines, None)
                if line is None:
                    exhausted = True
                    break
                self._admit(line, done, seen)
                read += 1
                if read % READ_YIELD_EVERY == 0:
                    await asyncio.sleep(0)
            if not len(self.window):
                if exhausted:
                    return
                await asyncio.sleep(0.01)  # --ordered: waiting for an earlier line's answer
                continue
            sent_at = await self._acquire()
            if sent_at is None:
                return
            seq, line = self.window.pop()
            task = asyncio.ensure_future(self._send(session, seq, line, sent_at))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _drain(self) -> None:
        """Wait for the lines in flight; on an interrupt, stop them (they are not written: the next run sends them)."""
        stop = asyncio.ensure_future(self._stopping.wait())
        while self._tasks and not self._stopping.is_set():
            await asyncio.wait({*self._tasks, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _read_enough(self) -> bool:
        if self.in_order is not None:  # lines read and not written stay within the window, held ones included
            return self._seq - self.in_order.next >= self.window.limit
        return self.window.full

    async def _acquire(self) -> float | None:
        """A place in flight, or None when the run is stopping."""
        acquire = asyncio.ensure_future(self.pacer.acquire())
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if acquire.done():
            if self._stopping.is_set():
                self.pacer.release()
                return None
            return acquire.result()
        acquire.cancel()
        return None

    def _admit(self, line: Line, done: set[str], seen: set[str]) -> None:
        if line.body is not None and line.custom_id in done:
            self.tally.skipped += 1
            return
        seq = self._seq
        self._seq += 1
        if line.body is None:
            self._fail(seq, unanswered(line.custom_id, "invalid_line", line.error or "invalid line"))
        elif line.custom_id in seen:
            message = f"line {line.number}: custom_id {line.custom_id!r} was used before in this input"
            self._fail(seq, unanswered(line.custom_id, "duplicate_custom_id", message))
        else:
            seen.add(line.custom_id)
            self.window.add(seq, line)

    async def _send(self, session: aiohttp.ClientSession, seq: int, line: Line, sent_at: float) -> None:
        data = json.dumps(line.body).encode()
        headers = {"Content-Type": "application/json", PRIORITY_HEADER: "bulk"}
        if self.options.api_key:
            headers["Authorization"] = f"Bearer {self.options.api_key}"
        attempt = 0
        while True:
            status, body, problem = 0, None, ""
            reply_headers: Mapping[str, str] = {}
            try:
                async with session.post(self.url, data=data, headers=headers) as response:
                    status, reply_headers = response.status, response.headers
                    raw = await response.read()
                body = _json_or_text(raw)
            except (aiohttp.ClientError, TimeoutError) as exc:
                problem = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            finally:
                self.pacer.release()
            if 200 <= status < 300:
                self.pacer.succeeded()
                self.tally.ok += 1
                self.tally.l3(reply_headers.get("x-jev-cache"))
                record = answered(line.custom_id, status, reply_headers.get("x-typesafe-request-id"), body)
                if self.in_order is not None:
                    self.in_order.done(seq, record)
                else:
                    self.results.write(record)
                return
            if (problem or status in RETRIED) and attempt < self.options.max_retries:
                wait = retry_after(reply_headers)
                if status in (429, 503):
                    self.pacer.overloaded(sent_at, hold_s=(wait or 1.0) if status == 503 else 0.0)
                attempt += 1
                self.tally.retries += 1
                await asyncio.sleep(wait if wait is not None else backoff(attempt))
                sent_at = await self.pacer.acquire()
                continue
            if problem:
                record = unanswered(line.custom_id, "request_failed", f"{problem} (after {attempt + 1} attempts)")
            else:
                record = answered(line.custom_id, status, reply_headers.get("x-typesafe-request-id"), body)
            self._fail(seq, record)
            return

    def _fail(self, seq: int, record: dict) -> None:
        self.tally.failed += 1
        self.errors.write(record)
        if self.in_order is not None:
            self.in_order.done(seq, None)

    async def _tick(self, progress: Progress) -> None:
        interval = 0.2 if progress.tty else 1.0
        while True:
            if self.options.progress:
                progress.tick(self.pacer.in_flight)
            self.results.tick()
            self.errors.tick()
            await asyncio.sleep(interval)


def _json_or_text(raw: bytes):
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def run_batch(options: BatchOptions, stderr: IO[str] | None = None) -> int:
    return asyncio.run(BatchRun(options, stderr).run())
