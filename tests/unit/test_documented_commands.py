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
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "benchmarks").glob("*.md")),
    *sorted((ROOT / "recipes").glob("*/README.md")),
]
COMMAND = re.compile(r"python -m ((?:tools|benchmarks)\.[a-z0-9_]+)")


def documented_modules() -> list[str]:
    return sorted({m for path in DOCS for m in COMMAND.findall(path.read_text(encoding="utf-8"))})


def test_the_docs_name_tools_and_benchmarks():
    assert {"tools.compare_with_backend", "benchmarks.loadgen"} <= set(documented_modules())


@pytest.mark.parametrize("module", documented_modules())
def test_documented_module_runs_as_written(module):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", module, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"python -m {module} --help: {done.stderr[-800:]}"


def test_no_doc_asks_for_a_pythonpath_the_venv_makes_unneeded():
    """`make venv` names services/ in the venv, so no doc tells a user to set PYTHONPATH=services:. for a command
    (issue 49: docs/frontend.md still did); a line may name it as what a tool sets itself (pytest.ini, the Makefile)."""
    stale = [
        f"{path.relative_to(ROOT)}: {line.strip()}"
        for path in DOCS
        for line in path.read_text(encoding="utf-8").splitlines()
        if "PYTHONPATH=services" in line and not re.search(r"\bsets?\b", line)
    ]
    assert not stale, stale


SERVICE_COMMAND = re.compile(r"python -m (jev_(?:worker|frontend|preencoder)|tests\.fakes\.[a-z_]+)")


def test_the_docs_name_the_services_and_the_fake_worker():
    named = {m for path in DOCS for m in SERVICE_COMMAND.findall(path.read_text(encoding="utf-8"))}
    assert {"jev_worker", "jev_frontend", "jev_preencoder", "tests.fakes.fake_worker"} <= named


def test_make_venv_puts_the_services_on_the_venvs_path(tmp_path):
    """`python -m jev_preencoder ...` and `python -m tests.fakes.fake_worker ...` (docs/images.md, docs/frontend.md)
    run as written in the venv `make venv` made: no PYTHONPATH. A throwaway venv (the packages borrowed from this
    interpreter's) with its install stamp fresh, so `make venv` does only its own steps."""
    import sysconfig

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / ".installed").touch()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        ["make", "-s", "venv", f"VENV={venv}"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [str(python), "-c", "import jev_common, jev_worker, jev_frontend, jev_preencoder"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for command in (["-m", "jev_preencoder", "encode", "--help"], ["-m", "tests.fakes.fake_worker", "--help"]):
        done = subprocess.run([str(python), *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"python {' '.join(command)}: {done.stderr[-800:]}"


def test_torch_index_url_installs_torch_from_it_first(tmp_path):
    """`make up TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu` (README, "First run"): torch's pinned version
    from that index before the requirements, so pip does not take PyPI's CUDA build; without it, pip's own index."""
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS")}

    def planned(*extra: str) -> list[str]:
        done = subprocess.run(
            ["make", "-n", "-B", f"{venv}/.installed", f"VENV={venv}", *extra],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    index = "https://download.pytorch.org/whl/cpu"
    lines = planned(f"TORCH_INDEX_URL={index}")
    torch = next(i for i, line in enumerate(lines) if f"--index-url {index}" in line)
    assert "grep -E '^torch==' requirements.txt" in lines[torch]
    assert torch < next(i for i, line in enumerate(lines) if "-r requirements-dev.txt" in line)
    assert not any("--index-url" in line for line in planned())
    pinned = [line for line in (ROOT / "requirements.txt").read_text().splitlines() if line.startswith("torch==")]
    assert len(pinned) == 1, pinned


def test_the_benchmark_table_gives_ranges_or_says_how_a_figure_was_measured():
    """docs/benchmarks.md's first table: no `~20 s` that a busy 2-core machine takes 3-15 times over (issue 49). A
    time is a range (quiet to busy), or says it is the quiet figure or the tool's own limit, or there is none."""
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    table = text[text.index("| command | what it does |") :].split("\n\n", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 8, rows
    for row in rows:
        cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        assert "~" not in cell, row
        for figure in cell.split(";"):
            if re.search(r"\d+ ?(s|min)\b", figure):
                assert re.search(r"\d+ ?(s|min)? – \d+|\d+–\d+ min|quiet|limit", figure), (figure, row)
