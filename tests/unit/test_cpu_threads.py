"""The worker computes with the CPUs it may use, and its idle OpenMP threads sleep (jev_common/cpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jev_common.cpu import compute_threads, usable_cpus

ROOT = Path(__file__).resolve().parents[2]


def test_threads_follow_affinity_and_the_cgroup_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    assert usable_cpus(str(tmp_path)) == affinity  # no cgroup files: the affinity mask
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cpus(str(tmp_path)) == affinity  # unlimited quota
    (tmp_path / "cpu.max").write_text("50000 100000\n")  # half a CPU: still one thread
    assert usable_cpus(str(tmp_path)) == 1
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cpus(str(v1)) == 1
    assert compute_threads(3, str(v1)) == 3  # JEV_TORCH_THREADS wins


def test_python_m_jev_worker_sets_passive_waits_before_torch_loads():
    code = (
        "import sys, runpy\n"
        "sys.argv = ['jev_worker']\n"
        "import jev_worker\n"
        "assert 'torch' not in sys.modules, 'torch imported before the wait policy is set'\n"
        "import jev_worker.__main__ as m\n"
        "import os; print(os.environ['OMP_WAIT_POLICY'])\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PYTHONPATH"] = f"{ROOT / 'services'}:{ROOT}"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "PASSIVE", done.stderr[-1500:]
    env["OMP_WAIT_POLICY"] = "ACTIVE"  # a policy set by the operator is kept
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ACTIVE", done.stderr[-1500:]
