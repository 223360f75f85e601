"""Preencoder configuration from the environment (docs/images.md: preencoder env table)."""
from __future__ import annotations

import os
from dataclasses import dataclass, replace

from jev_common.assets import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS
from jev_common.config import env_bytes, env_int, env_str


@dataclass(frozen=True)
class PreencoderSettings:
    recipe: str | None = None
    model_path: str | None = None
    host: str = "0.0.0.0"
    port: int = 8090
    device: str = "auto"
    dtype: str = ""  # "" = the recipe's dtype (auto: bfloat16 on CUDA, float32 on CPU)
    asset_dir: str = "/var/lib/jev/assets"
    redis_url: str = "redis://127.0.0.1:6379/0"
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    max_body_bytes: int = 256 << 20

    @classmethod
    def from_env(cls, **overrides) -> "PreencoderSettings":
        settings = cls(
            recipe=os.environ.get("JEV_RECIPE") or None,
            model_path=os.environ.get("JEV_MODEL_PATH") or None,
            host=env_str("JEV_PREENCODER_HOST", "0.0.0.0"),
            port=env_int("JEV_PREENCODER_PORT", 8090),
            device=env_str("JEV_DEVICE", "auto"),
            dtype=env_str("JEV_DTYPE", ""),
            asset_dir=env_str("JEV_ASSET_DIR", "/var/lib/jev/assets"),
            redis_url=env_str("JEV_REDIS_URL", "redis://127.0.0.1:6379/0"),
            max_image_bytes=env_bytes("JEV_PREENCODER_MAX_IMAGE_BYTES", DEFAULT_MAX_IMAGE_BYTES),
            max_image_pixels=env_int("JEV_PREENCODER_MAX_IMAGE_PIXELS", DEFAULT_MAX_IMAGE_PIXELS),
            max_body_bytes=env_bytes("JEV_PREENCODER_MAX_BODY_BYTES", 256 << 20),
        )
        return replace(settings, **{k: v for k, v in overrides.items() if v is not None})
