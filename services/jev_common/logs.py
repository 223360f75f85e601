"""One log format for every service: each line on stderr is one JSON object
`{"ts", "level", "logger", "msg"[, "exc"]}`.

Besides the logging module's records, a service's stderr carries what libraries print themselves
(transformers' own handler, Python warnings, an uncaught exception's traceback); with
`capture_stderr=True` sys.stderr becomes a line writer that wraps each such line as a JSON object
(logger `stderr`), and progress bars (tqdm, huggingface_hub) are switched off: they are not log lines.
"""

from __future__ import annotations

import io
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

from .config import LOG_LEVEL


def json_line(level: str, logger: str, msg: str, exc: str | None = None) -> str:
    entry = {"ts": round(time.time(), 3), "level": level, "logger": logger, "msg": msg}
    if exc:
        entry["exc"] = exc
    return json.dumps(entry)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        exc = self.formatException(record.exc_info) if record.exc_info else None
        return json_line(record.levelname.lower(), record.name, record.getMessage(), exc)


class JsonLinesStream(io.TextIOBase):
    """A text stream that writes each complete line it is given to `target` as a JSON log line
    (carriage returns end a line too, so a stray progress bar cannot glue lines together)."""

    def __init__(self, target: Any, logger: str = "stderr", level: str = "warning") -> None:
        super().__init__()
        self.target = target
        self.logger = logger
        self.level = level
        self._buffer = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._buffer += text.replace("\r\n", "\n").replace("\r", "\n")
            *lines, self._buffer = self._buffer.split("\n")
            for line in lines:
                if line.strip():
                    self.target.write(json_line(self.level, self.logger, line) + "\n")
            self.target.flush()
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if self._buffer.strip():
                self.target.write(json_line(self.level, self.logger, self._buffer) + "\n")
            self._buffer = ""
            self.target.flush()

    def fileno(self) -> int:  # faulthandler and friends write to the real descriptor
        return int(self.target.fileno())

    def isatty(self) -> bool:
        return False

    @property
    def encoding(self) -> str:  # type: ignore[override]  # the target's, read-only
        return str(getattr(self.target, "encoding", "utf-8"))


def _log_uncaught(
    logger: logging.Logger,
) -> tuple[Callable[[type[BaseException], BaseException, TracebackType | None], None], Callable[[Any], None]]:
    def hook(exc_type: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if issubclass(exc_type, KeyboardInterrupt):
            sys.__excepthook__(exc_type, exc, tb)
            return
        logger.critical("uncaught %s: %s", exc_type.__name__, exc, exc_info=(exc_type, exc, tb))

    def thread_hook(args: Any) -> None:  # threading.ExceptHookArgs
        if args.exc_type is SystemExit:
            return
        logger.critical(
            "uncaught %s in thread %s: %s",
            args.exc_type.__name__,
            getattr(args.thread, "name", "?"),
            args.exc_value,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    return hook, thread_hook


PROGRESS_BARS_OFF = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TQDM_DISABLE": "1"}


def no_progress_bars() -> None:
    """Switch tqdm's and huggingface_hub's progress bars off unless the environment says otherwise. tqdm reads
    TQDM_DISABLE once, when it is imported (transformers' GGUF loader uses it directly), so a service calls this
    before importing torch or transformers; setup_logging calls it too, for whatever is imported later."""
    for key, value in PROGRESS_BARS_OFF.items():
        os.environ.setdefault(key, value)


def setup_logging(service: str, *, capture_stderr: bool = True) -> logging.Logger:
    """JSON-lines logging on stderr at JEV_LOG_LEVEL; see the module doc for capture_stderr."""
    target = sys.stderr.target if isinstance(sys.stderr, JsonLinesStream) else sys.stderr
    if capture_stderr:
        no_progress_bars()
        sys.stderr = JsonLinesStream(target)
    handler = logging.StreamHandler(target)
    handler.setFormatter(_JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LOG_LEVEL.get().upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.captureWarnings(True)  # warnings.warn -> the `py.warnings` logger, as JSON
    log = logging.getLogger(service)
    if capture_stderr:
        sys.excepthook, threading.excepthook = _log_uncaught(log)
    return log
