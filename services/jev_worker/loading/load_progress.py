"""How far a loading worker is, for /health and the local stack's waiting line: the step (k of the known steps),
what it is doing, and for how long, so a 30-second weight load reads as progress and a stuck step shows its age."""

from __future__ import annotations

import time

STEPS = (
    "checking the checkpoint",
    "loading the weights",
    "building the prompt layout, head and engine",
    "measuring L3 reuse on the device",
    "warming up",
)


class LoadProgress:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.step: str | None = None
        self.detail = ""
        self.since = clock()

    def enter(self, step: str, detail: str = "") -> None:
        if step not in STEPS:
            raise ValueError(f"unknown loading step {step!r}")
        self.step, self.detail, self.since = step, detail, self.clock()

    def describe(self) -> str:
        if self.step is None:
            return "starting"
        detail = f" {self.detail}" if self.detail else ""
        return (
            f"step {STEPS.index(self.step) + 1}/{len(STEPS)}: {self.step}{detail} "
            f"({self.clock() - self.since:.0f} s in this step)"
        )
