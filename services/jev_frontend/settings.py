"""Frontend configuration, read once from the environment (table in docs/frontend.md)."""
from __future__ import annotations

from dataclasses import dataclass

from yarl import URL

from jev_common.config import env_bytes, env_float, env_int, env_list, env_str


@dataclass(frozen=True)
class Settings:
    host: str = "0.0.0.0"
    port: int = 8080
    backend_url: str = "http://127.0.0.1:8000"
    timeout_s: float = 30.0
    max_body_bytes: int = 16 << 20
    max_connections: int = 64
    api_keys: tuple[str, ...] = ()  # empty: auth off

    def __post_init__(self) -> None:
        url = URL(self.backend_url)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"JEV_BACKEND_URL must be an http(s) URL like http://worker:8000, got {self.backend_url!r}")
        # One canonical form, so paths can be appended as backend_url + "/health".
        object.__setattr__(self, "backend_url", self.backend_url.rstrip("/"))
        if not 0 <= self.port <= 65535:
            raise ValueError(f"JEV_FRONTEND_PORT must be 0..65535, got {self.port}")
        if not self.timeout_s > 0:
            raise ValueError(f"JEV_FRONTEND_TIMEOUT_S must be > 0, got {self.timeout_s}")
        if self.max_body_bytes < 1:
            raise ValueError(f"JEV_FRONTEND_MAX_BODY_BYTES must be >= 1, got {self.max_body_bytes}")
        if self.max_connections < 1:
            raise ValueError(f"JEV_FRONTEND_MAX_CONNECTIONS must be >= 1, got {self.max_connections}")

    @classmethod
    def from_env(cls) -> "Settings":
        return cls(
            host=env_str("JEV_FRONTEND_HOST", cls.host),
            port=env_int("JEV_FRONTEND_PORT", cls.port),
            backend_url=env_str("JEV_BACKEND_URL", cls.backend_url),
            timeout_s=env_float("JEV_FRONTEND_TIMEOUT_S", cls.timeout_s),
            max_body_bytes=env_bytes("JEV_FRONTEND_MAX_BODY_BYTES", cls.max_body_bytes),
            max_connections=env_int("JEV_FRONTEND_MAX_CONNECTIONS", cls.max_connections),
            api_keys=env_list("JEV_API_KEYS"),
        )
