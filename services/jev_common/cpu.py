"""How many CPU threads this process should compute with, and how its OpenMP threads wait.

- `usable_cpus()`: the CPUs this process may run on (its affinity mask), capped by the container's CPU quota
  (cgroup v2 `cpu.max`, or v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded up, at least 1. A container
  given `cpus: 2` on a 64-core host gets 2, not 64.
- `PASSIVE_WAIT`: OpenMP threads that finished their part of a parallel region sleep instead of spinning for
  the rest. Spinning is what PyTorch's libgomp does by default; measured on a 2-core AVX2 EPYC with another
  process busy on one core, a 500-token FP32 forward of the embedded SmolLM2 ran 49 tok/s with 2 spinning
  threads and 265 tok/s with 2 passive ones (quiet: 366 and 335; benchmarks/RESULTS.md). It must be in the
  environment before libgomp loads, i.e. before torch is imported: `python -m jev_worker` sets it first thing,
  unless OMP_WAIT_POLICY is already set.
"""

from __future__ import annotations

import math
import os

PASSIVE_WAIT = ("OMP_WAIT_POLICY", "PASSIVE")


def prefer_passive_waits() -> None:
    """OMP_WAIT_POLICY=PASSIVE unless the environment says otherwise (call before importing torch)."""
    os.environ.setdefault(*PASSIVE_WAIT)


def _read(path: str) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read()


def _quota(root: str = "/sys/fs/cgroup") -> float | None:
    """CPUs the cgroup quota allows (None: unlimited or unknown)."""
    try:
        quota, period = _read(os.path.join(root, "cpu.max")).split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int(_read(os.path.join(root, "cpu", "cpu.cfs_quota_us")))
        period_us = int(_read(os.path.join(root, "cpu", "cpu.cfs_period_us")))
        return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cpus(root: str = "/sys/fs/cgroup") -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    quota = _quota(root)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def compute_threads(requested: int, root: str = "/sys/fs/cgroup") -> int:
    """`requested` when > 0 (JEV_TORCH_THREADS), else the CPUs this process may use."""
    return requested if requested > 0 else usable_cpus(root)
