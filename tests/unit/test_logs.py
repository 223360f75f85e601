"""Every line a service writes on stderr is one JSON object: its log records, what libraries print
themselves (progress bars are off), warnings, and an uncaught exception's traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = textwrap.dedent("""
    import logging, sys, warnings
    from jev_common.logs import setup_logging
    log = setup_logging("jev.test")
    log.info("hello %s", "world")
    print("a library printing\\r50%", file=sys.stderr)
    own = logging.getLogger("lib"); own.propagate = False
    own.addHandler(logging.StreamHandler()); own.warning("own handler")
    warnings.warn("deprecated thing")
    from tqdm import tqdm
    for _ in tqdm(range(3), desc="bar"):
        pass
    import threading
    t = threading.Thread(target=lambda: 1 / 0, name="worker-thread"); t.start(); t.join()
    raise RuntimeError("boom at the top")
""")


def _run(program: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS")}
    environ.update(PYTHONPATH=f"{ROOT / 'services'}{os.pathsep}{ROOT}", **env)
    return subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=environ, timeout=60)


def test_every_stderr_line_is_json():
    done = _run(PROGRAM)
    assert done.returncode == 1
    entries = [json.loads(line) for line in done.stderr.splitlines()]  # raises on any non-JSON line
    assert all({"ts", "level", "logger", "msg"} <= set(e) for e in entries)
    messages = [e["msg"] for e in entries]
    assert "hello world" in messages
    assert "a library printing" in messages and "50%" in messages
    assert "own handler" in messages
    assert any("deprecated thing" in m for m in messages)
    assert not any("bar" in m and "it/s" in m for m in messages)  # progress bars are off
    thread = next(e for e in entries if "worker-thread" in e["msg"])
    assert "ZeroDivisionError" in thread["exc"]
    top = next(e for e in entries if e["msg"].startswith("uncaught RuntimeError"))
    assert top["level"] == "critical" and "boom at the top" in top["exc"]


def test_the_encode_cli_keeps_its_human_output():
    done = _run(
        "from jev_common.logs import setup_logging\nimport sys\n"
        "setup_logging('preencoder', capture_stderr=False)\nprint('FAILED x', file=sys.stderr)"
    )
    assert done.stderr == "FAILED x\n"


def test_the_worker_switches_progress_bars_off_before_tqdm_is_imported():
    """tqdm reads TQDM_DISABLE once, at import: the worker's entry module imports transformers (and tqdm) before
    setup_logging runs, so it must switch the bars off first. Else the GGUF loader's bar lands in the worker's log
    as hundreds of `warning` lines (issue 49)."""
    program = textwrap.dedent("""
        import sys
        import jev_worker.__main__  # what `python -m jev_worker` imports before main() runs
        assert "tqdm" in sys.modules, "the check needs tqdm imported by the worker's modules"
        from tqdm.auto import tqdm
        for _ in tqdm(range(3), desc="de-quantizing"):  # as transformers' GGUF loader calls it: no disable=
            pass
    """)
    done = _run(program)
    assert done.returncode == 0, done.stderr
    assert "de-quantizing" not in done.stderr, done.stderr
