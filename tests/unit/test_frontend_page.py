"""The frontend's page (GET /, its static files) and its status JSON (GET /v1/status), without a browser: the
headers and files that keep the page self-contained under its CSP, the key on the status endpoint, the status
numbers against the fake worker, and the rates' arithmetic (jev_frontend/status.py). The page in a real browser:
tests/stack/test_page_browser.py."""

from __future__ import annotations

import contextlib
import re
from html.parser import HTMLParser

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Histogram

from jev_common.metrics import LATENCY_BUCKETS
from jev_common.schema import CacheLevelStats, CacheStats, ModelInfo
from jev_frontend.app import POOL, create_app
from jev_frontend.page import CSP, FILES, STATIC_DIR
from jev_frontend.settings import Settings
from jev_frontend.status import L3Counts, Latencies, StatusHistory, l3_counts, latencies_by_backend
from tests.fakes.fake_worker import FakeWorker

CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=20)
ASK = {
    "model": "fake-worker",
    "state": "The light is red.",
    "questions": {"q": {"type": "choice", "instructions": "Now?", "criteria": {"stop": None, "go": None}}},
}


@contextlib.asynccontextmanager
async def frontend(**settings):
    async with TestClient(TestServer(create_app(Settings(**settings))), timeout=CLIENT_TIMEOUT) as client:
        yield client


@pytest.fixture
async def fake():
    worker = FakeWorker()
    async with worker:
        yield worker


def routed(url: str, **settings) -> dict:
    """Settings routing to `url` as one of JEV_BACKENDS (health polled), with no index."""
    return dict(backend_url="", backends=(("fake-worker", url),), redis_url="none", health_interval_s=0.2, **settings)


# ----- the page's files -------------------------------------------------------------------------------
async def test_the_page_and_its_files_carry_the_csp(fake):
    async with frontend(**routed(fake.url)) as client:
        page = await client.get("/")
        assert page.status == 200 and page.headers["Content-Type"].startswith("text/html")
        assert 'src="/static/app.js"' in await page.text()
        for name, content_type in FILES.items():
            resp = await client.get(f"/static/{name}") if name != "index.html" else page
            assert resp.status == 200 and resp.headers["Content-Type"] == content_type, name
            assert resp.headers["Content-Security-Policy"] == CSP
            assert resp.headers["X-Content-Type-Options"] == "nosniff"
        for path in ("/static/index.html", "/static/missing.js", "/static/..%2Fpage.py", "/static/"):
            resp = await client.get(path)
            assert resp.status == 404 and (await resp.json())["detail"]["error_type"], path


def test_the_csp_allows_this_origin_only_and_nothing_inline():
    directives = dict(d.strip().split(" ", 1) for d in CSP.split(";"))
    assert directives["default-src"] == "'self'"
    assert all("unsafe" not in v and "http" not in v and "*" not in v for v in directives.values()), CSP
    assert set(directives) == {"default-src", "base-uri", "form-action", "frame-ancestors", "object-src"}


class Markup(HTMLParser):
    """What of index.html could run or style inline, or load from elsewhere."""

    def __init__(self):
        super().__init__()
        self.problems: list[str] = []
        self.in_script = False
        self.loads: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "style":
            self.problems.append("a <style> element")
        if "style" in attrs:
            self.problems.append(f"a style attribute on <{tag}>")
        self.problems += [f"{name} on <{tag}>" for name in attrs if name.startswith("on")]
        if tag == "script" and not attrs.get("src"):
            self.problems.append("an inline <script>")
        self.in_script = tag == "script"
        self.loads += [attrs[name] for name in ("src", "href") if attrs.get(name)]

    def handle_endtag(self, tag):
        self.in_script = False

    def handle_data(self, data):
        if self.in_script and data.strip():
            self.problems.append("script text inline")


