"""Family name (a recipe's `serving.family`) -> its readout class. A new family is one folder under families/
(its readout, prompt layout, heads and, only if no generic one fits, its backend) plus one line here.

The generic readouts are families too: `label-tokens` (label-token rows of the LM head, for user-supplied
checkpoints and SmolLM2) and `code-readout` (the code-readout v1 checkpoint format, served with the recipe's
prompt; D3 and pplx-decider are families of their own on the same readout, each with its upstream's prompt). The
readout says which backend runs it
(`Readout.make_backend`), so a recipe never pairs a readout with a backend it cannot run on.
"""

from __future__ import annotations

from ..loading.named import named_class
from ..protocols import Readout

FAMILIES = {
    "label-tokens": "jev_worker.readouts.label_tokens:LabelTokens",
    "code-readout": "jev_worker.readouts.code_readout:CodeReadout",
    "option-scoring": "jev_worker.readouts.option_scoring:OptionScoring",
    "clef": "jev_worker.families.clef.readout:ClefJointReadout",
    "clm": "jev_worker.families.clm.readout:ClmCosine",
    "cua-s1": "jev_worker.families.cua_s1.readout:CuaS1Labels",
    "cua-s1-screenshot": "jev_worker.families.cua_s1.screenshot:CuaS1ScreenshotLabels",
    "d3": "jev_worker.families.d3.readout:D3CodeReadout",
    "decider": "jev_worker.families.decider.readout:DeciderLabels",
    "jemm": "jev_worker.families.jemm.readout:JemmLabels",
    "jev-vl": "jev_worker.families.jev_vl.readout:JevVlReadout",
    "laya": "jev_worker.families.laya.readout:LayaHeads",
    "lfm2": "jev_worker.families.lfm2.readout:Lfm2JsonValues",
    "omnijev": "jev_worker.families.omnijev.readout:OmniJevReadout",
    "open-jev": "jev_worker.families.open_jev.readout:ScalarHead",
    "pplx-decider": "jev_worker.families.pplx_decider.readout:PplxCodeReadout",
    "startlux": "jev_worker.families.startlux.readout:StartLuxLabels",
    "valen": "jev_worker.families.valen.readout:ValenHeadReadout",
    "vela-decoder": "jev_worker.families.vela.readout:VelaHeadsReadout",
    "vela-encoder": "jev_worker.families.vela.marker:VelaMarkerHeads",
}

# Families whose image embeddings need their own vision model (the preencoder asks: jev_preencoder/vision_models.py);
# every other vision-language checkpoint is loaded as it is.
VISION_MODELS = {
    "valen": "jev_worker.families.valen.vision:load_vision",
}


def family_class(name: str) -> type[Readout]:
    """The readout class of family `name` (ServingError naming the known ones when there is none)."""
    return named_class(FAMILIES, name, "family", " (recipe serving.family)")


def build_readout(name: str, options: dict) -> Readout:
    """Family `name`'s readout with the recipe's `serving.options` (an unknown option is a ServingError)."""
    return family_class(name)(options=dict(options))


def vision_loader(name: str):
    """Family `name`'s own vision-model loader `(recipe, folder, dtype, device) -> (processor, model)`, or None."""
    return named_class(VISION_MODELS, name, "vision model") if name in VISION_MODELS else None
