"""OUTPUT and the errors file: append-only JSONL in OpenAI's batch output shape, and resuming from OUTPUT.

Every line is `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`: `response` is what
the stack answered (`error` null); `error` `{"code", "message"}` says why a line got no answer (`response` null).
OUTPUT holds the answered lines (2xx), the errors file the others (as OpenAI's output and error files do).

Durability. A line is written whole, by one write(2) on a file opened O_APPEND, as soon as it is final. A process
killed with SIGKILL loses nothing it wrote: the bytes are the kernel's once write returns. What an OS crash or a
power cut can lose is what was not yet fsync'd: the file is fsync'd every `fsync_interval` seconds while lines
are written (1 s by default; 0: after every line) and when the run ends. On restart, OUTPUT is read first: every
custom_id in it is done and not sent again; a last line cut short (no newline at its end, or not JSON: a write a
crash interrupted) is cut off, and its request is sent again. Any other line that is not an output line stops
the run instead (not a file this command wrote). One run at a time writes an OUTPUT (an flock, released by the
kernel whatever way the process ends).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable


class OutputError(Exception):
    """OUTPUT cannot be resumed or written; str() says why."""


def answered(custom_id: str, status: int, request_id: str | None, body) -> dict:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": request_id, "body": body},
        "error": None,
    }


def unanswered(custom_id: str, code: str, message: str) -> dict:
    return {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def done_ids(path: str) -> tuple[set[str], int]:
    """The custom_ids written to OUTPUT, and the byte length of its whole lines (where a cut-short last line
    begins: the file is truncated there). Raises OutputError for a line in the middle that is not an output line."""
    ids: set[str] = set()
    good = 0
    bad: tuple[int, str] | None = None  # the first bad line: fatal unless it is the last
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if bad is not None:
                raise OutputError(f"{path} line {bad[0]} is not a batch output line ({bad[1]}); not resuming into it")
            problem = _problem(raw)
            if problem:
                bad = (number, problem)
                continue
            ids.add(json.loads(raw)["custom_id"])
            good += len(raw)
    return ids, good


def _problem(raw: bytes) -> str | None:
    if not raw.endswith(b"\n"):
        return "no newline at its end"
    try:
        value = json.loads(raw)
    except ValueError:
        return "not JSON"
    if not isinstance(value, dict) or not isinstance(value.get("custom_id"), str):
        return "no custom_id"
    return None


class ResultFile:
    """An append-only JSONL file of output lines, fsync'd at most every `fsync_interval` seconds (see above)."""

    def __init__(self, path: str, fsync_interval: float = 1.0):
        self.path = path
        self.fsync_interval = max(0.0, fsync_interval)
        self.lines = 0  # written by this run
        self._fd: int | None = None
        self._dirty = False
        self._synced = time.monotonic()

    def open_for_resume(self) -> set[str]:
        """Lock the file (created if missing), cut off a cut-short last line, and return the custom_ids done."""
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{self.path} is being written by another jev batch; wait for it or stop it") from None
        self._fd = fd
        ids, good = done_ids(self.path)
        if os.fstat(fd).st_size > good:
            os.ftruncate(fd, good)
            os.fsync(fd)
        return ids

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise OutputError(f"cannot write {self.path}: {exc.strerror or exc}") from None

    def write(self, record: dict) -> None:
        if self._fd is None:
            self._fd = self._open()
        data = (json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
        while view:  # one write(2) for any line a regular file takes whole; the loop only for the rest
            view = view[os.write(self._fd, view) :]
        self.lines += 1
        self._dirty = True
        if time.monotonic() - self._synced >= self.fsync_interval:
            self.sync()

    def tick(self) -> None:
        """Called periodically: lines written since the last fsync are fsync'd once the interval has passed."""
        if self._dirty and time.monotonic() - self._synced >= self.fsync_interval:
            self.sync()

    def sync(self) -> None:
        if self._fd is not None and self._dirty:
            os.fsync(self._fd)
            self._dirty = False
        self._synced = time.monotonic()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                self.sync()
            os.close(self._fd)
            self._fd = None


class InOrder:
    """Holds finished lines until every line read before them is final (`--ordered`): `done(seq, record)` with the
    line's place in the input (from 0); a None record writes nothing (a line that went to the errors file)."""

    def __init__(self, write: Callable[[dict], None]):
        self._write = write
        self.next = 0
        self._held: dict[int, dict | None] = {}

    def done(self, seq: int, record: dict | None) -> None:
        self._held[seq] = record
        while self.next in self._held:
            record = self._held.pop(self.next)
            if record is not None:
                self._write(record)
            self.next += 1

    @property
    def held(self) -> int:
        return len(self._held)
