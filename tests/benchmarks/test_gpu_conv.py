"""`python -m benchmarks.gpu_conv --small` (CPU: the tiny LFM2 forward and served answer on PyTorch's fallback) runs
end to end, so the GPU run's causal-conv1d check cannot rot before a GPU is lent; the reference it checks the
kernel against is checked here against a plain loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.gpu_conv import reference_conv

REPO = Path(__file__).resolve().parents[2]


def test_reference_is_a_causal_depthwise_convolution():
    torch.manual_seed(0)
    x, w, b = torch.randn(2, 3, 7), torch.randn(3, 3), torch.randn(3)
    want = torch.zeros(2, 3, 7)
    for t in range(7):
        for k in range(3):
            if t - 2 + k >= 0:
                want[:, :, t] += w[:, k] * x[:, :, t - 2 + k]  # only the present and the past
    assert torch.allclose(reference_conv(x, w, None, None), want, atol=1e-6)
    assert torch.allclose(reference_conv(x, w, b, "silu"), torch.nn.functional.silu(want + b[:, None]), atol=1e-6)


def test_small_dry_run_serves_lfm2_and_reports(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'services'}:{REPO}", JEV_REDIS_URL="")
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu_conv", "--small", "--out", str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_conv.json").read_text())
    assert result["passed"] and result["lfm2_forward"]["passed"] and result["served"]["passed"]
    assert "causal-conv1d" in result["served"]["kernels"]
    assert "PASSED" in (tmp_path / "gpu_conv.md").read_text()
