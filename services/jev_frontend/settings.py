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
from pathlib import Path

from yarl import URL

from jev_common.config import (
    LOG_LEVEL,
    EnvTable,
    bool_var,
    bytes_var,
    custom_var,
    float_var,
    int_var,
    list_var,
    optional_var,
    str_var,
)
from jev_common.internal_auth import INTERNAL_TOKEN_FILE, INTERNAL_TOKENS, load_internal_tokens

from .limits import RateLimits, parse_rate_limits


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


ENV = EnvTable(
    "frontend",
    [
        str_var("JEV_FRONTEND_HOST", "0.0.0.0", "listen address", upstream="127.0.0.1"),
        int_var("JEV_FRONTEND_PORT", 8080, "listen port"),
        custom_var(
            "OMNI_JEV_BIND",
            parse_bind,
            None,
            "the upstream `IP:PORT` form of the two above (they win when set)",
            shown="—",
        ),
        str_var(
            "JEV_BACKEND_URL",
            "http://127.0.0.1:8000",
            "the worker's base URL (http or https): the "
            "single-backend form, whose health, models and metrics pass through",
            ("OMNI_JEV_BACKEND_URL",),
        ),
        custom_var(
            "JEV_BACKENDS",
            parse_backends,
            (),
            "backends to route among, comma-separated `model=url` (or a "
            "bare `url`, whose model is read from its `/v1/models`); replicas repeat the model. When set, "
            "`JEV_BACKEND_URL` is added only if it is set too",
        ),
        str_var(
            "JEV_PREENCODER_URL",
            "",
            "the preencoder's base URL (http or https): the frontend answers `POST /v1/preencode` by passing the "
            "body on to it, streamed (callers' keys checked here, the internal token sent there); empty: the route "
            "answers 404 (the stack serves no vision-language recipe)",
            note="no preencoder",
        ),
        bool_var(
            "JEV_FRONTEND_DISCOVERY",
            False,
            "`1`: also route to the workers announced in the index "
            "(`JEV_REDIS_URL`, keys `jev:worker:*`), added and dropped as they come and go",
        ),
        str_var(
            "JEV_DEFAULT_MODEL",
            "",
            "the model `jev-latest` and the single-question form go to",
            shown="the first backend's model",
        ),
        str_var(
            "JEV_REDIS_URL",
            "redis://127.0.0.1:6379/0",
            "the cache index, read for warm prefixes (route "
            "keys), images in L2 and discovery (not with a single backend), and the rate limits' buckets, shared by "
            "every frontend on it; `none` = route by this frontend's own memory and load only, and keep the rate "
            "limits per frontend",
        ),
        str_var(
            "JEV_ROUTING",
            "prefix",
            "`prefix`: a request goes to the replica where its state is warm, else "
            "power-of-two-choices by load; `round_robin`: replicas in turn (for comparison)",
        ),
        int_var(
            "JEV_ROUTING_MAX_IMBALANCE",
            8,
            "a warm replica is skipped for the least-loaded one when it has "
            "more than this many requests in flight or queued beyond it",
        ),
        float_var(
            "JEV_FRONTEND_HEALTH_INTERVAL_S",
            2.0,
            "how often every backend's `/health` is polled (and "
            "discovery re-read); a replica that fails it is taken out until it answers 200 again",
        ),
        int_var(
            "JEV_FRONTEND_HEALTH_MISSES",
            3,
            "health probes in a row a backend may leave unanswered within the interval before it is taken out as "
            "unreachable (a busy worker answers late; a cut-off one never does); a refused connection or an answer "
            "other than 200 takes it out at once",
        ),
        float_var(
            "JEV_FRONTEND_TIMEOUT_S",
            305.0,
            "deadline for a backend answer, in seconds (every backend call): "
            "past the workers' own default deadline (`JEV_DEADLINE_S`, 300), so that their 504 arrives first. A "
            "request's `x-jev-deadline-s` header replaces it (plus 0.25 s); the single-question form's "
            "`deadline_s` lowers it: `min(deadline_s, JEV_FRONTEND_TIMEOUT_S)`",
        ),
        bytes_var(
            "JEV_FRONTEND_MAX_BODY_BYTES",
            16 << 20,
            "largest accepted request body (`512K`, `16M`, `1G` or plain bytes); larger is 413",
        ),
        bytes_var(
            "JEV_FRONTEND_MAX_PREENCODE_BYTES",
            256 << 20,
            "largest accepted `POST /v1/preencode` body (its images inline), decompressed; streamed to the "
            "preencoder, never held whole; larger is 413",
        ),
        int_var(
            "JEV_FRONTEND_MAX_CONNECTIONS",
            64,
            "size of the pooled connection set to the worker (requests beyond it wait for a free connection)",
        ),
        list_var("JEV_API_KEYS", (), "comma-separated API keys accepted by the frontend", note="auth off"),
        INTERNAL_TOKENS,
        INTERNAL_TOKEN_FILE,
        custom_var(
            "JEV_RATE_LIMITS",
            parse_rate_limits,
            RateLimits(),
            "requests and prompt tokens per minute, comma-separated `NAME=RPM:TPM` entries: `default=60:20000` for "
            "every caller (each API key, or each address with keys off), `sha256:<hex>=600:200000` for the key whose "
            'sha256 starts with those 12-64 hex digits (`printf %s "$KEY" | sha256sum`); an empty or 0 RPM/TPM is '
            "no limit on it. Kept in Redis (`JEV_REDIS_URL`), so every frontend enforces one limit; 429 "
            "`rate_limit_error` past it",
            shown="(empty: no limits)",
        ),
        optional_var(
            "JEV_RATE_LIMITS_FILE",
            "a file of `JEV_RATE_LIMITS` entries, one or more a line (`#` comments), read at start, its entries over "
            "the variable's (mount it from a ConfigMap or Secret)",
        ),
        LOG_LEVEL,
    ],
)
UPSTREAM_NAMES = ("OMNI_JEV_BIND", "OMNI_JEV_BACKEND_URL")


