"""The frontend's page (GET /) in a real browser: Debian's headless Chromium through selenium (tools/page_browser.py).

- On the tiny random checkpoint (the cpu profile's worker and frontend as processes): a choice question asked on
  the page shows bars whose numbers equal the API's answer to the same request at the displayed precision, and
  the status view lists the worker with its L3 hit ratio.
- On a stub vision-language worker behind a frontend with API keys: the page asks for the key, refuses a wrong
  one, keeps the right one in memory only; shows the API's own error message; sends an uploaded image as an
  asset; the status view shows the worker's queue and L3 hit ratio.

Both check that the page loaded nothing from outside the frontend and that the console shows no error (a CSP
violation is one). Screenshots go under the test's tmp_path (their paths are printed).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from aiohttp import web

from jev_common.schema import (
    LATEST_ALIAS,
    CacheLevelStats,
    CacheStats,
    ModelInfo,
    ModelList,
    SystemOneRequest,
    SystemOneResponse,
    SystemOneUsage,
    choice_answer,
)
from jev_frontend.app import create_app
from jev_frontend.settings import Settings
from tools.local_stack import start_profile
from tools.page_browser import Page, Question, chrome, missing

from ..fakes.net import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-cpu"
DISPLAYED = 0.0005  # the page shows probabilities with 3 decimals: equal at that precision


@pytest.fixture(scope="module")
def driver():
    reason = missing()
    if reason and "tools/ensure_browser.sh" in reason:  # make test installs it first; a direct pytest run too
        installed = subprocess.run(["bash", str(REPO / "tools" / "ensure_browser.sh")], capture_output=True, text=True)
        said = (installed.stderr or installed.stdout).strip()
        reason = missing() and f"{missing()}; tools/ensure_browser.sh said: {said}"
    if reason:
        pytest.skip(f"no headless browser: {reason}")
    browser = chrome()
    yield browser
    browser.quit()


@pytest.fixture
def browser(driver):
    """The module's browser on a blank page, its console emptied (of the previous test's page)."""
    driver.get("about:blank")
    driver.get_log("browser")
    return driver


def post(url: str, payload: dict, key: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def check_clean(page: Page, base: str, allowed_errors: tuple[str, ...] = ()) -> None:
    """Nothing loaded from outside the frontend, no console error but the expected ones."""
    origin = urlsplit(base)[:2]
    outside = [url for url in page.resources() if urlsplit(url)[:2] != origin]
    assert not outside, f"the page loaded from outside {base}: {outside}"
    errors = [e["message"] for e in page.console_errors() if not any(a in e["message"] for a in allowed_errors)]
    assert not errors, errors


def screenshot(page: Page, path: Path) -> None:
    page.driver.save_screenshot(str(path))
    print(f"screenshot: {path}")


def test_playground_and_status_on_the_tiny_checkpoint(browser, tiny_text_dir, tmp_path):
    overrides = {
        "worker-cpu": {
            "JEV_WORKER_PORT": str(free_port()),
            "JEV_MODEL_PATH": tiny_text_dir,
            "JEV_DEVICE": "cpu",
            "JEV_DTYPE": "float32",
            "JEV_TORCH_THREADS": "1",
        },
        "frontend-cpu": {"JEV_FRONTEND_PORT": str(free_port())},
    }
    with start_profile("cpu", overrides, state_dir=tmp_path / "stack", log=lambda *_: None) as urls:
        base = urls["frontend-cpu"]
        page = Page(browser, base).open()
        assert MODEL in page.models()
        page.set_state("The kettle whistles and the tea bags are on the counter.")
        (qid,) = page.set_questions(
            [Question("choice", "What happens next?", (("tea", "tea is made"), "coffee", "nothing"))]
        )
        page.ask()
        assert not page.error(), page.error()
        shown = page.answers()[qid]
        screenshot(page, tmp_path / "playground.png")

        status, answer = post(base + "/v1/systemone", page.sent_request())  # the same request, through the API
        assert status == 200, answer
        probabilities = answer["answers"][qid]["probabilities"]
        assert list(shown) == list(probabilities)
        for option, p in probabilities.items():
            assert abs(float(shown[option]) - p) <= DISPLAYED + 1e-9, (option, shown[option], p)
        page_answer = json.loads(page.find("#raw-response").get_attribute("textContent"))["answers"][qid]
        assert page.summaries()[qid].startswith(f"choice: {page_answer['choice']} · confidence ")

        page.show_status()
        row = page.wait(
            lambda: next((r for r in page.status_rows() if r["model"] == MODEL and r["health"] == "up"), None),
            "the worker in the status view",
        )
        assert row["url"] == urls["worker-cpu"] and row["queue"] == "0"
        # the second refresh has a rate; the page's request and the API's share a state: L3 hit once at least
        row = page.wait(
            lambda: next((r for r in page.status_rows() if r["rate"] != "—" and r["l3"] != "—"), None),
            "a rate and an L3 hit ratio",
            timeout_s=20,
        )
        assert re.fullmatch(r"\d+\.\d{2}", row["rate"]) and re.fullmatch(r"\d+\.\d %", row["l3"]), row
        assert float(row["l3"].removesuffix(" %")) > 0, row
        screenshot(page, tmp_path / "status.png")
        check_clean(page, base)


# ----- a stub vision-language worker behind a frontend with keys, served from a thread -------------------
class StubWorker:
    """Answers like a vision-language worker: every choice 0.25 / 0.75 over its first two options."""

    def __init__(self):
        self.received: list[dict] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/systemone", self.systemone)
        app.router.add_get("/v1/cache/stats", self.cache_stats)
        return app

    async def health(self, _request):
        return web.json_response({"status": "ok", "detail": {"worker_id": "stub-1", "queue_depth": 2}})

    async def models(self, _request):
        info = dict(description="a stub vision-language worker", release_date="unknown", x_modality="vision-language")
        listed = ModelList(models=[ModelInfo(name="stub-vl", **info), ModelInfo(name=LATEST_ALIAS, **info)])
        return web.json_response(text=listed.model_dump_json(exclude_none=True))

    async def systemone(self, request):
        body = await request.json()
        self.received.append(body)
        envelope = SystemOneRequest.model_validate(body)
        answers = {qid: choice_answer(list(q.criteria)[:2], [0.25, 0.75]) for qid, q in envelope.questions.items()}
        response = SystemOneResponse(
            model="stub-vl", answers=answers, usage=SystemOneUsage(input_tokens=9, output_tokens=0)
        )
        return web.json_response(text=response.model_dump_json())

    async def cache_stats(self, _request):
        l3 = CacheLevelStats(enabled=True, hits=3, misses=1)
        return web.json_response(text=CacheStats(enabled=True, levels={"l3": l3}).model_dump_json())


@contextlib.contextmanager
def stub_stack(key: str):
    """The stub worker and a frontend (with `key`) over it, on loopback, served by an event loop in a thread (the
    test drives the browser synchronously); yields (frontend URL, stub, worker URL)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    stub = StubWorker()
    runners: list[web.AppRunner] = []

    async def serve(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    async def start() -> tuple[str, str]:
        worker = await serve(stub.app())
        settings = Settings(
            backend_url="", backends=(("", worker),), redis_url="none", api_keys=(key,), health_interval_s=0.5
        )
        return await serve(create_app(settings)), worker

    async def stop() -> None:
        for runner in reversed(runners):
            await runner.cleanup()

    try:
        base, worker = asyncio.run_coroutine_threadsafe(start(), loop).result(30)
        yield base, stub, worker
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_keys_errors_and_an_image_on_a_stub_worker(browser, tmp_path):
    key = "page-test-key"
    image = tmp_path / "pattern.png"
    from ..unit.vl_helpers import png_uri

    image.write_bytes(base64.b64decode(png_uri(seed=3).partition(",")[2]))
    with stub_stack(key) as (base, stub, worker):
        page = Page(browser, base).open()
        # keys: asked for, a wrong one refused, the right one used
        page.wait(lambda: page.find("#key-panel").is_displayed(), "the key prompt")
        assert "needs an API key" in page.find("#key-message").text
        page.find("#key-input").send_keys("wrong")
        page.find("#key-use").click()
        page.wait(lambda: "not accepted" in page.find("#key-message").text, "the wrong key refused")
        page.find("#key-input").send_keys(key)
        page.find("#key-use").click()
        assert page.models() == ["stub-vl", LATEST_ALIAS]
        assert not page.find("#key-panel").is_displayed()

        # an error is the API's own message (a score needs two levels at least)
        page.set_state("A photo.")
        page.set_questions([Question("score", "How sharp is it?", ("blurred",))])
        page.ask()
        status, body = post(base + "/v1/systemone", page.sent_request(), key)
        assert status == 422 and page.error().startswith("422 validation_error: "), page.error()
        for item in body["detail"]:
            assert item["msg"] in page.error()
        assert not stub.received  # refused at the edge

        # an image for a vision-language model: sent as an asset the state names
        assert page.find("#image-row").is_displayed()
        (qid,) = page.set_questions([Question("choice", "What is shown?", ("a cat", "a dog"), id="animal")])
        page.find("#image").send_keys(str(image))
        page.ask()
        assert not page.error(), page.error()
        assert qid == "animal" and page.answers() == {"animal": {"a cat": "0.250", "a dog": "0.750"}}
        sent = stub.received[-1]
        assert sent["state"] == "<image:1>\nA photo."
        assert sent["assets"] == {
            "<image:1>": {
                "type": "image",
                "format": "png",
                "data_base64": base64.b64encode(image.read_bytes()).decode(),
            }
        }
        screenshot(page, tmp_path / "stub-playground.png")

        # the status view, behind the same key
        page.show_status()
        row = page.wait(lambda: next((r for r in page.status_rows() if r["url"] == worker), None), "the stub worker")
        assert (row["model"], row["health"], row["queue"], row["l3"]) == ("stub-vl", "up", "2", "75.0 %"), row

        # the key lives in the page's memory only
        stored = page.driver.execute_script("return [localStorage.length, sessionStorage.length, document.cookie]")
        assert stored == [0, 0, ""]
        check_clean(page, base, allowed_errors=("status of 401", "status of 403", "status of 422"))
        page.driver.refresh()
        page.wait(lambda: page.find("#key-panel").is_displayed(), "the key prompt again after a reload")
