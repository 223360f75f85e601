"""How many requests `jev batch` keeps in flight: bounded, and adapting to the stack's answers.

At most `maximum` at once (`--concurrency`). A 429 or 503 halves the limit (once per round trip: answers to
requests sent before the last cut do not cut again), each success grows it by 1/limit (one per limit's worth of
successes), never past `maximum` nor under 1. A 503's Retry-After (the stack is unavailable, not just busy) also
holds every new send that long; a 429's delays only the request that got it (the runner waits it before the retry).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


class Pacer:
    def __init__(self, maximum: int, clock: Callable[[], float] = time.monotonic):
        self.maximum = max(1, maximum)
        self.limit = float(self.maximum)
        self.lowest = self.maximum  # the smallest limit reached, for the summary
        self.in_flight = 0
        self._clock = clock
        self._cut_at = float("-inf")
        self._hold_until = 0.0
        self._freed = asyncio.Event()

    async def acquire(self) -> float:
        """Wait for a free place and take it; returns when the request is sent (for `overloaded`)."""
        while True:
            now = self._clock()
            if now < self._hold_until:
                await asyncio.sleep(self._hold_until - now)
                continue
            if self.in_flight < int(self.limit):
                self.in_flight += 1
                return now
            self._freed.clear()
            await self._freed.wait()

    def release(self) -> None:
        self.in_flight -= 1
        self._freed.set()

    def succeeded(self) -> None:
        self.limit = min(float(self.maximum), self.limit + 1.0 / self.limit)

    def overloaded(self, sent_at: float, hold_s: float = 0.0) -> None:
        """A 429 or 503 to a request sent at `sent_at`; `hold_s`: no new send before that many seconds pass."""
        now = self._clock()
        if sent_at > self._cut_at:  # sent after the last cut (answers to those sent before it: already counted)
            self.limit = max(1.0, self.limit / 2)
            self.lowest = min(self.lowest, int(self.limit))
            self._cut_at = now
        if hold_s > 0:
            self._hold_until = max(self._hold_until, now + hold_s)
