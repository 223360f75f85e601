"""What `jev batch` says while it runs and when it ends, on stderr (stdout stays free).

On a terminal one line redrawn in place a few times a second: a bar, lines done of the input's, percent, rate (lines
per second over the last 30 s), ETA, errors, the L3 hit ratio of the answers, and the requests in flight. Elsewhere
(a log, a pipe) the same figures as a plain line every `every` seconds. At the end, a summary.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO

RATE_WINDOW_S = 30.0


@dataclass
class Tally:
    total: int | None = None  # requests in the input (None: not known, or not yet counted)
    earlier: int = 0  # custom_ids already in OUTPUT when the run began
    skipped: int = 0  # lines of the input skipped for that
    ok: int = 0
    failed: int = 0
    retries: int = 0
    l3_hits: int = 0
    l3_lookups: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def finished(self) -> int:
        return self.ok + self.failed

    def l3(self, cache_header: str | None) -> None:
        """Count an answer's `x-jev-cache` (`l1=hit,l3=miss`): a hit, miss or bypass is an L3 lookup."""
        levels = dict(part.split("=", 1) for part in (cache_header or "").split(",") if "=" in part)
        outcome = levels.get("l3", "").strip()
        if outcome in ("hit", "miss", "bypass"):
            self.l3_lookups += 1
            self.l3_hits += outcome == "hit"

    @property
    def l3_ratio(self) -> float | None:
        return self.l3_hits / self.l3_lookups if self.l3_lookups else None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


class Progress:
    def __init__(self, tally: Tally, stream: IO[str], *, tty: bool, every: float = 10.0, unicode: bool = True):
        self.tally = tally
        self.stream = stream
        self.tty = tty
        self.every = every
        self.unicode = unicode
        self._samples: deque[tuple[float, int]] = deque()
        self._last_line = time.monotonic()  # off a terminal, the first line after `every` seconds
        self._drawn = False

    def rate(self, now: float) -> float:
        """Lines finished per second over the last RATE_WINDOW_S (since the start, before that)."""
        done = self.tally.finished
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= RATE_WINDOW_S:
            self._samples.popleft()
        then, before = self._samples[0]
        if now - then < 1e-6:
            then, before = self.tally.started, 0
        return (done - before) / max(now - then, 1e-6)

    def figures(self, in_flight: int, now: float | None = None) -> dict:
        now = time.monotonic() if now is None else now
        t = self.tally
        rate = self.rate(now)
        done = t.earlier + t.finished
        eta = None
        if t.total is not None and rate > 0:
            eta = max(0, t.total - done) / rate
        return {"done": done, "total": t.total, "rate": rate, "eta": eta, "in_flight": in_flight}

    def render(self, in_flight: int, now: float | None = None, width: int = 24) -> str:
        f = self.figures(in_flight, now)
        t = self.tally
        parts = []
        if f["total"]:
            share = min(1.0, f["done"] / f["total"])
            parts.append(self._bar(share, width) + f" {f['done']:,}/{f['total']:,} {100 * share:5.1f}%")
        else:
            parts.append(f"{f['done']:,} lines")
        parts.append(f"{f['rate']:.1f}/s")
        parts.append(f"ETA {_duration(f['eta'])}" if f["eta"] is not None else "ETA -")
        parts.append(f"errors {t.failed:,}")
        parts.append(f"L3 hit {100 * t.l3_ratio:.0f}%" if t.l3_ratio is not None else "L3 hit -")
        parts.append(f"in flight {in_flight}")
        return "  ".join(parts)

    def _bar(self, share: float, width: int) -> str:
        if not self.unicode:
            filled = int(share * width)
            return "[" + "#" * filled + " " * (width - filled) + "]"
        eighths = int(share * width * 8)
        full, part = divmod(eighths, 8)
        partial = " ▏▎▍▌▋▊▉"[part] if full < width else ""
        return "▕" + ("█" * full + partial).ljust(width) + "▏"

    def tick(self, in_flight: int) -> None:
        """Redraw on a terminal; elsewhere a line every `every` seconds."""
        now = time.monotonic()
        if self.tty:
            self._write("\r" + self.render(in_flight, now) + "\x1b[K")
            self._drawn = True
        elif now - self._last_line >= self.every:
            self._last_line = now
            self._write("jev batch: " + self.render(in_flight, now) + "\n")

    def finish(self, in_flight: int) -> None:
        if self.tty:
            self._write("\r" + self.render(in_flight) + "\x1b[K\n")

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed terminal must not stop the run
            pass


def summary(tally: Tally, *, elapsed: float, output: str, errors: str, lowest: int, maximum: int) -> str:
    t = tally
    rate = t.finished / elapsed if elapsed > 0 else 0.0
    plural = "" if t.finished == 1 else "s"
    head = (
        f"jev batch: {t.finished:,} line{plural} in {_duration(elapsed)} ({rate:.1f}/s): {t.ok:,} answered to {output}"
    )
    lines = [head + (f", {t.failed:,} failed to {errors}" if t.failed else ", none failed")]
    details = []
    if t.skipped:
        details.append(f"{t.skipped:,} skipped (already in {output})")
    if t.l3_ratio is not None:
        details.append(f"L3 hit {100 * t.l3_ratio:.1f}% ({t.l3_hits:,} of {t.l3_lookups:,})")
    if t.retries:
        details.append(f"{t.retries:,} retries (429/502/503/504 or no connection)")
    details.append(f"concurrency {lowest}-{maximum}" if lowest < maximum else f"concurrency {maximum}")
    lines.append("  " + "; ".join(details))
    return "\n".join(lines)
