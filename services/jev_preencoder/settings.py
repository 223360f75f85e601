"""Preencoder configuration from the environment: every name, default and doc line is in `ENV`
(README's preencoder table is rendered from it)."""
from __future__ import annotations

from dataclasses import dataclass, replace

from jev_common.assets import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS
from jev_common.config import LOG_LEVEL, RECIPES_DIR, EnvTable, EnvVar

ENV = EnvTable("preencoder", [
    EnvVar("JEV_PREENCODER_HOST", "`0.0.0.0`", "listen address (serve)"),
    EnvVar("JEV_PREENCODER_PORT", "`8090`", "listen port (serve)"),
    EnvVar("JEV_RECIPE", "(none)", "a vision-language recipe name or folder; `--recipe` overrides"),
    EnvVar("JEV_MODEL_PATH", "(none)", "local checkpoint folder, overrides the recipe's source; `--model` overrides"),
    EnvVar("JEV_DEVICE", "`auto`", "`auto` = CUDA when available, else CPU; `--device` overrides"),
    EnvVar("JEV_DTYPE", "the recipe's (`auto`: bfloat16 on CUDA, float32 on CPU)",
           "dtype of the vision tower and of the stored embeddings; `--dtype` overrides"),
    EnvVar("JEV_ASSET_DIR", "`/var/lib/jev/assets`", "where assets are written; `--out` overrides",
           ("JEV_VL_IMGCACHE",)),
    EnvVar("JEV_REDIS_URL", "`redis://127.0.0.1:6379/0`", "cache index; `none` (or `--redis none`) skips it"),
    EnvVar("JEV_PREENCODER_MAX_IMAGE_BYTES", "`10M`",
           "cap on one image's decoded bytes (checked before decoding the base64)"),
    EnvVar("JEV_PREENCODER_MAX_IMAGE_PIXELS", "`25000000`",
           "cap on width × height (checked before the pixels are decoded)"),
    EnvVar("JEV_PREENCODER_MAX_BODY_BYTES", "`256M`", "cap on a `POST /v1/preencode` body"),
    EnvVar(LOG_LEVEL.name, "`INFO` (serve), `WARNING` (encode)", LOG_LEVEL.doc),
    RECIPES_DIR,
])


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
            recipe=ENV["JEV_RECIPE"].get_optional(),
            model_path=ENV["JEV_MODEL_PATH"].get_optional(),
            host=ENV["JEV_PREENCODER_HOST"].get("0.0.0.0"),
            port=ENV["JEV_PREENCODER_PORT"].get_int(8090),
            device=ENV["JEV_DEVICE"].get("auto"),
            dtype=ENV["JEV_DTYPE"].get(""),
            asset_dir=ENV["JEV_ASSET_DIR"].get("/var/lib/jev/assets"),
            redis_url=ENV["JEV_REDIS_URL"].get("redis://127.0.0.1:6379/0"),
            max_image_bytes=ENV["JEV_PREENCODER_MAX_IMAGE_BYTES"].get_bytes(DEFAULT_MAX_IMAGE_BYTES),
            max_image_pixels=ENV["JEV_PREENCODER_MAX_IMAGE_PIXELS"].get_int(DEFAULT_MAX_IMAGE_PIXELS),
            max_body_bytes=ENV["JEV_PREENCODER_MAX_BODY_BYTES"].get_bytes(256 << 20),
        )
        return replace(settings, **{k: v for k, v in overrides.items() if v is not None})
