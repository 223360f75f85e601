"""Where one request's time went: named stages, each with its start and end on `time.perf_counter()`, marked by
the code that ran them (the one timing hook). A service observes them as a histogram by stage (the worker's
`jev_worker_stage_seconds{stage}`); tracing turns the same points into spans."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Stage:
    name: str
    start: float
    end: float
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)


class Timeline:
    """The stages of one request, in the order they were marked. `mark(name)` closes a stage that began where the
    previous one ended (or at the timeline's start), so consecutive marks leave no time uncounted."""

    __slots__ = ("start", "stages", "_last")

    def __init__(self, start: float | None = None) -> None:
        self.start = time.perf_counter() if start is None else start
        self.stages: list[Stage] = []
        self._last = self.start

    def add(self, name: str, start: float, end: float, **attrs: Any) -> None:
        self.stages.append(Stage(name, start, end, attrs))
        self._last = max(self._last, end)

    def mark(self, name: str, **attrs: Any) -> float:
        """Close stage `name` now, from the end of the last stage; returns now."""
        now = time.perf_counter()
        self.add(name, self._last, now, **attrs)
        return now

    @property
    def last(self) -> float:
        """Where the next stage begins: the end of the latest one."""
        return self._last

    def seconds(self) -> dict[str, float]:
        """Total seconds per stage name."""
        out: dict[str, float] = {}
        for stage in self.stages:
            out[stage.name] = out.get(stage.name, 0.0) + stage.seconds
        return out
