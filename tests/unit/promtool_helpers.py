"""promtool for the rule and dashboard tests: on PATH, or where tools/promtool.sh puts it (make test runs that first,
from Debian's prometheus package); the tests skip, saying why, where there is none."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL = ROOT / ".cache" / "promtool" / "promtool"


def promtool() -> str:
    found = shutil.which("promtool") or (str(LOCAL) if LOCAL.is_file() else None)
    if found is None:
        pytest.skip("promtool is not installed: `bash tools/promtool.sh` takes it from Debian's prometheus package")
    return found


def run_promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([promtool(), *args], capture_output=True, text=True, timeout=120, cwd=cwd)