def test_the_page_has_nothing_inline_and_loads_only_its_own_files():
    markup = Markup()
    markup.feed((STATIC_DIR / "index.html").read_text())
    assert not markup.problems
    assert markup.loads and all(
        url.startswith("/static/") and url.removeprefix("/static/") in FILES for url in markup.loads
    )
    for name in FILES:
        text = (STATIC_DIR / name).read_text()
        urls = [
            u for u in re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"')]*", text) if u != "http://www.w3.org/2000/svg"
        ]
        assert not urls, (name, urls)  # the SVG namespace is a name, not a load
        assert "@import" not in text and "url(" not in text, name


def test_the_script_keeps_the_key_in_memory_only():
    script = (STATIC_DIR / "app.js").read_text()
    for forbidden in (
        "localStorage",
        "sessionStorage",
        "document.cookie",
        "indexedDB",
        "eval(",
        "new Function",
        "innerHTML",
    ):
        assert forbidden not in script, forbidden
    assert 'credentials: "omit"' in script


# ----- /v1/status -------------------------------------------------------------------------------------
async def test_status_lists_every_backend_with_its_numbers(fake):
    async with frontend(**routed(fake.url)) as client:
        first = await (await client.get("/v1/status")).json()
        (row,) = first["backends"]
        assert (row["url"], row["model"], row["state"], row["queue_depth"]) == (fake.url, "fake-worker", "up", 0)
        assert row["decisions_per_s"] is None and row["p50_s"] is None  # one reading: no rate yet
        assert row["l3"] is None  # the fake reports L1 only
        assert first["routing"] == "prefix" and first["default_model"] == "fake-worker"
        for _ in range(3):
            assert (await client.post("/v1/systemone", json=ASK)).status == 200
        second = await (await client.get("/v1/status")).json()
        (row,) = second["backends"]
        assert row["decisions_per_s"] > 0 and second["window_s"] >= 0
        assert 0 < row["p50_s"] <= row["p99_s"]


async def test_status_reads_each_workers_l3_counters(fake):
    counts = {"hits": 3, "misses": 1}
    fake.cache_stats = lambda: CacheStats(
        enabled=True,
        levels={"l3": CacheLevelStats(enabled=True, **counts), "l1": CacheLevelStats(enabled=True, hits=9)},
    )
    async with frontend(**routed(fake.url)) as client:
        l3 = (await (await client.get("/v1/status")).json())["backends"][0]["l3"]
        assert l3 == {"hits": 3, "misses": 1, "hit_ratio": 0.75, "recent_hit_ratio": None}
        counts.update(hits=4, misses=4)  # one hit and three misses since the first reading
        l3 = (await (await client.get("/v1/status")).json())["backends"][0]["l3"]
        assert l3 == {"hits": 4, "misses": 4, "hit_ratio": 0.5, "recent_hit_ratio": 0.25}


async def test_status_with_a_single_backend_looks_at_it_now(fake):
    async with frontend(backend_url=fake.url) as client:
        body = await (await client.get("/v1/status")).json()
        assert body["routing"] == "single"
        assert [(b["url"], b["model"], b["state"]) for b in body["backends"]] == [(fake.url, "fake-worker", "up")]
        fake.healthy = False
        (row,) = (await (await client.get("/v1/status")).json())["backends"]
        assert row["state"] == "down" and "503" in row["error"]


async def test_status_is_behind_the_api_key_and_the_page_is_not(fake):
    async with frontend(**routed(fake.url, api_keys=("k1",))) as client:
        assert (await client.get("/v1/status")).status == 403
        resp = await client.get("/v1/status", headers={"Authorization": "Bearer nope"})
        assert resp.status == 401 and (await resp.json())["detail"]["error_type"] == "authentication_error"
        resp = await client.get("/v1/status", headers={"Authorization": "Bearer k1"})
        assert resp.status == 200 and (await resp.json())["backends"][0]["url"] == fake.url
        for path in ("/", "/static/app.js"):  # the page must load to ask for the key
            assert (await client.get(path)).status == 200


