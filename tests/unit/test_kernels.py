"""services/jev_worker/engine/kernels.py: which hybrid-layer kernels a model uses and whether they are installed."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import torch

from jev_worker.engine import kernels


def _installed(monkeypatch, present: dict[str, str]):
    def version(distribution):
        if distribution in present:
            return present[distribution]
        raise kernels.metadata.PackageNotFoundError(distribution)

    monkeypatch.setattr(kernels.metadata, "version", version)


def test_layer_types_name_the_kernels():
    lfm2 = SimpleNamespace(layer_types=["conv", "full_attention", "conv"])
    qwen35 = SimpleNamespace(text_config=SimpleNamespace(layer_types=["linear_attention", "full_attention"]))
    assert kernels.needed(lfm2) == ["causal-conv1d"]
    assert kernels.needed(qwen35) == ["causal-conv1d", "flash-linear-attention"]
    assert kernels.needed(SimpleNamespace()) == [] and kernels.describe(SimpleNamespace(layer_types=None)) == {}


def test_describe_reports_versions_and_the_missing(monkeypatch, caplog):
    _installed(monkeypatch, {"causal-conv1d": "1.7.0"})
    config = SimpleNamespace(text_config=SimpleNamespace(layer_types=["linear_attention"]))
    assert kernels.describe(config) == {
        "kernels": {
            "causal-conv1d": {"version": "1.7.0", "used": True},
            "flash-linear-attention": {"version": None, "used": False},
        }
    }
    with caplog.at_level(logging.WARNING, logger="jev_worker.engine.kernels"):
        assert kernels.warn_if_missing(config, torch.device("cpu")) == ["flash-linear-attention"]
        assert not caplog.records  # on CPU the fallback is the only path: nothing to warn about
        kernels.warn_if_missing(config, torch.device("cuda"))
    assert "flash-linear-attention" in caplog.text and "slow" in caplog.text


REPO = Path(__file__).resolve().parents[2]
# a stand-in for causal-conv1d's CUDA-only kernels: installed, importable, and failing on CPU tensors as the real
# extension does (`Expected x.is_cuda() to be true`)
FAKE = {
    "causal_conv1d/__init__.py": """
def causal_conv1d_fn(x, weight, bias=None, activation=None, **kwargs):
    raise RuntimeError("Expected x.is_cuda() to be true, but got false.")

def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, **kwargs):
    raise RuntimeError("Expected x.is_cuda() to be true, but got false.")
""",
    "causal_conv1d-1.7.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: causal-conv1d\nVersion: 1.7.0\n",
}
PROGRAM = """
import sys, torch
from jev_worker.engine import kernels
hide = sys.argv[1] == "hide"
if hide:
    assert kernels.use_on(torch.device("cpu")) == ["causal_conv1d"]
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[2], dtype=torch.float32).eval()
with torch.no_grad():
    model(input_ids=torch.tensor([[5, 6, 7, 8]]))
print("described", kernels.describe(model.config))
"""


def test_on_cpu_an_installed_cuda_kernel_is_hidden_so_the_pytorch_path_runs(tmp_path):
    """The CUDA image on a machine with no GPU: causal-conv1d is installed, the model runs on CPU."""
    from tools.tiny_lfm2_checkpoint import make_tiny_lfm2

    site = tmp_path / "site"
    for name, text in FAKE.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(textwrap.dedent(text))
    folder = make_tiny_lfm2(tmp_path / "lfm2", seed=3)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(site), str(REPO / "services"), str(REPO)]),
        TRANSFORMERS_VERBOSITY="error",
    )

    def run(mode):
        return subprocess.run(
            [sys.executable, "-c", PROGRAM, mode, str(folder)], env=env, capture_output=True, text=True, timeout=240
        )

    unhidden = run("keep")
    assert unhidden.returncode != 0 and "is_cuda" in unhidden.stderr  # what the worker hit before use_on
    hidden = run("hide")
    assert hidden.returncode == 0, hidden.stderr[-3000:]
    assert "'causal-conv1d': {'version': '1.7.0', 'used': False}" in hidden.stdout


def test_on_cuda_nothing_is_hidden():
    assert kernels.use_on(torch.device("cuda")) == []
