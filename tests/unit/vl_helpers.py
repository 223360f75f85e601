"""Shared by the image tests: the tiny Qwen2-VL checkpoint (built once per process), PNG data URIs,
manifest lines and a loaded preencoder."""

from __future__ import annotations

import atexit
import base64
import functools
import io
import shutil
import tempfile

import numpy as np

PROMPT_TEXT = "Which shape is in the picture?"


@functools.cache
def tiny_vl_checkpoint() -> str:
    from tools.tiny_checkpoints import make_tiny_vl

    folder = tempfile.mkdtemp(prefix="jev-tiny-vl-")
    atexit.register(shutil.rmtree, folder, True)
    return str(make_tiny_vl(folder))


def tiny_jev_vl_checkpoint() -> str:
    """A tiny checkpoint in JEV-27B-VL's release layout (the jev-vl profile's family), removed at exit."""
    from tools.tiny_jev_vl_checkpoint import make_tiny_jev_vl

    folder = tempfile.mkdtemp(prefix="jev-tiny-jev-vl-")
    atexit.register(shutil.rmtree, folder, True)
    return str(make_tiny_jev_vl(folder))


def pattern_image(seed: int = 0, size: tuple[int, int] = (56, 56)):
    """A deterministic RGB pattern (stripes + checks) that differs by seed."""
    from PIL import Image

    width, height = size
    yy, xx = np.indices((height, width))
    r = ((xx * (3 + seed) + yy) % 256).astype(np.uint8)
    g = (((xx // 7 + yy // 7 + seed) % 2) * 255).astype(np.uint8)
    b = ((yy * 5 + seed * 40) % 256).astype(np.uint8)
    return Image.fromarray(np.stack([r, g, b], axis=-1), "RGB")


def data_uri(image, fmt: str = "PNG") -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    mime = {"PNG": "png", "JPEG": "jpeg", "GIF": "gif", "WEBP": "webp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def png_uri(seed: int = 0, size: tuple[int, int] = (56, 56)) -> str:
    return data_uri(pattern_image(seed, size))


def request_line(uri: str, question: str = "What is shown?") -> dict:
    return {
        "kind": "choice",
        "state": {"image": uri, "text": "A picture."},
        "question": question,
        "options": ["a square", "a circle"],
    }


@functools.cache
def _encoder_for(checkpoint: str):
    from jev_preencoder.encode import Encoder
    from jev_preencoder.settings import PreencoderSettings

    return Encoder(PreencoderSettings(model_path=checkpoint, device="cpu", dtype="float32", redis_url="none"))


def tiny_encoder():
    """A loaded preencoder on the tiny checkpoint (shared; its settings' asset_dir is unused)."""
    return _encoder_for(tiny_vl_checkpoint())
