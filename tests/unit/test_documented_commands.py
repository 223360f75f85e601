"""Every `python -m tools.X` / `python -m benchmarks.X` the docs name runs as written: from the checkout, with
the venv's python and no PYTHONPATH (the packages put services/ on the path themselves)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md")),
        *sorted((ROOT / "recipes").glob("*/README.md"))]
COMMAND = re.compile(r"python -m ((?:tools|benchmarks)\.[a-z0-9_]+)")


def documented_modules() -> list[str]:
    return sorted({m for path in DOCS for m in COMMAND.findall(path.read_text(encoding="utf-8"))})


def test_the_docs_name_tools_and_benchmarks():
    assert {"tools.compare_with_backend", "benchmarks.loadgen"} <= set(documented_modules())


@pytest.mark.parametrize("module", documented_modules())
def test_documented_module_runs_as_written(module):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, f"python -m {module} --help: {done.stderr[-800:]}"
