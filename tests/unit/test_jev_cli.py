"""`python -m jev ask`: the System One envelope it sends, the bar chart it prints, the errors it names.
The server here is a recording stand-in; tests/stack covers the CLI against the real stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from jev import cli
from jev.chart import bar, chart
from jev.client import envelope

ROOT = Path(__file__).resolve().parents[2]

ANSWERS = {
    "choice": {
        "type": "choice",
        "choice": "umbrella",
        "probabilities": {"umbrella": 0.75, "sunglasses": 0.25},
        "confidence": 0.5,
    },
    "noul": {"type": "noul", "noul": 0.2},
    "score": {
        "type": "score",
        "score": 1.5,
        "legend": {"0": "cold", "1": "warm", "2": "hot"},
        "probabilities": {"0": 0.1, "1": 0.3, "2": 0.6},
        "confidence": 0.4,
    },
}


@contextmanager
def server(status: int = 200, reply: dict | None = None):
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            kind = next(iter(body["questions"].values()))["type"]
            payload = reply or {
                "model": "stand-in",
                "answers": {"q": ANSWERS[kind]},
                "usage": {"input_tokens": 12, "output_tokens": 1},
            }
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *_):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def test_envelope_per_type():
    assert envelope("It rains.", "Take what?", ["umbrella", "hat"], "choice", "jev-latest") == {
        "model": "jev-latest",
        "state": "It rains.",
        "questions": {
            "q": {"type": "choice", "instructions": "Take what?", "criteria": {"umbrella": None, "hat": None}}
        },
    }
    assert envelope("s", "Is it wet?", [], "noul", "m")["questions"]["q"] == {
        "type": "noul",
        "instructions": "Is it wet?",
    }
    assert envelope("s", "How hot?", ["cold", "hot"], "score", "m")["questions"]["q"]["criteria"] == ["cold", "hot"]
    for args in (
        ("s", "q", ["one"], "choice"),
        ("s", "q", ["a", "a"], "choice"),
        ("s", "q", ["x"], "noul"),
        ("s", "q", ["only"], "score"),
    ):
        with pytest.raises(ValueError):
            envelope(*args, "m")


def test_bars():
    assert bar(1.0, 8) == "█" * 8 and bar(0.0, 8) == " " * 8
    assert bar(0.5, 8) == "████    " and bar(0.0625, 8) == "▌       "
    assert bar(0.5, 8, unicode=False) == "####    "
    lines = chart([("yes", 0.75), ("no", 0.25)], mark="yes", width=8).splitlines()
    assert lines == ["> yes  ██████    0.750", "  no   ██        0.250"]


@pytest.mark.parametrize(
    "kind, options, expect",
    [
        ("choice", ["umbrella", "sunglasses"], ["choice: umbrella  (confidence 0.500)", "> umbrella", "  sunglasses"]),
        ("noul", [], ["noul: P(yes) = 0.200", "  yes", "> no"]),
        ("score", ["cold", "warm", "hot"], ["score: 1.500  (confidence 0.400)", "  0 cold", "  1 warm", "> 2 hot"]),
    ],
)
def test_ask_prints_a_chart(capsys, kind, options, expect):
    with server() as (url, seen):
        code = cli.main(["ask", "--url", url, "--type", kind, "--api-key", "k1", "It rains.", "What now?", *options])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert seen[0]["path"] == "/v1/systemone" and seen[0]["auth"] == "Bearer k1"
    assert seen[0]["body"] == envelope("It rains.", "What now?", options, kind, "jev-latest")
    assert out[0] == expect[0]
    assert [line[: len(e)] for line, e in zip(out[1:], expect[1:])] == expect[1:]
    assert out[-1] == "  model stand-in · 12 input tokens"
    assert all(line.rstrip()[-5:].replace(".", "").isdigit() for line in out[1:-1])  # each row ends in its p


def test_errors_name_their_cause(capsys):
    detail = {"detail": [{"loc": ["body", "questions", "q", "criteria"], "msg": "too short", "type": "too_short"}]}
    with server(422, detail) as (url, _):
        assert cli.main(["ask", "--url", url, "s", "q", "a", "b"]) == 1
    assert "HTTP 422 validation error: body.questions.q.criteria: too short" in capsys.readouterr().err
    with server(503, {"detail": {"error_type": "not_ready", "message": "worker is loading"}}) as (url, _):
        assert cli.main(["ask", "--url", url, "s", "q", "a", "b"]) == 1
    assert "HTTP 503 not_ready: worker is loading" in capsys.readouterr().err
    with server() as (url, _):
        pass  # closed again: nothing listens there now
    assert cli.main(["ask", "--url", url, "s", "q", "a", "b"]) == 1
    assert f"cannot reach {url}/v1/systemone" in capsys.readouterr().err
    assert cli.main(["ask", "--url", url, "s", "q", "only-one"]) == 2
    assert "at least two options" in capsys.readouterr().err


def test_python_dash_m_jev(tmp_path):
    with server() as (url, _):
        done = subprocess.run(
            [sys.executable, "-m", "jev", "ask", "It rains.", "Take what?", "umbrella", "sunglasses"],
            capture_output=True,
            text=True,
            timeout=30,
            cwd=tmp_path,
            env=dict(os.environ, JEV_URL=url, PYTHONPATH=str(ROOT / "services"), PYTHONIOENCODING="utf-8"),
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("choice: umbrella") and "█" in done.stdout
