"""Readout name (a recipe's `serving.readout`) -> its module. A new readout is one module plus one line here."""
from __future__ import annotations

import importlib

from .base import Readout, ServingError

READOUTS = {
    "label-tokens": "jev_worker.readouts.label_tokens:LabelTokens",
    "jemm-labels": "jev_worker.families.jemm.readout:JemmLabels",
    "cua-s1-labels": "jev_worker.families.cua_s1.readout:CuaS1Labels",
    "code-readout": "jev_worker.readouts.code_readout:CodeReadout",
    "scalar-head": "jev_worker.families.open_jev.readout:ScalarHead",
    "clm-cosine": "jev_worker.families.clm.readout:ClmCosine",
    "laya-heads": "jev_worker.families.laya.readout:LayaHeads",
    "omnijev-heads": "jev_worker.families.omnijev.readout:OmniJevReadout",
    "vela-heads": "jev_worker.families.vela.readout:VelaHeadsReadout",
    "vela-marker-heads": "jev_worker.families.vela.marker:VelaMarkerHeads",
    "clef-joint-head": "jev_worker.families.clef.readout:ClefJointReadout",
    "valen-head": "jev_worker.families.valen.readout:ValenHeadReadout",
}


def readout_class(name: str) -> type[Readout]:
    if name not in READOUTS:
        raise ServingError(f"unknown readout {name!r} (recipe serving.readout); this worker has: "
                           f"{', '.join(sorted(READOUTS))}")
    module, _, cls = READOUTS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def build_readout(name: str, options: dict) -> Readout:
    return readout_class(name)(options=dict(options))
