"""The frontend's page: `GET /` (a playground for decisions and a live status view, static files from `static/`,
no build step) and `GET /v1/status`, the status view's JSON.

Every file is served with a Content-Security-Policy that allows nothing but this origin and no inline script or
style, so the page works offline and loads nothing from elsewhere. `/v1/status` names the backends' internal URLs,
so it sits under `/v1/`, behind the API key when keys are on (jev_common.http.auth_middleware); the page asks for
the key and keeps it in its own memory only.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web
from pydantic import ValidationError

from jev_common.errors import DomainError
from jev_common.schema import CacheStats

from .pool import BackendPool, BackendState
from .proxy import Backend
from .settings import Settings
from .status import L3Counts, StatusHistory, l3_counts, latencies_by_backend

log = logging.getLogger("jev_frontend.page")

STATIC_DIR = Path(__file__).parent / "static"
# the page's files and their types: only these are served (no directory listing, no path from the request)
FILES = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
CSP = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'; object-src 'none'"
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
STATUS_PATH = "/v1/status"
CACHE_STATS_TIMEOUT_S = 2.0


class Page:
    """The page's routes over the frontend's pool and backend client; the files are read once, here."""

    def __init__(self, settings: Settings, pool: BackendPool, client: Backend, history: StatusHistory | None = None):
        self.settings = settings
        self.pool = pool
        self.client = client
        self.history = history or StatusHistory()
        self.files = {name: (STATIC_DIR / name).read_bytes() for name in FILES}

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/", self.index),
            web.get("/static/{name}", self.static),
            web.get(STATUS_PATH, self.status),
        ]

    async def index(self, _request: web.Request) -> web.Response:
        return self._file("index.html")

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in FILES or name == "index.html":
            raise web.HTTPNotFound()
        return self._file(name)

    def _file(self, name: str) -> web.Response:
        return web.Response(body=self.files[name], headers={"Content-Type": FILES[name], **PAGE_HEADERS})

    async def status(self, _request: web.Request) -> web.Response:
        """Every backend: its model, health, queue, in-flight requests, decisions/s, p50/p99 and L3 hit ratio."""
        if self.settings.single_backend:
            await self.pool.refresh()  # nothing polls a lone backend's health: look now
        backends = list(self.pool.backends.values())
        l3 = await self._l3(backends)
        now, baseline = self.history.record(latencies_by_backend(self.client.metrics.backend_latency), l3)
        rates = self.history.rates([b.url for b in backends], now, baseline)
        return web.json_response(
            {
                "default_model": self.pool.default_model() or None,
                "routing": "single" if self.settings.single_backend else self.settings.routing,
                "health_interval_s": self.settings.health_interval_s,
                "window_s": round(self.history.covered_s, 1),
                "backends": [{**b.describe(), **rates[b.url].to_json()} for b in backends],
            },
            headers={"Cache-Control": "no-store"},
        )

    async def _l3(self, backends: list[BackendState]) -> dict[str, L3Counts]:
        """The L3 counters of every backend in rotation, read from its /v1/cache/stats at once (best effort)."""
        up = [b for b in backends if b.up]
        found = await asyncio.gather(*(self._cache_stats(b) for b in up))
        return {b.url: counts for b, counts in zip(up, found) if counts is not None}

    async def _cache_stats(self, backend: BackendState) -> L3Counts | None:
        try:
            answer = await self.client.call(
                "GET",
                "/v1/cache/stats",
                endpoint="cache_stats",
                url=backend.url,
                timeout_s=min(self.settings.timeout_s, CACHE_STATS_TIMEOUT_S),
            )
        except DomainError as exc:
            log.info("cache stats of %s not read: %s", backend.url, exc.message)
            return None
        if answer.status != 200:
            return None
        try:
            return l3_counts(CacheStats.model_validate_json(answer.body))
        except ValidationError:
            return None
