"""tools/progress.py: the install steps of `make up` say what they do every few seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _progress(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "progress.py"), *argv], capture_output=True, text=True, timeout=30
    )


def test_a_line_every_interval_then_done():
    done = _progress(
        "install: thing",
        "--every",
        "0.2",
        "--",
        sys.executable,
        "-c",
        "import time; print('q' + 'uiet'); time.sleep(1.1)",
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done
    assert lines[0].startswith("install: thing: started")
    assert sum(line.startswith("install: thing: ... ") and line.endswith(" s") for line in lines) >= 4
    assert lines[-1].startswith("install: thing: done in ")
    assert "quiet" not in done.stdout  # the command's own output stays out of the way


def test_a_failure_shows_the_last_output_and_its_status():
    done = _progress(
        "install: broken",
        "--",
        sys.executable,
        "-c",
        "import sys; print('ERROR: no matching distribution'); sys.exit(3)",
    )
    assert done.returncode == 3
    assert "install: broken: failed with exit status 3" in done.stdout
    assert "ERROR: no matching distribution" in done.stdout
