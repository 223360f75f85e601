"""The frontend's page (`GET /`) in Debian's headless Chromium, driven by selenium: the browser test's helpers
(tests/stack/test_page_browser.py) and the screenshot in docs/ (README, "A page to look at").

    python -m tools.page_browser --out docs/page-playground.png             # starts the cpu profile (SmolLM2)
    python -m tools.page_browser --url http://127.0.0.1:8080 --out page.png  # a stack that runs already

selenium is given /usr/bin/chromedriver (Debian's chromium-driver, from the same source package as the
browser), so nothing tries to download a driver; `bash tools/ensure_browser.sh` installs both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BROWSER = Path("/usr/bin/chromium")
DRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 60.0


@dataclass(frozen=True)
class Question:
    """A question as typed on the page: its type, instructions, options (a name, or (name, description)) and id."""

    type: str
    instructions: str
    options: tuple = ()
    id: str | None = None  # None: the page's own (q1, q2, ...)


# the README's ticket example: one question of each of the API's types
TICKET_STATE = "Hi, I was charged twice for my March invoice and the refund still has not arrived."
TICKET = (
    Question("noul", "Is the customer asking for money back?", id="refund"),
    Question(
        "choice",
        "Which team should handle this ticket?",
        (("Billing", "Payments, invoices, refunds"), "Technical", "Sales"),
        id="team",
    ),
    Question("score", "How frustrated is the customer?", ("Calm", "Frustrated", "Very angry"), id="anger"),
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def missing() -> str | None:
    """Why the browser cannot run here, or None."""
    for path in (BROWSER, DRIVER):
        if not path.exists():
            return f"{path} is missing (bash tools/ensure_browser.sh installs chromium and chromium-driver)"
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed (it is pinned in requirements-dev.txt)"
    return None


def chrome(width: int = 1200, height: int = 1000):
    """A headless Chromium (root needs --no-sandbox) whose console is readable through get_log("browser")."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(BROWSER)
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(str(DRIVER)), options=options)


