"""Valen's vision model for the preencoder (families/registry.py `VISION_MODELS`): a Valen checkpoint holds only its
trained deltas; its base is the one `checkpoint.pt` names (the recipe's `base_path` option, or the local Hugging
Face cache), checked against the manifest's sha256, and Valen's trained vision blocks and merger are written over
the base's, so the embeddings are the ones Valen's own forward computes (checkpoint.py)."""

from __future__ import annotations

import logging

from jev_common.checkpoint_files import ServingError
from jev_common.vl import load_vl_model, load_vl_processor

from .checkpoint import find_base, forget_checkpoint, load_visual, read_checkpoint, verify_base

log = logging.getLogger("jev.preencoder")


def load_vision(recipe, folder: str, dtype, device, **_):
    """-> (processor, model) whose vision tower makes this Valen checkpoint's image embeddings."""
    checkpoint = read_checkpoint(folder)
    if not checkpoint.visual:
        raise ServingError(
            f"the Valen checkpoint in {folder} trains no vision weights (stage "
            f"{checkpoint.config['stage']!r}); its images are the base's"
        )
    base = find_base(checkpoint.base, recipe.serving.options.get("base_path"))
    verify_base(base, checkpoint)
    log.info(
        "Valen vision: base %s@%s from %s, %d trained vision tensors",
        checkpoint.base["repo"],
        checkpoint.base["revision"],
        base,
        len(checkpoint.visual),
    )
    model = load_vl_model(base, dtype=dtype, device=device)
    load_visual(model.model.visual, checkpoint)
    forget_checkpoint()
    return load_vl_processor(base), model