@dataclass(frozen=True)
class Settings:
    host: str = ENV["JEV_FRONTEND_HOST"].field()
    port: int = ENV["JEV_FRONTEND_PORT"].field()
    backend_url: str = ENV["JEV_BACKEND_URL"].field()
    timeout_s: float = ENV["JEV_FRONTEND_TIMEOUT_S"].field()
    max_body_bytes: int = ENV["JEV_FRONTEND_MAX_BODY_BYTES"].field()
    max_connections: int = ENV["JEV_FRONTEND_MAX_CONNECTIONS"].field()
    api_keys: tuple[str, ...] = ENV["JEV_API_KEYS"].field(secret=True)  # empty: auth off
    internal_tokens: tuple[str, ...] = ENV["JEV_INTERNAL_TOKENS"].field(secret=True)  # + the file's; the first is sent
    # (model or "", url); with backend_url="" it is the whole list
    backends: tuple[tuple[str, str], ...] = ENV["JEV_BACKENDS"].field()
    discovery: bool = ENV["JEV_FRONTEND_DISCOVERY"].field()
    default_model: str = ENV["JEV_DEFAULT_MODEL"].field()
    redis_url: str = ENV["JEV_REDIS_URL"].field()
    routing: str = ENV["JEV_ROUTING"].field()
    max_imbalance: int = ENV["JEV_ROUTING_MAX_IMBALANCE"].field()
    health_interval_s: float = ENV["JEV_FRONTEND_HEALTH_INTERVAL_S"].field()
    health_misses: int = ENV["JEV_FRONTEND_HEALTH_MISSES"].field()
    max_preencode_bytes: int = ENV["JEV_FRONTEND_MAX_PREENCODE_BYTES"].field()
    preencoder_url: str = ENV["JEV_PREENCODER_URL"].field()  # "": no preencoder behind this frontend
    rate_limits: RateLimits = ENV["JEV_RATE_LIMITS"].field()  # + the file's; empty: no limits

    def __post_init__(self) -> None:
        if self.backend_url:
            object.__setattr__(self, "backend_url", _check_url(self.backend_url, "JEV_BACKEND_URL"))
        if self.preencoder_url:
            object.__setattr__(self, "preencoder_url", _check_url(self.preencoder_url, "JEV_PREENCODER_URL"))
        object.__setattr__(self, "backends", tuple((m, _check_url(u, "JEV_BACKENDS entry")) for m, u in self.backends))
        if not self.backend_url and not self.backends and not self.discovery:
            raise ValueError("no backend: set JEV_BACKEND_URL, JEV_BACKENDS or JEV_FRONTEND_DISCOVERY=1")
        if self.routing not in ROUTING_MODES:
            raise ValueError(f"JEV_ROUTING must be one of {', '.join(ROUTING_MODES)}, got {self.routing!r}")
        if self.max_imbalance < 0:
            raise ValueError(f"JEV_ROUTING_MAX_IMBALANCE must be >= 0, got {self.max_imbalance}")
        if not self.health_interval_s > 0:
            raise ValueError(f"JEV_FRONTEND_HEALTH_INTERVAL_S must be > 0, got {self.health_interval_s}")
        if self.health_misses < 1:
            raise ValueError(f"JEV_FRONTEND_HEALTH_MISSES must be >= 1, got {self.health_misses}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"JEV_FRONTEND_PORT must be 0..65535, got {self.port}")
        if not self.timeout_s > 0:
            raise ValueError(f"JEV_FRONTEND_TIMEOUT_S must be > 0, got {self.timeout_s}")
        if self.max_body_bytes < 1:
            raise ValueError(f"JEV_FRONTEND_MAX_BODY_BYTES must be >= 1, got {self.max_body_bytes}")
        if self.max_preencode_bytes < 1:
            raise ValueError(f"JEV_FRONTEND_MAX_PREENCODE_BYTES must be >= 1, got {self.max_preencode_bytes}")
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
    def from_env(cls) -> Settings:
        upstream = any(name in os.environ for name in UPSTREAM_NAMES)
        bind_host, bind_port = ENV["OMNI_JEV_BIND"].get() or (
            ENV["JEV_FRONTEND_HOST"].default_for(upstream),
            ENV["JEV_FRONTEND_PORT"].default,
        )
        backends = ENV["JEV_BACKENDS"].get()
        discovery = ENV["JEV_FRONTEND_DISCOVERY"].get()
        return cls(
            host=ENV["JEV_FRONTEND_HOST"].get(bind_host),
            port=ENV["JEV_FRONTEND_PORT"].get(bind_port),
            backend_url=(
                ENV["JEV_BACKEND_URL"].get() if ENV["JEV_BACKEND_URL"].is_set() or not (backends or discovery) else ""
            ),
            timeout_s=ENV["JEV_FRONTEND_TIMEOUT_S"].get(),
            max_body_bytes=ENV["JEV_FRONTEND_MAX_BODY_BYTES"].get(),
            max_preencode_bytes=ENV["JEV_FRONTEND_MAX_PREENCODE_BYTES"].get(),
            preencoder_url=ENV["JEV_PREENCODER_URL"].get(),
            max_connections=ENV["JEV_FRONTEND_MAX_CONNECTIONS"].get(),
            api_keys=ENV["JEV_API_KEYS"].get(),
            internal_tokens=load_internal_tokens(INTERNAL_TOKENS.get(), INTERNAL_TOKEN_FILE.get()),
            backends=backends,
            discovery=discovery,
            default_model=ENV["JEV_DEFAULT_MODEL"].get(),
            redis_url=ENV["JEV_REDIS_URL"].get(),
            routing=ENV["JEV_ROUTING"].get().strip().lower(),
            max_imbalance=ENV["JEV_ROUTING_MAX_IMBALANCE"].get(),
            health_interval_s=ENV["JEV_FRONTEND_HEALTH_INTERVAL_S"].get(),
            health_misses=ENV["JEV_FRONTEND_HEALTH_MISSES"].get(),
            rate_limits=_rate_limits(ENV["JEV_RATE_LIMITS"].get(), ENV["JEV_RATE_LIMITS_FILE"].get()),
        )


def _rate_limits(listed: RateLimits, path: str | None) -> RateLimits:
    if not path:
        return listed
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"JEV_RATE_LIMITS_FILE {path}: {exc.strerror}") from None
    return listed.merged(parse_rate_limits(text, f"JEV_RATE_LIMITS_FILE {path}"))
