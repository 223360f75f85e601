"""valen-lora: the `causal-lm-rows` engine over a Valen checkpoint: its Qwen3.5 base with the checkpoint's
trained deltas (families/valen/checkpoint.py) applied at load.

A Valen folder holds `checkpoint.pt` + `config.json` only; the frozen base is the one `checkpoint.pt`'s
`base_manifest` names (`repo`@`revision`), taken from the local Hugging Face cache, or from the folder
given as the readout option `base_path`, and checked against the manifest's `weight_sha256` before a weight
is read. The base loads as Qwen3_5ForConditionalGeneration with its own processor; the LoRA is merged into
the language model's Linear weights in FP32 and the trained vision-tower values replace the base's. Each
question's branch then runs whole (state + question), as Valen's compiler lays it out and its reference runs it.
"""

from __future__ import annotations

import logging

from jev_common.checkpoint_files import ServingError

from ...backends.causal_rows import CausalRows
from ...loading.loader import LoadedModel, pick_device, pick_dtype, placed
from .checkpoint import apply_deltas, find_base, read_checkpoint, verify_base

log = logging.getLogger("jev.worker.valen")


def load_valen(recipe, folder: str, device: str, dtype: str, *, lm_head: bool = False) -> LoadedModel:
    """The Valen checkpoint in `folder` on the base its manifest names (in the recipe's `serving.options.base_path`,
    else the Hugging Face cache)."""
    from transformers import AutoModelForImageTextToText

    from jev_common.vl import load_vl_processor

    checkpoint = read_checkpoint(folder)
    base = find_base(checkpoint.base, recipe.serving.options.get("base_path"))
    verify_base(base, checkpoint)
    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    log.info(
        "loading Valen %s on base %s@%s from %s (%s, %s)",
        folder,
        checkpoint.base["repo"],
        checkpoint.base["revision"],
        base,
        dev,
        torch_dtype,
    )
    processor = load_vl_processor(base)
    model, info = AutoModelForImageTextToText.from_pretrained(base, dtype=torch_dtype, output_loading_info=True)
    if info.get("missing_keys") or info.get("mismatched_keys"):
        raise ServingError(
            f"the Valen base in {base} did not load whole (missing {sorted(info['missing_keys'])[:3]}, "
            f"mismatched {list(info.get('mismatched_keys') or [])[:3]})"
        )
    apply_deltas(model, checkpoint)
    return LoadedModel(placed(model, dev), processor.tokenizer, processor, dev, torch_dtype, folder)


class ValenLora(CausalRows):
    name = "valen-lora"
    prefix_reuse = (
        "off: each question's branch runs whole (state + question), as Valen's compiler lays it out "
        "and its reference computes it; no prefix state is reused (L3 off)"
    )
    load = staticmethod(load_valen)  # Backend.load: the base the checkpoint names, its deltas applied
