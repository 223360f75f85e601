"""How far a loading worker is, for /health and the local stack's waiting line: the step (k of the steps this load
runs), what it is doing, and for how long, so a 30-second weight load reads as progress and a stuck step shows its age.

A step this load will not run (L3 reuse is measured on CUDA only) is skipped as soon as that is known, so the
counter counts every step it shows: 1/4, 2/4, 3/4, 4/4 on a CPU, never 2/5 then 5/5."""

from __future__ import annotations

import time

MEASURE_REUSE = "measuring L3 reuse on the device"
STEPS = (
    "checking the checkpoint",
    "loading the weights",
    "building the prompt layout, head and engine",
    MEASURE_REUSE,
    "warming up",
)


class LoadProgress:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.step: str | None = None
        self.detail = ""
        self.since = clock()
        self.skipped: set[str] = set()

    def _known(self, step: str) -> None:
        if step not in STEPS:
            raise ValueError(f"unknown loading step {step!r}")

    def skip(self, step: str) -> None:
        """This load will not run `step`: it leaves the count."""
        self._known(step)
        if step != self.step:
            self.skipped.add(step)

    def enter(self, step: str, detail: str = "") -> None:
        self._known(step)
        self.skipped.discard(step)  # a step that runs after all is counted again
        self.step, self.detail, self.since = step, detail, self.clock()

    @property
    def steps(self) -> tuple[str, ...]:
        """The steps this load runs, in order."""
        return tuple(step for step in STEPS if step not in self.skipped)

    def describe(self) -> str:
        if self.step is None:
            return "starting"
        detail = f" {self.detail}" if self.detail else ""
        steps = self.steps
        return (
            f"step {steps.index(self.step) + 1}/{len(steps)}: {self.step}{detail} "
            f"({self.clock() - self.since:.0f} s in this step)"
        )
