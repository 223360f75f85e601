"""Health that tells the truth: is the worker making progress?

A worker is stalled when a batch is on the model thread and no layer (or prefill chunk: each runs every layer)
has started for `stall_s`, or when its event loop was blocked for `stall_s` (a heartbeat coming back late; while
the loop is blocked nothing answers at all, so a liveness probe times out, and for 10 s (or `stall_s`) after it health
still says what happened). A long request is not a stall: its layers keep finishing. Health answers 503
`stalled` naming the reason, so that an orchestrator's liveness probe restarts the worker.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

log = logging.getLogger("jev.worker.watchdog")

HEARTBEAT_S = 0.1
BLOCKED_REPORT_S = 10.0  # health names a blocked loop this long after, so that a probe every few seconds sees it


class Watchdog:
    def __init__(self, stall_s: float, running: Callable[[], bool], last_progress: Callable[[], float], metrics=None):
        self.stall_s = stall_s
        self._running = running
        self._last_progress = last_progress
        self._metrics = metrics
        self._blocked: tuple[float, float] | None = None  # (when the loop came back, how long it was blocked)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self.stall_s > 0:
            self._task = asyncio.get_running_loop().create_task(self._beat(), name="jev-watchdog")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _beat(self) -> None:
        while True:
            expected = time.monotonic() + HEARTBEAT_S
            await asyncio.sleep(HEARTBEAT_S)
            lag = max(0.0, time.monotonic() - expected)
            if self._metrics is not None:
                self._metrics.loop_lag.set(lag)
            if lag >= self.stall_s:
                log.error("the event loop was blocked for %.1f s", lag)
                self._blocked = (time.monotonic(), lag)
            self.problem()  # keeps the gauges current between health checks

    def progress_age(self) -> float:
        return max(0.0, time.monotonic() - self._last_progress()) if self._running() else 0.0

    def problem(self) -> str | None:
        """Why the worker is stalled, or None."""
        if self.stall_s <= 0:
            return None
        age = self.progress_age()
        reason = None
        if age >= self.stall_s:
            reason = (
                f"no layer or prefill chunk finished for {age:.1f} s while a batch runs (JEV_STALL_S={self.stall_s:g})"
            )
        elif self._blocked is not None and time.monotonic() - self._blocked[0] < max(self.stall_s, BLOCKED_REPORT_S):
            reason = f"the event loop was blocked for {self._blocked[1]:.1f} s (JEV_STALL_S={self.stall_s:g})"
        if self._metrics is not None:
            self._metrics.progress_age.set(age)
            self._metrics.stalled.set(1 if reason else 0)
        return reason
