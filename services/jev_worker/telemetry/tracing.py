"""The worker's spans (jev_common.tracing): the request's server span (the middleware, continued from the frontend's
traceparent), and under it the request's timeline (jev_common.timeline) as spans with the stages' own start and end:
the points jev_worker_stage_seconds observes, so a trace and the stage metrics tell the same time.

    admission        parse + image asset lookups + prepare (the job, its prompt built or taken from L1, bounds)
      asset lookup   one per image: its asset key (the preencoder's `encode` span names the keys it made)
    queue wait       from the job's submission to its batch's start on the model thread
    batch            the batch's run: rows, requests, the prefix cache's outcome (L3 hit, miss, bypass, off)
      device forward the forwards (a simulated device's wait where one is measured, else the whole run)
    readout          from the model thread's end to the typed answers
    respond          the response built

Off, `record` is one attribute test."""

from __future__ import annotations

from jev_common.timeline import Timeline
from jev_common.tracing import Tracing

ADMISSION = ("parse", "asset", "prepare")
BATCH_ATTRIBUTES = {"rows": "jev.batch.rows", "requests": "jev.batch.requests", "l3": "jev.cache.l3"}


class WorkerSpans:
    def __init__(self, tracing: Tracing):
        self.tracing = tracing

    def middlewares(self) -> list:
        return self.tracing.middlewares()

    def record(self, timeline: Timeline) -> None:
        """The timeline's stages as children of the current span (the request's)."""
        if not self.tracing.enabled or not timeline.stages:
            return
        offset_ns = self.tracing.clock_offset_ns()  # once: stages that meet make spans that meet

        def record(name: str, start: float, end: float, **attributes):
            return self.tracing.record(name, start, end, offset_ns=offset_ns, **attributes)

        stages = timeline.stages
        admitted = [s for s in stages if s.name in ADMISSION]
        if admitted:
            seconds = {f"jev.stage.{s.name}_s": round(s.seconds, 6) for s in admitted if s.name != "asset"}
            admission = record("admission", admitted[0].start, max(s.end for s in admitted), **seconds)
            for stage in admitted:
                if stage.name == "asset":
                    attributes = {f"jev.{k}" if k != "key" else "jev.asset.key": v for k, v in stage.attrs.items()}
                    record("asset lookup", stage.start, stage.end, parent=admission, **attributes)
        host = None  # a simulated device's batch stage: the host's part of the run, before its device stage
        for stage in stages:
            if stage.name == "queue":
                record("queue wait", stage.start, stage.end)
            elif stage.name == "batch":
                host = stage
            elif stage.name == "device":
                attributes = {BATCH_ATTRIBUTES[k]: v for k, v in stage.attrs.items() if k in BATCH_ATTRIBUTES}
                batch = record("batch", host.start if host else stage.start, stage.end, **attributes)
                record("device forward", stage.start, stage.end, parent=batch)
                host = None
            elif stage.name in ("readout", "respond"):
                record(stage.name, stage.start, stage.end)

    async def shutdown(self) -> None:
        await self.tracing.shutdown()