async def test_the_default_alias_carries_its_models_modality(fake):
    async with frontend(**routed(fake.url)) as client:
        pool = client.app[POOL]
        await pool.refresh()
        (backend,) = pool.backends.values()
        backend.models = [
            ModelInfo(name="fake-worker", description="d", release_date="r", x_modality="vision-language").model_dump()
        ]
        models = (await (await client.get("/v1/models")).json())["models"]
        assert [(m["name"], m["x_modality"]) for m in models] == [
            ("fake-worker", "vision-language"),
            ("jev-latest", "vision-language"),
        ]


# ----- the rates' arithmetic ----------------------------------------------------------------------------
def histogram() -> Histogram:
    return Histogram("t_seconds", "test", ["backend"], buckets=LATENCY_BUCKETS, registry=CollectorRegistry())


def test_latencies_since_an_earlier_reading_and_their_quantiles():
    h = histogram()
    for _ in range(50):
        h.labels("a").observe(0.003)  # the (0.0025, 0.005] bucket
    earlier = latencies_by_backend(h)["a"]
    for _ in range(98):
        h.labels("a").observe(0.2)  # (0.1, 0.25]
    h.labels("a").observe(0.7)  # (0.5, 1]
    h.labels("a").observe(100.0)  # +Inf
    now = latencies_by_backend(h)["a"]
    recent = now.since(earlier)
    assert recent.count == 100 and now.count == 150
    assert recent.quantile(0.5) == pytest.approx(0.1 + 0.15 * 50 / 98)  # linear within (0.1, 0.25]
    assert recent.quantile(0.99) == pytest.approx(0.5 + 0.5 * (99 - 98) / 1)
    assert recent.quantile(1.0) == 60  # the +Inf bucket reads as the largest finite bound
    assert now.quantile(0.2) == pytest.approx(0.0025 + 0.0025 * 30 / 50)  # the earlier ones count without `since`
    assert Latencies(now.bounds, tuple(0.0 for _ in now.bounds)).quantile(0.5) is None


def test_history_rates_over_its_window():
    clock = [100.0]
    h = histogram()
    history = StatusHistory(window_s=10, clock=lambda: clock[0])
    now, base = history.record(latencies_by_backend(h), {"a": L3Counts(1, 1)})
    assert base is None
    rates = history.rates(["a"], now, base)["a"]
    assert (rates.decisions_per_s, rates.p50_s, rates.l3["recent_hit_ratio"]) == (None, None, None)
    assert rates.l3["hit_ratio"] == 0.5

    for _ in range(8):
        h.labels("a").observe(0.02)
    clock[0] = 104.0
    now, base = history.record(latencies_by_backend(h), {"a": L3Counts(4, 2)})
    rates = history.rates(["a", "b"], now, base)
    assert rates["a"].decisions_per_s == 2.0 and rates["a"].p50_s == pytest.approx(0.0175)
    assert rates["a"].l3 == {"hits": 4, "misses": 2, "hit_ratio": 0.6667, "recent_hit_ratio": 0.75}
    assert rates["b"].to_json() == {"decisions_per_s": 0.0, "p50_s": None, "p99_s": None, "l3": None}
    assert history.covered_s == 4.0

    clock[0] = 112.0  # the first reading is past the 10 s window: the rate is over the last 8 s
    h.labels("a").observe(0.02)
    now, base = history.record(latencies_by_backend(h), {"a": L3Counts(0, 1)})  # counters reset: no recent ratio
    rates = history.rates(["a"], now, base)["a"]
    assert base.at == 104.0 and rates.decisions_per_s == pytest.approx(1 / 8)
    assert rates.l3["recent_hit_ratio"] is None and rates.l3["hit_ratio"] == 0.0
    with pytest.raises(ValueError):
        StatusHistory(window_s=0)


def test_l3_counts_from_cache_stats():
    on = CacheStats(enabled=True, levels={"l3": CacheLevelStats(enabled=True, hits=2, misses=6)})
    assert l3_counts(on) == L3Counts(2, 6) and l3_counts(on).hit_ratio == 0.25
    off = CacheStats(enabled=True, levels={"l3": CacheLevelStats(enabled=False)})
    assert l3_counts(off) is None and l3_counts(CacheStats(enabled=True, levels={})) is None
    assert L3Counts(0, 0).hit_ratio is None
