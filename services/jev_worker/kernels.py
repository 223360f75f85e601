"""The fast paths of hybrid layers, which transformers takes only when their packages import: causal-conv1d (LFM2's
short convolutions, the convolution of Gated DeltaNet layers) and fla (Gated DeltaNet, the Qwen3.5-based recipes).
Without them transformers runs PyTorch fallbacks, silently and far slower on a GPU; /health says which are present
for the loaded model and the worker warns when a model with such layers runs on CUDA without them."""
from __future__ import annotations

import logging
from importlib import metadata

log = logging.getLogger("jev_worker.kernels")

# config.layer_types value -> the distributions whose kernels that layer uses
LAYER_KERNELS = {"conv": ("causal-conv1d",), "linear_attention": ("flash-linear-attention", "causal-conv1d")}


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


def describe(config) -> dict:
    """{"kernels": {distribution: version or None}} for a hybrid model, else {}."""
    wanted = needed(config)
    return {"kernels": {d: version(d) for d in wanted}} if wanted else {}


def warn_if_missing(config, device) -> list[str]:
    """Log (and return) the kernels a hybrid model on CUDA lacks."""
    missing = [d for d, v in describe(config).get("kernels", {}).items() if v is None]
    if missing and getattr(device, "type", str(device)) == "cuda":
        log.warning("hybrid layers on CUDA without %s: transformers falls back to PyTorch code (slow); "
                    "the CUDA image (images/cuda.Dockerfile) has them", ", ".join(missing))
    return missing
