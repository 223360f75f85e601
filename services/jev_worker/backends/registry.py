"""The generic backends by name: what a readout may run on without a backend of its own. A family's own
backend (Valen's, Vela's decoder) lives in its folder (families/<family>/backend.py) and is built by its
readout (`Readout.make_backend`), never named here."""

from __future__ import annotations

from ..loading.named import named_class
from ..protocols import Backend

BACKENDS = {
    "causal-lm": "jev_worker.backends.causal_lm:CausalLM",
    "noncausal-lm": "jev_worker.backends.noncausal_lm:NoncausalLM",
    "causal-lm-rows": "jev_worker.backends.causal_rows:CausalRows",
    "causal-lm-joint": "jev_worker.backends.joint:CausalJoint",
    "encoder": "jev_worker.backends.encoder:Encoder",
    "external-http": "jev_worker.backends.external:ExternalHTTP",
}


def build_backend(name: str) -> Backend:
    """A generic backend with its defaults (the encoder's default file layout: encoder/ + tokenizer/)."""
    return named_class(BACKENDS, name, "backend")()
