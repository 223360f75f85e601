"""The tree passes its linters: ruff (ruff.toml: lint rules and the format) and mypy (mypy.ini: strict on jev_common
and the worker's protocols, checked everywhere else but the modules it lists as not typed yet). A finding fails
`make test`; the tools' configuration lives only in those two files."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def run(*command: str) -> subprocess.CompletedProcess[str]:
    tool = BIN / command[0]
    if not tool.exists():
        pytest.fail(f"{tool} is missing: `make venv` installs requirements-dev.txt")
    return subprocess.run([str(tool), *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_ruff_check():
    result = run("ruff", "check", "--no-fix", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format():
    result = run("ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy():
    result = run("mypy")
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr
