"""Frontend configuration, read once from the environment: every name, default and doc line is in
`ENV` (the tables in README.md and docs/frontend.md are rendered from it).

One frontend serves many models and replicas: `JEV_BACKENDS` lists backends (`model=url`), workers
announced in the Redis index are added with `JEV_FRONTEND_DISCOVERY=1`, and `JEV_BACKEND_URL` alone is
the single-backend form (docs/frontend.md, "Routing").

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
    EnvVar("JEV_BACKEND_URL", "`http://127.0.0.1:8000`", "the worker's base URL (http or https): the "
           "single-backend form, whose health, models and metrics pass through",
           ("OMNI_JEV_BACKEND_URL",)),
    EnvVar("JEV_BACKENDS", "(empty)", "backends to route among, comma-separated `model=url` (or a bare `url`, "
           "whose model is read from its `/v1/models`); replicas repeat the model. When set, `JEV_BACKEND_URL` "
           "is added only if it is set too"),
    EnvVar("JEV_FRONTEND_DISCOVERY", "`0`", "`1`: also route to the workers announced in the index "
           "(`JEV_REDIS_URL`, keys `jev:worker:*`), added and dropped as they come and go"),
    EnvVar("JEV_DEFAULT_MODEL", "the first backend's model", "the model `jev-latest` and the single-question "
           "form go to"),
    EnvVar("JEV_REDIS_URL", "`redis://127.0.0.1:6379/0`", "the cache index, read for warm prefixes (route "
           "keys), images in L2 and discovery; `none` = route by this frontend's own memory and load only. "
           "Not used with a single backend"),
    EnvVar("JEV_ROUTING", "`prefix`", "`prefix`: a request goes to the replica where its state is warm, else "
           "power-of-two-choices by load; `round_robin`: replicas in turn (for comparison)"),
    EnvVar("JEV_ROUTING_MAX_IMBALANCE", "`8`", "a warm replica is skipped for the least-loaded one when it has "
           "more than this many requests in flight or queued beyond it"),
    EnvVar("JEV_FRONTEND_HEALTH_INTERVAL_S", "`2`", "how often every backend's `/health` is polled (and "
           "discovery re-read); a replica that fails it is taken out until it answers 200 again"),
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


ROUTING_MODES = ("prefix", "round_robin")


def _check_url(url: str, name: str) -> str:
    parsed = URL(url)
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ValueError(f"{name} must be an http(s) URL like http://worker:8000, got {url!r}")
    return url.rstrip("/")  # one canonical form, so paths can be appended as url + "/health"


def parse_backends(text: str) -> tuple[tuple[str, str], ...]:
    """'m1=http://a:8000, http://b:8000' -> (("m1", "http://a:8000"), ("", "http://b:8000"))."""
    out = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        model, sep, url = item.partition("=")
        if not sep:
            model, url = "", item
        out.append((model.strip(), _check_url(url.strip(), "JEV_BACKENDS entry")))
    return tuple(out)


@dataclass(frozen=True)
class Settings:
    host: str = "0.0.0.0"
    port: int = 8080
    backend_url: str = "http://127.0.0.1:8000"
    timeout_s: float = 30.0
    max_body_bytes: int = 16 << 20
    max_connections: int = 64
    api_keys: tuple[str, ...] = ()  # empty: auth off
    backends: tuple[tuple[str, str], ...] = ()  # (model or "", url); with backend_url="" it is the whole list
    discovery: bool = False
    default_model: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    routing: str = "prefix"
    max_imbalance: int = 8
    health_interval_s: float = 2.0

    def __post_init__(self) -> None:
        if self.backend_url:
            object.__setattr__(self, "backend_url", _check_url(self.backend_url, "JEV_BACKEND_URL"))
        object.__setattr__(self, "backends", tuple((m, _check_url(u, "JEV_BACKENDS entry")) for m, u in self.backends))
        if not self.backend_url and not self.backends and not self.discovery:
            raise ValueError("no backend: set JEV_BACKEND_URL, JEV_BACKENDS or JEV_FRONTEND_DISCOVERY=1")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"JEV_ROUTING must be one of {', '.join(ROUTING_MODES)}, got {self.routing!r}")
        if self.max_imbalance < 0:
            raise ValueError(f"JEV_ROUTING_MAX_IMBALANCE must be >= 0, got {self.max_imbalance}")
        if not self.health_interval_s > 0:
            raise ValueError(f"JEV_FRONTEND_HEALTH_INTERVAL_S must be > 0, got {self.health_interval_s}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"JEV_FRONTEND_PORT must be 0..65535, got {self.port}")
        if not self.timeout_s > 0:
            raise ValueError(f"JEV_FRONTEND_TIMEOUT_S must be > 0, got {self.timeout_s}")
        if self.max_body_bytes < 1:
            raise ValueError(f"JEV_FRONTEND_MAX_BODY_BYTES must be >= 1, got {self.max_body_bytes}")
        if self.max_connections < 1:
            raise ValueError(f"JEV_FRONTEND_MAX_CONNECTIONS must be >= 1, got {self.max_connections}")

    def static_backends(self) -> tuple[tuple[str, str], ...]:
        """The configured backends, JEV_BACKEND_URL (model learned) first when it is in use, no URL twice."""
        by_url: dict[str, str] = {}
        for model, url in ((("", self.backend_url),) if self.backend_url else ()) + self.backends:
            by_url[url] = by_url.get(url) or model  # a URL listed twice is one backend; a named model wins
        return tuple((model, url) for url, model in by_url.items())

    @property
    def single_backend(self) -> bool:
        """JEV_BACKEND_URL alone: health, models and metrics pass through from that one worker."""
        return bool(self.backend_url) and not self.backends and not self.discovery

    @property
    def index_url(self) -> str | None:
        return None if self.redis_url.strip().lower() in ("", "none", "off") else self.redis_url

    @classmethod
    def from_env(cls) -> "Settings":
        upstream = any(name in os.environ for name in UPSTREAM_NAMES)
        bind_host, bind_port = (parse_bind(os.environ["OMNI_JEV_BIND"]) if "OMNI_JEV_BIND" in os.environ
                                else (UPSTREAM_HOST if upstream else cls.host, cls.port))
        backends = parse_backends(ENV["JEV_BACKENDS"].get(""))
        discovery = ENV["JEV_FRONTEND_DISCOVERY"].get_bool(False)
        return cls(
            host=ENV["JEV_FRONTEND_HOST"].get(bind_host),
            port=ENV["JEV_FRONTEND_PORT"].get_int(bind_port),
            backend_url=(ENV["JEV_BACKEND_URL"].get(cls.backend_url)
                         if ENV["JEV_BACKEND_URL"].is_set() or not (backends or discovery) else ""),
            timeout_s=ENV["JEV_FRONTEND_TIMEOUT_S"].get_float(cls.timeout_s),
            max_body_bytes=ENV["JEV_FRONTEND_MAX_BODY_BYTES"].get_bytes(cls.max_body_bytes),
            max_connections=ENV["JEV_FRONTEND_MAX_CONNECTIONS"].get_int(cls.max_connections),
            api_keys=ENV["JEV_API_KEYS"].get_list(),
            backends=backends,
            discovery=discovery,
            default_model=ENV["JEV_DEFAULT_MODEL"].get(""),
            redis_url=ENV["JEV_REDIS_URL"].get(cls.redis_url),
            routing=ENV["JEV_ROUTING"].get(cls.routing).strip().lower(),
            max_imbalance=ENV["JEV_ROUTING_MAX_IMBALANCE"].get_int(cls.max_imbalance),
            health_interval_s=ENV["JEV_FRONTEND_HEALTH_INTERVAL_S"].get_float(cls.health_interval_s),
        )
