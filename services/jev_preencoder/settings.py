"""Preencoder configuration from the environment: every name, default and doc line is in `ENV`
(README's preencoder table and the `PreencoderSettings` field defaults are taken from it).

The service (`serve`) is a backend of the frontend, like a worker: with an internal token configured it serves
`POST /v1/preencode` only to callers that carry it (jev_common/internal_auth.py); callers reach it through the
frontend's own `POST /v1/preencode`, where their API keys are checked."""

from __future__ import annotations

from dataclasses import dataclass, replace

from jev_common.assets import DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS
from jev_common.config import LOG_LEVEL, RECIPES_DIR, EnvTable, bytes_var, env_fields, int_var, optional_var, str_var
from jev_common.internal_auth import INTERNAL_TOKEN_FILE, INTERNAL_TOKENS, load_internal_tokens

ENV = EnvTable(
    "preencoder",
    [
        str_var("JEV_PREENCODER_HOST", "0.0.0.0", "listen address (serve)"),
        int_var("JEV_PREENCODER_PORT", 8090, "listen port (serve)"),
        optional_var("JEV_RECIPE", "a vision-language recipe name or folder; `--recipe` overrides"),
        optional_var("JEV_MODEL_PATH", "local checkpoint folder, overrides the recipe's source; `--model` overrides"),
        str_var("JEV_DEVICE", "auto", "`auto` = CUDA when available, else CPU; `--device` overrides"),
        str_var(
            "JEV_DTYPE",
            "",
            "dtype of the vision tower and of the stored embeddings; `--dtype` overrides",
            shown="the recipe's (`auto`: bfloat16 on CUDA, float32 on CPU)",
        ),  # "" = the recipe's dtype
        str_var(
            "JEV_ASSET_DIR", "/var/lib/jev/assets", "where assets are written; `--out` overrides", ("JEV_VL_IMGCACHE",)
        ),
        str_var("JEV_REDIS_URL", "redis://127.0.0.1:6379/0", "cache index; `none` (or `--redis none`) skips it"),
        bytes_var(
            "JEV_PREENCODER_MAX_IMAGE_BYTES",
            DEFAULT_MAX_IMAGE_BYTES,
            "cap on one image's decoded bytes (checked before decoding the base64)",
        ),
        int_var(
            "JEV_PREENCODER_MAX_IMAGE_PIXELS",
            DEFAULT_MAX_IMAGE_PIXELS,
            "cap on width × height (checked before the pixels are decoded)",
        ),
        bytes_var("JEV_PREENCODER_MAX_BODY_BYTES", 256 << 20, "cap on a `POST /v1/preencode` body"),
        INTERNAL_TOKENS,
        INTERNAL_TOKEN_FILE,
        # `encode` lowers the level to WARNING when JEV_LOG_LEVEL is unset (jev_preencoder.cli)
        str_var(LOG_LEVEL.name, LOG_LEVEL.default, LOG_LEVEL.doc, shown="`INFO` (serve), `WARNING` (encode)"),
        RECIPES_DIR,
    ],
)


@dataclass(frozen=True)
class PreencoderSettings:
    recipe: str | None = ENV["JEV_RECIPE"].field()
    model_path: str | None = ENV["JEV_MODEL_PATH"].field()
    host: str = ENV["JEV_PREENCODER_HOST"].field()
    port: int = ENV["JEV_PREENCODER_PORT"].field()
    device: str = ENV["JEV_DEVICE"].field()
    dtype: str = ENV["JEV_DTYPE"].field()  # "" = the recipe's dtype (auto: bfloat16 on CUDA, float32 on CPU)
    asset_dir: str = ENV["JEV_ASSET_DIR"].field()
    redis_url: str = ENV["JEV_REDIS_URL"].field()
    max_image_bytes: int = ENV["JEV_PREENCODER_MAX_IMAGE_BYTES"].field()
    max_image_pixels: int = ENV["JEV_PREENCODER_MAX_IMAGE_PIXELS"].field()
    max_body_bytes: int = ENV["JEV_PREENCODER_MAX_BODY_BYTES"].field()
    internal_tokens: tuple[str, ...] = ENV["JEV_INTERNAL_TOKENS"].field(secret=True)  # (serve) empty: any caller

    @classmethod
    def from_env(cls, **overrides) -> PreencoderSettings:
        settings = cls(**env_fields(cls, ENV))
        return replace(settings, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def for_serving(cls) -> PreencoderSettings:
        """The service's settings: the environment's, with the internal tokens of the token file too (read, or
        generated, only here: `encode` is a command-line job that takes no requests)."""
        settings = cls.from_env()
        return replace(
            settings, internal_tokens=load_internal_tokens(settings.internal_tokens, INTERNAL_TOKEN_FILE.get())
        )
