"""Readout name (a recipe's `serving.readout`) -> its module. A new readout is one module plus one line here."""
from __future__ import annotations

import importlib

from .base import Readout, ServingError

READOUTS = {
    "label-tokens": "jev_worker.readouts.label_tokens:LabelTokens",
    "jemm-labels": "jev_worker.readouts.jemm:JemmLabels",
    "cua-s1-labels": "jev_worker.readouts.cua_s1:CuaS1Labels",
    "code-readout": "jev_worker.readouts.code_readout:CodeReadout",
    "scalar-head": "jev_worker.readouts.scalar_head:ScalarHead",
    "clm-cosine": "jev_worker.readouts.clm:ClmCosine",
    "laya-heads": "jev_worker.readouts.laya_heads:LayaHeads",
    "omnijev-heads": "jev_worker.readouts.omnijev:OmniJevReadout",
    "vela-heads": "jev_worker.readouts.vela_heads:VelaHeadsReadout",
    "vela-marker-heads": "jev_worker.readouts.vela_marker:VelaMarkerHeads",
    "clef-joint-head": "jev_worker.readouts.clef:ClefJointReadout",
    "valen-head": "jev_worker.readouts.valen:ValenHeadReadout",
}


def readout_class(name: str) -> type[Readout]:
    if name not in READOUTS:
        raise ServingError(f"unknown readout {name!r} (recipe serving.readout); this worker has: "
                           f"{', '.join(sorted(READOUTS))}")
    module, _, cls = READOUTS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_readout(name: str, options: dict) -> Readout:
    return readout_class(name)(options=dict(options))
