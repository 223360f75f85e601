"""Backend name (a recipe's `serving.backend`) -> its module. A new backend is one module plus one line here."""
from __future__ import annotations

import importlib

from ..readouts.base import ServingError

BACKENDS = {
    "causal-lm": "jev_worker.backends.causal_lm:CausalLM",
    "noncausal-lm": "jev_worker.backends.noncausal_lm:NoncausalLM",
    "external-http": "jev_worker.backends.external:ExternalHTTP",
    "encoder": "jev_worker.backends.encoder:Encoder",
    "causal-lm-rows": "jev_worker.backends.causal_rows:CausalRows",
    "vela-decoder": "jev_worker.families.vela.backend:VelaDecoder",
    "causal-lm-joint": "jev_worker.backends.joint:CausalJoint",
    "valen-lora": "jev_worker.families.valen.backend:ValenLora",
}


def build_backend(name: str):
    if name not in BACKENDS:
        raise ServingError(f"unknown backend {name!r} (recipe serving.backend); this worker has: "
                           f"{', '.join(sorted(BACKENDS))}")
    module, _, cls = BACKENDS[name].partition(":")
    return getattr(importlib.import_module(module), cls)()
