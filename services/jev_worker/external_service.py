"""The worker for a recipe whose backend runs elsewhere (backends/external.py): no model, engine or
scheduler here. Each System One request is translated by the readout (`request_body` / `answers`),
posted to the external server within the worker's deadline, and answered in this API's shape; /health
is the external server's health (503 naming it while it is down, or while it says a server it needs,
such as CLM's embeddings server, is down)."""
from __future__ import annotations

import asyncio
import time

from jev_common.errors import ApiError, DomainError, domain_error_type
from jev_common.schema import SystemOneRequest, SystemOneResponse

from . import envelope
from .registration import WorkerRegistration
from .serving import build_serving, serves_externally
from .service import WorkerService

CACHE_HEADER = {"x-jev-cache": "l1=off,l3=off"}


def make_service(settings) -> WorkerService:
    """The service for `settings`: this one when the recipe's family is answered externally, else WorkerService
    (which reports an unknown family in /health)."""
    return (ExternalWorkerService if serves_externally(settings.recipe) else WorkerService)(settings)


class ExternalWorkerService(WorkerService):
    async def start(self) -> None:
        try:
            self.serving = build_serving(self.recipe)
            self._connect_index(asyncio.get_running_loop())
            self.state = "ok"
            self.registration = WorkerRegistration(self.index, self._registration_record,
                                                   self.settings.register_ttl_s)
            self.registration.start()
        except Exception as exc:  # noqa: BLE001 - health must say why the worker is not ready
            self.state = "unavailable"
            self.error = f"{type(exc).__name__}: {exc}"

    async def stop(self) -> None:
        await super().stop()
        if self.serving is not None:
            await self.serving.backend.close()

    def _ready(self) -> None:
        if self.state != "ok":
            raise ApiError(503, "not_ready", f"worker is {self.state}" + (f": {self.error}" if self.error else ""))

    async def systemone(self, request: SystemOneRequest, parts: dict[str, bytes] | None = None
                        ) -> tuple[SystemOneResponse, dict[str, str]]:
        self._ready()
        if not self.accepts_model(request.model):
            raise ApiError(400, "api_usage_error", f"model {request.model!r} is not served here; this worker serves "
                           f"{self.recipe.name!r}; GET /v1/models lists them")
        started = time.perf_counter()
        outcome = "error"
        try:
            if envelope.image_refs(request, parts or {}):
                raise ApiError(422, "image_not_supported", f"model {self.recipe.name} is text-only; send a text state")
            readout = self.serving.readout
            raw = await self.serving.backend.post("/v1/systemone", readout.request_body(request),
                                                  self.settings.deadline_s)
            answers, usage = readout.answers(request, raw)
            elapsed = time.perf_counter() - started
            outcome = "ok"
            self.metrics.decision_seconds.labels("systemone").observe(elapsed)
            return SystemOneResponse(model=self.recipe.name, answers=answers, usage=usage,
                                     x_elapsed_seconds=elapsed), dict(CACHE_HEADER)
        except (ApiError, DomainError) as exc:
            outcome = exc.type if isinstance(exc, ApiError) else domain_error_type(exc)
            raise
        finally:
            self.metrics.decisions.labels("systemone", outcome).inc()

    async def health(self) -> tuple[int, dict]:
        code, body = await super().health()
        if self.state != "ok":
            return code, body
        reachable, remote = await self.serving.backend.health()
        body["detail"]["external"] = remote
        problem = None if reachable else remote
        if reachable and isinstance(remote, dict) and remote.get("embedder") is False:
            problem = f"{self.serving.backend.endpoint} reports its embeddings server down (embedder: false)"
        if problem is None:
            return code, body
        body["status"] = "unavailable"
        body["detail"]["error"] = f"external server: {problem}"
        return 503, body
