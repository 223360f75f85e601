"""The fast paths of hybrid layers, which transformers takes only when their packages import: causal-conv1d (LFM2's
short convolutions, the convolution of Gated DeltaNet layers) and fla (Gated DeltaNet, the Qwen3.5-based recipes).

transformers picks a package's kernel when the model's module is imported, whatever the device: on CPU that kernel
then fails (`Expected x.is_cuda() to be true`). So on any device but CUDA the worker hides the packages before
loading (`use_on`), and transformers takes its PyTorch paths; on CUDA without them it takes those paths too,
silently and far slower, so the worker warns. /health says, for a hybrid model, which are installed and used."""

from __future__ import annotations

import importlib.util
import logging
import sys
from importlib import metadata

log = logging.getLogger("jev_worker.engine.kernels")

# config.layer_types value -> the distributions whose kernels that layer uses
LAYER_KERNELS = {"conv": ("causal-conv1d",), "linear_attention": ("flash-linear-attention", "causal-conv1d")}
MODULES = {"causal-conv1d": "causal_conv1d", "flash-linear-attention": "fla"}


def version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def needed(config) -> list[str]:
    """The kernel distributions the model's layer types use (none for a plain transformer)."""
    text = getattr(config, "text_config", None) or config
    kinds = set(getattr(text, "layer_types", None) or ())
    return sorted({d for kind in kinds for d in LAYER_KERNELS.get(kind, ())})


def on_cuda(device) -> bool:
    return getattr(device, "type", str(device)) == "cuda"


def use_on(device) -> list[str]:
    """Before the model's modules are imported: on a device other than CUDA, make the kernel packages unimportable
    (transformers then decorates its PyTorch paths). The modules hidden; a package imported already stays."""
    if on_cuda(device):
        return []
    hidden = []
    for module in MODULES.values():
        if module in sys.modules:
            if sys.modules[module] is not None:
                log.warning(
                    "%s was imported before the model loaded on %s: its CUDA kernels may be picked", module, device
                )
            continue
        if importlib.util.find_spec(module) is not None:
            sys.modules[module] = None  # type: ignore[assignment]  # `import` now raises ImportError
            hidden.append(module)
    return hidden


def used(distribution: str) -> bool:
    return version(distribution) is not None and sys.modules.get(MODULES[distribution], ...) is not None


def describe(config) -> dict:
    """{"kernels": {distribution: {"version", "used"}}} for a hybrid model, else {}."""
    wanted = needed(config)
    return {"kernels": {d: {"version": version(d), "used": used(d)} for d in wanted}} if wanted else {}


def warn_if_missing(config, device) -> list[str]:
    """Log (and return) the kernels a hybrid model on CUDA lacks."""
    missing = [d for d in needed(config) if version(d) is None]
    if missing and on_cuda(device):
        log.warning(
            "hybrid layers on CUDA without %s: transformers falls back to PyTorch code (slow); "
            "the CUDA image (images/cuda.Dockerfile) has them",
            ", ".join(missing),
        )
    return missing