@dataclass
class Page:
    """The page at `url` in `driver`: what a user does on it, and what it shows."""

    driver: object
    url: str

    def open(self) -> Page:
        self.driver.get(self.url.rstrip("/") + "/")
        return self

    def wait(self, condition: Callable[[], object], what: str, timeout_s: float = WAIT_S):
        """condition()'s first truthy value, polled; TimeoutError naming `what` (and the page's error) past timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                value = condition()
            except Exception:  # noqa: BLE001 - an element not there yet, a stale one: poll again
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the page did not show {what} within {timeout_s:g}s; it shows: {self.text()[:2000]}"
                )
            time.sleep(0.1)

    def find(self, css: str):
        from selenium.webdriver.common.by import By

        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list:
        from selenium.webdriver.common.by import By

        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def text(self) -> str:
        return self.find("body").text

    def models(self) -> list[str]:
        """The model picker's names, once /v1/models answered."""
        return self.wait(
            lambda: [o.get_attribute("value") for o in self.find_all("#model option")], "the models from /v1/models"
        )

    def set_state(self, text: str) -> None:
        box = self.find("#state")
        box.clear()
        box.send_keys(text)

    def set_questions(self, questions: list[Question]) -> list[str]:
        """Replace the page's questions with these; returns their ids."""
        for remove in self.find_all("#questions .question .remove"):
            remove.click()
        ids = []
        for asked in questions:
            self.find(f'[data-add="{asked.type}"]').click()
            question = self.find_all("#questions .question")[-1]
            question.find_element("css selector", ".instructions").send_keys(asked.instructions)
            self.set_options(question, asked.options)
            qid = question.find_element("css selector", ".qid")
            if asked.id is not None:
                qid.clear()
                qid.send_keys(asked.id)
            ids.append(qid.get_attribute("value"))
        return ids

    def set_options(self, question, options) -> None:
        """Replace a question's option rows with `options` (a name, or (name, description)); none: kept as they are."""
        if not options:
            return
        rows = question.find_elements("css selector", ".option")
        while len(rows) < len(options):
            question.find_element("css selector", ".add-option").click()
            rows = question.find_elements("css selector", ".option")
        for row in rows[len(options) :]:
            row.find_element("css selector", ".remove-option").click()
        for row, option in zip(rows, options):
            name, description = (option, "") if isinstance(option, str) else option
            for css, text in ((".name", name), (".description", description)):
                boxes = row.find_elements("css selector", css)
                if boxes:
                    boxes[0].clear()
                    boxes[0].send_keys(text)

    def ask(self) -> None:
        """Click Ask and wait for its outcome: answers or an error."""
        self.find("#ask").click()
        self.wait(
            lambda: (
                not self.find("#ask").get_attribute("disabled")
                and (self.find_all("#answers .answer") or self.find("#error").is_displayed())
            ),
            "an answer or an error",
        )

    def answers(self) -> dict[str, dict[str, str]]:
        """{question id: {option: the probability as displayed}} of the answer on the page."""
        return {
            card.get_attribute("data-question"): {
                row.get_attribute("data-option"): row.find_element("css selector", ".p").text
                for row in card.find_elements("css selector", ".bar-row")
            }
            for card in self.find_all("#answers .answer")
        }

    def summaries(self) -> dict[str, str]:
        return {
            card.get_attribute("data-question"): card.find_element("css selector", ".summary").text
            for card in self.find_all("#answers .answer")
        }

    def sent_request(self) -> dict:
        """The request the page sent, from its raw view (read whether or not the view is open)."""
        return json.loads(self.find("#raw-request").get_attribute("textContent"))

    def error(self) -> str:
        box = self.find("#error")
        return box.text if box.is_displayed() else ""

    def show_status(self) -> None:
        self.find("#tab-status").click()

    def status_rows(self) -> list[dict[str, str]]:
        """The status table's rows: {column: text} (url, model, health, queue, in_flight, rate, l3, p50, p99)."""
        return [
            {td.get_attribute("data-column"): td.text for td in tr.find_elements("css selector", "td")}
            for tr in self.find_all("#status-table tbody tr")
        ]

    def fit_window(self) -> None:
        """Make the window tall enough for the whole page, so that a screenshot shows all of it."""
        for _ in range(3):
            inner, full = self.driver.execute_script(
                "return [window.innerHeight, document.documentElement.scrollHeight]"
            )
            if inner >= full:
                return
            size = self.driver.get_window_size()
            self.driver.set_window_size(size["width"], size["height"] + full - inner)

    def console_errors(self) -> list[dict]:
        return [entry for entry in self.driver.get_log("browser") if entry.get("level") == "SEVERE"]

    def resources(self) -> list[str]:
        """Every URL the page loaded (documents, scripts, styles, icons, fetches)."""
        return self.driver.execute_script(
            "return [location.href].concat(performance.getEntriesByType('resource').map(e => e.name))"
        )


def screenshot(url: str, out: Path) -> dict:
    """The page at `url` answering the README's ticket example, saved to `out`; returns the API's answer."""
    driver = chrome(1100, 1000)
    try:
        page = Page(driver, url).open()
        page.models()
        page.set_state(TICKET_STATE)
        page.set_questions(list(TICKET))
        page.ask()
        if page.error():
            raise RuntimeError(f"the page shows an error: {page.error()}")
        page.fit_window()
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
        return json.loads(page.find("#raw-response").get_attribute("textContent"))
    finally:
        driver.quit()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running frontend; without it the cpu profile is started on free ports")
    parser.add_argument("--out", type=Path, required=True, help="where the PNG goes")
    args = parser.parse_args(argv)
    reason = missing()
    if reason:
        print(f"page_browser: {reason}", file=sys.stderr)
        return 2
    if args.url:
        answer = screenshot(args.url, args.out)
    else:
        from tools.local_stack import start_profile

        overrides = {
            "worker-cpu": {"JEV_WORKER_PORT": str(free_port())},
            "frontend-cpu": {"JEV_FRONTEND_PORT": str(free_port())},
        }
        with tempfile.TemporaryDirectory() as state_dir, start_profile("cpu", overrides, state_dir=state_dir) as urls:
            answer = screenshot(urls["frontend-cpu"], args.out)
    print(json.dumps(answer))
    print(f"page_browser: wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
