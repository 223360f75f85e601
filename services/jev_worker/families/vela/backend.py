"""vela-decoder: the `causal-lm-rows` engine over a Vela 2.0 decoder package (0.8B / 4B / 9B), loaded natively.

The package's backbone is a stock Qwen3.5 text model: `config.json` nests its config as `backbone_config`
(model_type qwen3_5_text) and the shards of `model.safetensors.index.json` hold its tensors under
`backbone.` (beside the readout's heads); the tokenizer is `tokenizer.json`. The backbone is built with
`AutoModel.from_config` and loaded strictly from those tensors: the package's own code (modeling_vela2.py,
vela2_inference.py) is never imported, so `trust_remote_code` stays off.
"""

from __future__ import annotations

import json
import os

from jev_common.checkpoint_files import ServingError

from ...backends.causal_rows import CausalRows
from ...loading.checkpoint import load_exactly, require_files
from ...loading.loader import LoadedModel, pick_device, pick_dtype, placed

CONFIG, INDEX, TOKENIZER, PREFIX = "config.json", "model.safetensors.index.json", "tokenizer.json", "backbone."


def load_vela_decoder(recipe, folder: str, device: str, dtype: str, *, lm_head: bool = False) -> LoadedModel:
    from safetensors import safe_open
    from transformers import AutoConfig, AutoModel, PreTrainedTokenizerFast

    require_files(folder, (CONFIG, INDEX, TOKENIZER), "backend 'vela-decoder'")
    with open(os.path.join(folder, CONFIG), encoding="utf-8") as handle:
        package = json.load(handle)
    backbone = dict(package.get("backbone_config") or {})
    model_type = backbone.pop("model_type", None)
    for key in ("architectures", "transformers_version"):
        backbone.pop(key, None)
    if model_type is None:
        raise ServingError(f"{CONFIG}: backbone_config has no model_type")
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    model = AutoModel.from_config(AutoConfig.for_model(model_type, **backbone))
    with open(os.path.join(folder, INDEX), encoding="utf-8") as handle:
        weight_map = json.load(handle)["weight_map"]
    state = {}
    for shard in sorted({shard for name, shard in weight_map.items() if name.startswith(PREFIX)}):
        with safe_open(os.path.join(folder, shard), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open has no __iter__
                if name.startswith(PREFIX):
                    state[name[len(PREFIX) :]] = handle.get_tensor(name)
    load_exactly(model, state, source=f"{INDEX} ({PREFIX!r})", fits="backbone_config")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=os.path.join(folder, TOKENIZER))
    return LoadedModel(placed(model, dev, torch_dtype), tokenizer, None, dev, torch_dtype, folder)


class VelaDecoder(CausalRows):
    name = "vela-decoder"
    prefix_reuse = (
        "off: every question block runs whole after the state prefix (prefix + block), as the "
        "package's tree computes it; no prefix state is reused (L3 off)"
    )
    load = staticmethod(load_vela_decoder)  # Backend.load: the package's backbone, built natively
