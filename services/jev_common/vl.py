"""Vision-language checkpoint helpers shared by the preencoder and the worker.

- `load_vl_processor(folder)`: AutoProcessor when it works; otherwise (transformers 5.x builds a
  Qwen2-VL / Qwen3-VL processor only with a torchvision video processor, and PyPI's torchvision does
  not run beside the pinned CPU torch) the same processor class without its video half. Images go through
  the checkpoint's own image processor (its PIL backend) either way, so pixels and grids are the same.
- `checkpoint_identity(...)`: the string that names the exact checkpoint; assets and cache-index
  keys are namespaced by it, so a new checkpoint never reuses old embeddings.
- `processor_identity(processor)`: a digest of the image-processing settings an asset was made with.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .recipe import Recipe

log = logging.getLogger("jev.vl")

_FULL_HASH_LIMIT = 256 << 20  # weight files up to this size are hashed whole
_SAMPLE = 1 << 20  # larger ones: header + first and last MiB + size
_CONFIG_FILES = ("config.json", "preprocessor_config.json", "processor_config.json", "generation_config.json")


def _image_only_processor_class(base: type[Any]) -> type[Any]:
    """`base` (Qwen2VLProcessor, Qwen3VLProcessor, ...) with image processor + tokenizer only: the
    processor's attributes come from its __init__ signature, so this one asks for no video processor."""

    def __init__(
        self: Any, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None, **kwargs: Any
    ) -> None:
        base.__init__(self, image_processor=image_processor, tokenizer=tokenizer, chat_template=chat_template, **kwargs)

    return type(f"ImageOnly{base.__name__}", (base,), {"__init__": __init__, "__module__": __name__})


def _processor_class_name(folder: Path) -> str | None:
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        value = _read_json(folder / name).get("processor_class")
        if value:
            return str(value)
    model_type = _read_json(folder / "config.json").get("model_type")
    if not model_type:
        return None
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES

    name = PROCESSOR_MAPPING_NAMES.get(model_type)
    return str(name) if name else None


def load_vl_processor(folder: str | os.PathLike[str], **kwargs: Any) -> Any:
    """The checkpoint's processor: tokenizer + image processor + chat template."""
    import transformers
    from transformers import AutoProcessor

    try:
        processor = AutoProcessor.from_pretrained(folder, **kwargs)
        if (
            getattr(processor, "image_processor", None) is not None
            and getattr(processor, "tokenizer", None) is not None
        ):
            return processor
        reason = f"AutoProcessor gave a {type(processor).__name__} without an image processor"
    except (OSError, ImportError, ValueError, AttributeError, TypeError) as exc:
        reason = f"{type(exc).__name__}: {str(exc)[:200]}"
    class_name = _processor_class_name(Path(folder))
    base: Any = getattr(transformers, class_name, None) if class_name else None
    if not isinstance(base, type) or "video_processor" not in cast(Any, base).get_attributes():
        raise RuntimeError(f"cannot load a processor from {folder}: {reason}")
    log.info("processor for %s: %s without its video processor (%s)", folder, class_name, reason)
    return _image_only_processor_class(base).from_pretrained(folder, **kwargs)


def load_vl_model(folder: str | os.PathLike[str], dtype: Any = None, device: Any = None, **kwargs: Any) -> Any:
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, dtype=dtype or torch.float32, **kwargs)
    if device is not None:
        model.to(device)
    model.eval()
    model.requires_grad_(False)
    return model


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    size = path.stat().st_size
    digest.update(f"{path.name}:{size}:".encode())
    with open(path, "rb") as handle:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
        else:
            head = handle.read(8)
            header_len = int.from_bytes(head, "little") if path.suffix == ".safetensors" and len(head) == 8 else 0
            digest.update(head + handle.read(min(header_len, 100 << 20)))
            digest.update(handle.read(_SAMPLE))
            handle.seek(max(0, size - _SAMPLE))
            digest.update(handle.read(_SAMPLE))
    return digest.hexdigest()


def folder_fingerprint(folder: str | os.PathLike[str]) -> str:
    """Content digest of a local checkpoint: config files and weight files (large ones sampled)."""
    root = Path(folder)
    digest = hashlib.sha256()
    if not root.is_dir():  # loading will fail and say why; the identity must not fail first
        return "missing-" + hashlib.sha256(str(root).encode()).hexdigest()[:24]
    for name in _CONFIG_FILES:
        file = root / name
        if file.is_file():
            digest.update(name.encode() + b"\0" + file.read_bytes() + b"\0")
    weights = sorted(p for p in root.iterdir() if p.suffix in (".safetensors", ".bin", ".gguf") and p.is_file())
    for file in weights:
        digest.update(_file_digest(file).encode())
    return digest.hexdigest()[:32]


def checkpoint_identity(recipe: Recipe | None = None, model_path: str | os.PathLike[str] | None = None) -> str:
    """The recipe's pinned identity, or for a local folder (JEV_MODEL_PATH) a digest of its content.

    Content, not the path: the preencoder and the workers may mount one checkpoint at different paths.
    """
    if model_path:
        return f"local:{folder_fingerprint(model_path)}"
    if recipe is None:
        raise ValueError("checkpoint_identity needs a recipe or a model path")
    return recipe.identity


def processor_identity(processor: Any) -> str:
    """Digest of the image processor's settings (resize bounds, patch/merge sizes, normalisation)."""
    image_processor = getattr(processor, "image_processor", processor)
    settings = image_processor.to_dict()
    for volatile in ("_processor_class", "processor_class", "image_processor_type"):
        settings.pop(volatile, None)
    blob = json.dumps(settings, sort_keys=True, default=str)
    return f"{type(image_processor).__name__.removesuffix('Pil')}:{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def merge_size(processor_or_model: Any) -> int:
    image_processor = getattr(processor_or_model, "image_processor", None)
    if image_processor is not None and getattr(image_processor, "merge_size", None):
        return int(image_processor.merge_size)
    config = getattr(processor_or_model, "config", None)
    vision = getattr(config, "vision_config", None)
    if vision is not None:
        return int(vision.spatial_merge_size)
    return 2
