"""tools/stack_run.py in pieces: a log folder per run (with `latest` and a bounded history), log dumps without
progress bars, and a waiting line for every loading step a service's health names."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from tools import stack_run


def test_each_run_gets_a_fresh_log_folder_and_latest_names_it(tmp_path):
    folders = [stack_run.new_log_dir(tmp_path, keep=3) for _ in range(5)]
    logs = tmp_path / "logs"
    assert len(set(folders)) == 5
    assert (logs / "latest").is_symlink() and (logs / "latest").resolve() == folders[-1].resolve()
    kept = sorted(p for p in logs.iterdir() if p.is_dir() and not p.is_symlink())
    assert kept == sorted(folders[-3:])  # the last `keep` runs, the newest always among them
    assert not any(p.name.startswith(".latest") for p in logs.iterdir())


def test_a_log_file_starts_empty_on_every_spawn(tmp_path):
    log = tmp_path / "svc.log"
    log.write_text("an earlier run\n")
    proc = stack_run.spawn("svc", [sys.executable, "-c", "print('this run')"], {}, tmp_path, log)
    proc.popen.wait(timeout=30)
    assert log.read_text() == "this run\n"


def test_tail_leaves_progress_bars_out(tmp_path):
    lines = [
        json.dumps({"level": "info", "logger": "jev.worker.loader", "msg": "loading smollm2"}),
        json.dumps(
            {"level": "warning", "logger": "stderr", "msg": "Converting...:   3%|▎   | 9/272 [00:05<01:39,  2.65it/s]"}
        ),
        "Loading weights: 100%|██████████| 21/21 [00:00<00:00, 693.52it/s]",
        "Fetching files: 3it [00:01,  2.10it/s]",
        json.dumps({"level": "error", "logger": "jev.worker", "msg": "worker failed to start", "exc": "a\nOSError: x"}),
        "a plain line with 50% in it | and a pipe",
    ]
    path = tmp_path / "svc.log"
    path.write_text("\n".join(lines) + "\n")
    assert stack_run.tail(path).splitlines() == [
        "  info jev.worker.loader: loading smollm2",
        "  error jev.worker: worker failed to start — OSError: x",
        "a plain line with 50% in it | and a pipe",
    ]
    assert stack_run.tail(path, 1) == "a plain line with 50% in it | and a pipe"


class _Stages(BaseHTTPRequestHandler):
    stages: list[str] = []

    def do_GET(self):
        stage = self.stages.pop(0) if len(self.stages) > 1 else self.stages[0]
        body = json.dumps({"status": "loading", "detail": {"state": "loading", "stage": stage}}).encode()
        ok = stage == "done"
        self.send_response(200 if ok else 503)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_waiting_line_for_every_step_however_short(tmp_path):
    steps = ["step 1/4: checking", "step 2/4: loading the weights", "step 3/4: building", "step 4/4: warming up"]
    _Stages.stages = [steps[0], steps[1], steps[1], steps[2], steps[3], "done"]
    server = HTTPServer(("127.0.0.1", 0), _Stages)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    lines: list[str] = []
    try:
        proc = stack_run.Proc("worker", sleeper, Path(tmp_path / "worker.log"))
        url = f"http://127.0.0.1:{server.server_address[1]}/health"
        stack_run.wait_healthy(proc, url, others=[], timeout_s=30, log=lines.append, progress_s=3600)
    finally:
        sleeper.kill()
        sleeper.wait()
        server.shutdown()
    shown = [step for line in lines for step in steps if f"({step} " in line or f"({step})" in line]
    assert shown == steps, lines
