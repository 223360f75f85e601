"""The frontend's backends: which exist (configured, or discovered in the index), which model each
serves, which are healthy, and how loaded each is.

Every `JEV_FRONTEND_HEALTH_INTERVAL_S` each backend's `GET /health` is polled: 200 puts it in rotation,
anything else (503 while loading, a refused connection) takes it out until it answers 200 again; no answer within
the interval takes it out once it happens `JEV_FRONTEND_HEALTH_MISSES` times in a row (a busy worker answers late: a
single late probe of a loaded worker took the soak's only replica out and 502'd the decisions it was computing). A
backend whose connection is refused during a request, or that answers a decision 503 because it is draining or not
ready, is taken out at once. A backend whose probe cannot connect, or misses its probes, is unreachable (a dead
host, a cut link): the requests in flight on it are sent to another replica. A discovered
backend stays while it is in the index or still answers 200 (an index restarted empty does not empty the pool), and
leaves once neither holds. Its model is read from `GET /v1/models` (the entry that is not the `jev-latest` alias);
its index namespace, worker id and queue depth from its health detail or its index registration.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from jev_common.errors import BackendTimeout, DomainError, ModelNotServed
from jev_common.index import IndexUnavailable, namespace
from jev_common.index.workers import WorkerDirectory
from jev_common.schema import LATEST_ALIAS

from .proxy import Backend, BackendMetrics
from .settings import Settings

log = logging.getLogger("jev_frontend.pool")


@dataclass
class BackendState:
    url: str
    model: str = ""  # "" until learned from /v1/models
    source: str = "static"  # or "discovered"
    worker_id: str = ""
    ns: str = ""  # the worker's cache-index namespace (its checkpoint), for warm-prefix lookups
    up: bool = True  # in rotation; a fresh backend is tried until its first health answer says otherwise
    checked: bool = False
    in_flight: int = 0
    queue_depth: int = 0  # the worker's own, as of its latest health answer or registration
    cold_assigned: int = 0  # new states sent here (the tie-break of power-of-two-choices)
    models: list[dict] = field(default_factory=list)  # its /v1/models entries
    error: str | None = None
    missed: int = 0  # health probes in a row it left unanswered within the interval
    changed_at: float = field(default_factory=time.monotonic)
    # set while it is out of rotation because it stopped answering (its health probe failed to connect or timed
    # out): the requests in flight on it will get no answer, so they are sent to another replica
    unreachable: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def load(self) -> int:
        return max(self.in_flight, self.queue_depth)

    def describe(self) -> dict:
        return {
            "url": self.url,
            "model": self.model or None,
            "state": "up" if self.up else "down",
            "source": self.source,
            "worker_id": self.worker_id or None,
            "in_flight": self.in_flight,
            "queue_depth": self.queue_depth,
            "error": self.error,
        }


class BackendPool:
    def __init__(self, settings: Settings, client: Backend, metrics: BackendMetrics, directory: WorkerDirectory | None):
        self.settings = settings
        self.client = client
        self.metrics = metrics
        self.directory = directory
        self.backends: dict[str, BackendState] = {
            url: BackendState(url, model) for model, url in settings.static_backends()
        }
        self._task: asyncio.Task | None = None
        self._refreshing: asyncio.Task | None = None

    # ----- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        try:  # a first look before serving, bounded: a dead backend must not hold the frontend's start
            await asyncio.wait_for(self.refresh(), max(1.0, self.settings.health_interval_s))
        except TimeoutError:
            pass
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="jev-frontend-health")

    async def name_backends(self) -> None:
        """Read each backend's model from its /v1/models once, bounded (for the start-up log of a frontend that
        polls nothing: JEV_BACKEND_URL alone); a backend that does not answer in time stays unnamed."""
        try:
            await asyncio.wait_for(
                asyncio.gather(*(self._learn_models(b) for b in self.backends.values() if not b.model)),
                max(1.0, self.settings.health_interval_s),
            )
        except TimeoutError:
            pass

    async def close(self) -> None:
        for task in (self._task, self._refreshing):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        self._task = None

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            try:
                await self.refresh()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad round
                log.exception("backend health round failed")

    async def refresh(self) -> None:
        """Discovery (when on), then every backend's health at once; concurrent callers share one round."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.get_running_loop().create_task(self._refresh())
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        if self.settings.discovery:
            await self._discover()
        await asyncio.gather(*(self.check(b) for b in list(self.backends.values())))
        self.metrics.up.set(1 if any(b.up for b in self.backends.values()) else 0)

    # ----- discovery ----------------------------------------------------------------------------
    async def _discover(self) -> None:
        if self.directory is None:
            return
        try:
            records = await self.directory.list()
        except IndexUnavailable:
            return  # keep what is known; health checks still run
        seen = set()
        for record in records:
            url = str(record["url"]).rstrip("/")
            seen.add(url)
            backend = self.backends.get(url)
            if backend is None:
                backend = self.backends[url] = BackendState(url, source="discovered")
                log.info("discovered backend %s (%s)", url, record.get("model"))
            backend.model = backend.model or str(record.get("model") or "")
            backend.worker_id = str(record.get("worker_id") or backend.worker_id)
            backend.ns = str(record.get("ns") or backend.ns)
        for url, backend in list(self.backends.items()):
            if backend.source == "discovered" and url not in seen and not backend.up:
                # gone from the index and not answering: a stopped or dead worker. One that still answers 200 is
                # kept (an index restarted empty lists nobody until the workers announce themselves again)
                log.info("backend %s left the index and is out of rotation; removed", url)
                del self.backends[url]
                self._forget_series(url, backend.model or "?")

    # ----- health -------------------------------------------------------------------------------
    async def check(self, backend: BackendState) -> tuple[int, bytes] | None:
        """One health probe; returns (status, body) when the backend answered."""
        timeout = min(self.settings.timeout_s, max(0.5, self.settings.health_interval_s))
        try:
            answer = await self.client.call("GET", "/health", endpoint="health", timeout_s=timeout, url=backend.url)
        except BackendTimeout as exc:  # no answer in time: busy (it answers late) or cut off (it never does)
            backend.missed += 1
            if backend.missed < self.settings.health_misses:
                backend.error = f"{exc.message} ({backend.missed} of {self.settings.health_misses} in a row)"
                return None
            self._unreachable(backend, exc.message)
            return None
        except DomainError as exc:  # refused or broken: nothing answers there
            self._unreachable(backend, exc.message)
            return None
        backend.missed = 0
        detail: dict[str, Any] = {}
        try:
            body = json.loads(answer.body)
            found = body.get("detail") if isinstance(body, dict) else None
            detail = found if isinstance(found, dict) else {}
        except ValueError:
            pass
        if isinstance(detail.get("checkpoint"), str):
            backend.ns = namespace(detail["checkpoint"])
        if detail.get("worker_id"):
            backend.worker_id = str(detail["worker_id"])
        if isinstance(detail.get("queue_depth"), int):
            backend.queue_depth = detail["queue_depth"]
        up = answer.status == 200
        if up and not backend.models:
            await self._learn_models(backend)
        self._set_up(backend, up and bool(backend.model), None if up else f"GET /health answered {answer.status}")
        return answer.status, answer.body

    async def _learn_models(self, backend: BackendState) -> None:
        try:
            answer = await self.client.call(
                "GET", "/v1/models", endpoint="models", url=backend.url, timeout_s=min(self.settings.timeout_s, 5.0)
            )
            models = json.loads(answer.body).get("models") if answer.status == 200 else None
        except (DomainError, ValueError, AttributeError):
            return
        if not isinstance(models, list):
            return
        backend.models = [m for m in models if isinstance(m, dict) and m.get("name") not in (None, LATEST_ALIAS)]
        if backend.models and not backend.model:
            backend.model = str(backend.models[0]["name"])

    def _unreachable(self, backend: BackendState, error: str) -> None:
        """Out of rotation, and the requests in flight on it sent to another replica."""
        self._set_up(backend, False, error)
        backend.unreachable.set()

    def _set_up(self, backend: BackendState, up: bool, error: str | None) -> None:
        backend.checked = True
        backend.error = error
        if up != backend.up:
            backend.changed_at = time.monotonic()
            log.info(
                "backend %s (%s) %s%s",
                backend.url,
                backend.model or "?",
                "back in rotation" if up else "taken out",
                f": {error}" if error else "",
            )
        backend.up = up
        if up:
            backend.unreachable.clear()
        if backend.model:
            self._forget_series(backend.url, "?")  # its model is known now: no series left under "?"
        self.metrics.backend_up.labels(backend.url, backend.model or "?").set(1 if up else 0)

    def _forget_series(self, url: str, model: str) -> None:
        """Drop a backend's jev_frontend_route_backend_up series, so a removed backend does not stay 0 forever (the
        no-healthy-backend alert reads it)."""
        self.metrics.backend_up.remove(url, model)

    def mark_down(self, backend: BackendState, reason: str) -> None:
        """A request could not connect: out of rotation until its health answers 200 again."""
        self._set_up(backend, False, reason)

    # ----- models -------------------------------------------------------------------------------
    def default_model(self) -> str:
        if self.settings.default_model:
            return self.settings.default_model
        for model, url in self.settings.static_backends():
            name = model or self.backends.get(url, BackendState(url)).model
            if name:
                return name
        served = sorted({b.model for b in self.backends.values() if b.model})
        return served[0] if served else ""

    def served_models(self) -> list[str]:
        """Models with at least one backend in rotation."""
        return sorted({b.model for b in self.backends.values() if b.up and b.model})

    def known_models(self) -> set[str]:
        return {b.model for b in self.backends.values() if b.model}

    async def resolve(self, name: str | None) -> str:
        """The model a request names (None: the single-question form), with `jev-latest` = the default;
        400 api_usage_error when no backend serves it."""
        wanted = self.default_model() if name in (None, LATEST_ALIAS) else name
        if (not wanted or wanted not in self.known_models()) and any(not b.model for b in self.backends.values()):
            await self.refresh()  # a backend whose model is not known yet may serve it
            wanted = self.default_model() if name in (None, LATEST_ALIAS) else name
        if wanted and wanted in self.known_models():
            return wanted
        served = sorted(self.known_models())
        raise ModelNotServed(
            f"model {name!r} is not served here; served: "
            f"{', '.join(map(repr, served)) or 'none yet'} (and {LATEST_ALIAS!r} = {self.default_model()!r}); "
            "GET /v1/models lists them"
        )

    def replicas(self, model: str) -> list[BackendState]:
        return [b for b in self.backends.values() if b.model == model]

    def model_infos(self) -> list[dict]:
        """GET /v1/models: every model served by a backend in rotation, then `jev-latest`."""
        seen: dict[str, dict] = {}
        for backend in self.backends.values():
            if backend.up:
                for info in backend.models or (
                    [{"name": backend.model, "description": backend.model, "release_date": "unknown"}]
                    if backend.model
                    else []
                ):
                    seen.setdefault(str(info["name"]), info)
        out = [seen[name] for name in sorted(seen)]
        default = self.default_model()
        if default in seen:
            made_by = {
                k: seen[default][k] for k in ("x_revision", "x_code_version", "x_modality") if k in seen[default]
            }
            out.append(
                {
                    "name": LATEST_ALIAS,
                    "description": f"alias of {default}",
                    "release_date": seen[default].get("release_date", "unknown"),
                    **made_by,
                }
            )
        return out
