"""Frontend configuration, read once from the environment: every name, default and doc line is in
`ENV` (the tables in README.md and docs/frontend.md are rendered from it).

The upstream frontend's names (`OMNI_JEV_BIND=IP:PORT`, `OMNI_JEV_BACKEND_URL`) are read as aliases;
started with them, the frontend listens on the upstream default 127.0.0.1:8080.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from yarl import URL

from jev_common.config import LOG_LEVEL, EnvTable, EnvVar

UPSTREAM_HOST = "127.0.0.1"

ENV = EnvTable("frontend", [
    EnvVar("JEV_FRONTEND_HOST", f"`0.0.0.0` (upstream names: `{UPSTREAM_HOST}`)", "listen address"),
    EnvVar("JEV_FRONTEND_PORT", "`8080`", "listen port"),
    EnvVar("OMNI_JEV_BIND", "—", "the upstream `IP:PORT` form of the two above (they win when set)"),
    EnvVar("JEV_BACKEND_URL", "`http://127.0.0.1:8000`", "the worker's base URL (http or https)",
           ("OMNI_JEV_BACKEND_URL",)),
    EnvVar("JEV_FRONTEND_TIMEOUT_S", "`30`", "deadline for a backend answer, in seconds (every backend call); a "
           "request's `deadline_s` lowers it for that request: `min(deadline_s, JEV_FRONTEND_TIMEOUT_S)`"),
    EnvVar("JEV_FRONTEND_MAX_BODY_BYTES", "`16M`", "largest accepted request body (`512K`, `16M`, `1G` or plain "
           "bytes); larger is 413"),
    EnvVar("JEV_FRONTEND_MAX_CONNECTIONS", "`64`", "size of the pooled connection set to the worker (requests "
           "beyond it wait for a free connection)"),
    EnvVar("JEV_API_KEYS", "(empty: auth off)", "comma-separated API keys accepted by the frontend"),
    LOG_LEVEL,
])
UPSTREAM_NAMES = ("OMNI_JEV_BIND", "OMNI_JEV_BACKEND_URL")


def parse_bind(text: str) -> tuple[str, int]:
    """'127.0.0.1:8080' or '[::1]:8080' -> (host, port)."""
    host, sep, port = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"OMNI_JEV_BIND must be IP:PORT like 127.0.0.1:8080, got {text!r}")
    return host, int(port)


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
        upstream = any(name in os.environ for name in UPSTREAM_NAMES)
        bind_host, bind_port = (parse_bind(os.environ["OMNI_JEV_BIND"]) if "OMNI_JEV_BIND" in os.environ
                                else (UPSTREAM_HOST if upstream else cls.host, cls.port))
        return cls(
            host=ENV["JEV_FRONTEND_HOST"].get(bind_host),
            port=ENV["JEV_FRONTEND_PORT"].get_int(bind_port),
            backend_url=ENV["JEV_BACKEND_URL"].get(cls.backend_url),
            timeout_s=ENV["JEV_FRONTEND_TIMEOUT_S"].get_float(cls.timeout_s),
            max_body_bytes=ENV["JEV_FRONTEND_MAX_BODY_BYTES"].get_bytes(cls.max_body_bytes),
            max_connections=ENV["JEV_FRONTEND_MAX_CONNECTIONS"].get_int(cls.max_connections),
            api_keys=ENV["JEV_API_KEYS"].get_list(),
        )
