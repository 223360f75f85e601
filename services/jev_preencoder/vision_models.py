"""The processor and vision-language model whose vision tower (and merger) makes a recipe's image embeddings.

Most checkpoints are loaded as they are. A Valen checkpoint (family `valen`) holds only its trained
deltas: its base is the one `checkpoint.pt` names (the recipe's `base_path` option, or the local Hugging Face
cache), checked against the manifest's sha256, and Valen's trained vision blocks and merger are written over
the base's, so the embeddings are the ones Valen's own forward computes (jev_common/valen_checkpoint.py).
"""
from __future__ import annotations

import logging

from jev_common.checkpoint_files import ServingError
from jev_common.vl import load_vl_model, load_vl_processor

log = logging.getLogger("jev.preencoder")


def load_vision(recipe, folder: str, dtype, device, **kwargs):
    """-> (processor, model) for `folder`, the recipe's checkpoint."""
    if recipe is not None and recipe.serving.family == "valen":
        return _valen(recipe, folder, dtype, device)
    return load_vl_processor(folder, **kwargs), load_vl_model(folder, dtype=dtype, device=device, **kwargs)


def _valen(recipe, folder: str, dtype, device):
    from jev_common.valen_checkpoint import forget_checkpoint, find_base, load_visual, read_checkpoint, verify_base

    checkpoint = read_checkpoint(folder)
    if not checkpoint.visual:
        raise ServingError(f"the Valen checkpoint in {folder} trains no vision weights (stage "
                           f"{checkpoint.config['stage']!r}); its images are the base's")
    base = find_base(checkpoint.base, recipe.serving.options.get("base_path"))
    verify_base(base, checkpoint)
    log.info("Valen vision: base %s@%s from %s, %d trained vision tensors", checkpoint.base["repo"],
             checkpoint.base["revision"], base, len(checkpoint.visual))
    model = load_vl_model(base, dtype=dtype, device=device)
    load_visual(model.model.visual, checkpoint)
    forget_checkpoint()
    return load_vl_processor(base), model
