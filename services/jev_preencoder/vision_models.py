"""The processor and vision-language model whose vision tower (and merger) makes a recipe's image embeddings.

Most checkpoints are loaded as they are. A family whose checkpoint is not a plain vision-language model (one that
holds trained deltas over a base, say) names its own loader in the worker's family registry
(jev_worker/families/registry.py `VISION_MODELS`), and the preencoder asks the registry for it.
"""

from __future__ import annotations

from jev_common.vl import load_vl_model, load_vl_processor


def load_vision(recipe, folder: str, dtype, device, **kwargs):
    """-> (processor, model) for `folder`, the recipe's checkpoint."""
    from jev_worker.families.registry import vision_loader

    family_loader = vision_loader(recipe.serving.family) if recipe is not None else None
    if family_loader is not None:
        return family_loader(recipe, folder, dtype, device, **kwargs)
    return load_vl_processor(folder, **kwargs), load_vl_model(folder, dtype=dtype, device=device, **kwargs)
