"""Worker configuration from the environment (README: worker env table)."""
from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace

from jev_common.config import env_bool, env_bytes, env_float, env_int, env_list, env_str
from jev_common.recipe import DEFAULT_RECIPE, Recipe, load_recipe


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
    max_body_bytes: int = 16 << 20
    threads: int = 0
    api_keys: tuple[str, ...] = ()  # empty: auth off

    @classmethod
    def from_env(cls, **overrides) -> "WorkerSettings":
        recipe = load_recipe(env_str("JEV_RECIPE", DEFAULT_RECIPE))
        from jev_common.config import parse_bytes

        cache = CacheSettings(
            enabled=env_bool("JEV_CACHE", True, "JEV_VL_CACHE"),
            l1_max=env_int("JEV_CACHE_L1_MAX", recipe.cache.l1_max, "JEV_VL_CACHE_L1_MAX"),
            l2_bytes=env_bytes("JEV_CACHE_L2_BYTES", parse_bytes(str(recipe.cache.l2_bytes)), "JEV_VL_CACHE_L2_BYTES"),
            l3_bytes=env_bytes("JEV_CACHE_L3_BYTES", parse_bytes(str(recipe.cache.l3_bytes)), "JEV_VL_CACHE_L3_BYTES"),
        )
        port = env_int("JEV_WORKER_PORT", 8000)
        settings = cls(
            recipe=recipe,
            host=env_str("JEV_WORKER_HOST", "0.0.0.0"),
            port=port,
            model_path=os.environ.get("JEV_MODEL_PATH") or None,
            device=env_str("JEV_DEVICE", "auto"),
            dtype=env_str("JEV_DTYPE", recipe.model.dtype),
            max_queue=env_int("JEV_MAX_QUEUE", 64),
            deadline_s=env_float("JEV_DEADLINE_S", 30.0),
            batching=env_bool("JEV_BATCHING", recipe.batching.enabled),
            max_batch_rows=env_int("JEV_MAX_BATCH_ROWS", recipe.batching.max_batch_rows),
            max_wait_ms=env_float("JEV_MAX_WAIT_MS", recipe.batching.max_wait_ms),
            cache=cache,
            asset_dir=env_str("JEV_ASSET_DIR", "/var/lib/jev/assets"),
            redis_url=env_str("JEV_REDIS_URL", "redis://127.0.0.1:6379/0"),
            worker_id=env_str("JEV_WORKER_ID", f"{socket.gethostname()}:{port}"),
            worker_url=env_str("JEV_WORKER_URL", f"http://{socket.gethostname()}:{port}"),
            max_body_bytes=env_bytes("JEV_WORKER_MAX_BODY_BYTES", 16 << 20),
            threads=env_int("JEV_TORCH_THREADS", 0),
            api_keys=env_list("JEV_API_KEYS"),
        )
        return replace(settings, **overrides)
