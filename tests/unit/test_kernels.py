"""services/jev_worker/kernels.py: which hybrid-layer kernels a model uses and whether they are installed."""
from __future__ import annotations

import logging
from types import SimpleNamespace

import torch

from jev_worker import kernels


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
    assert kernels.describe(config) == {"kernels": {"causal-conv1d": "1.7.0", "flash-linear-attention": None}}
    with caplog.at_level(logging.WARNING, logger="jev_worker.kernels"):
        assert kernels.warn_if_missing(config, torch.device("cpu")) == ["flash-linear-attention"]
        assert not caplog.records  # on CPU the fallback is the only path: nothing to warn about
        kernels.warn_if_missing(config, torch.device("cuda"))
    assert "flash-linear-attention" in caplog.text and "slow" in caplog.text

