"""The internal credential: what the frontend (the one public edge) sends on every backend call, and what a
worker or preencoder asks of a caller before it serves it.

Callers' API keys are checked at the frontend only, which does not forward them. A backend serves `/v1/` routes
to a caller that carries one of its internal tokens (`x-jev-internal-token: <token>`, or `Authorization: Bearer
<token>` for an operator or a test); only such a caller may set the headers the frontend sets (`x-jev-client`).
Two tokens may be valid at once, so a token rotates without downtime: the frontend sends the first it lists.

With no token configured a backend serves any caller, and the network policy is the boundary.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .config import list_var, optional_var
from .errors import ApiKeyInvalid, ApiKeyMissing

log = logging.getLogger("jev.internal_auth")

INTERNAL_TOKEN_HEADER = "x-jev-internal-token"
TRUSTED = web.RequestKey("trusted", bool)  # the caller carries the internal credential (or none is configured)

INTERNAL_TOKENS = list_var(
    "JEV_INTERNAL_TOKENS",
    (),
    "internal credential between the frontend and the workers/preencoder, "
    "comma-separated: a backend accepts any listed token, the frontend sends the first (list the new one on the "
    "backends, then first on the frontend, to rotate without downtime). Never logged",
    note="from the file, else off",
)
INTERNAL_TOKEN_FILE = optional_var(
    "JEV_INTERNAL_TOKEN_FILE",
    "a file holding internal tokens (comma- or line-separated), read at start after "
    "`JEV_INTERNAL_TOKENS`; when it does not exist, a random token is written there (so services sharing the folder "
    "share it: compose and `make up` generate theirs so)",
)


def load_internal_tokens(listed: tuple[str, ...], token_file: str | None) -> tuple[str, ...]:
    """The tokens this service accepts, in order: those listed, then the file's (created with a new random token
    when it does not exist yet; the first service to start writes it, the others read the same)."""
    tokens = list(listed)
    if token_file:
        path = Path(token_file)
        if not path.exists():
            _create(path)
        text = path.read_text(encoding="utf-8")
        tokens += [t.strip() for line in text.splitlines() for t in line.split(",") if t.strip()]
    return tuple(dict.fromkeys(tokens))


def _create(path: Path) -> None:
    """Write a new token to `path` atomically; if another service got there first, keep its token."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(secrets.token_hex(32) + "\n")
    try:
        os.link(staging, path)  # fails if the file exists: the first writer wins
        log.info("generated an internal token in %s", path)
    except FileExistsError:
        pass
    finally:
        staging.unlink()


def _given_token(request: web.Request) -> str | None:
    token = request.headers.get(INTERNAL_TOKEN_HEADER)
    if token is not None:
        return token.strip()
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    return given.strip() if scheme.lower() == "bearer" and given.strip() else None


def matches(given: str, accepted: tuple[str, ...]) -> bool:
    """Constant-time membership (every candidate compared, so the time says nothing of which one matched)."""
    encoded = given.encode()
    found = False
    for candidate in accepted:
        found |= hmac.compare_digest(encoded, candidate.encode())
    return found


def backend_guard(
    tokens: tuple[str, ...],
    api_keys: tuple[str, ...] = (),
    protected_prefix: str = "/v1/",
    internal_prefixes: tuple[str, ...] = (),
) -> Middleware:
    """A backend's middleware: on `protected_prefix` routes, the internal credential when tokens are configured.
    `api_keys` (the worker's own `JEV_API_KEYS`, for a worker serving callers without a frontend) also admit a
    caller; where tokens are configured too, such a caller is untrusted: its `x-jev-client` is ignored and
    `internal_prefixes` (cache control) stay closed to it. With no token configured every caller is trusted (the
    network policy is the boundary).
    Missing credential 403, wrong 401."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[TRUSTED] = not tokens
        if request.path.startswith(protected_prefix) and (tokens or api_keys):
            given = _given_token(request)
            if given is None:
                raise ApiKeyMissing(
                    "a credential is required: this service is reached through the frontend "
                    f"(it sends {INTERNAL_TOKEN_HEADER}), or send Authorization: Bearer <key>"
                )
            if tokens and matches(given, tokens):
                request[TRUSTED] = True
            elif not (api_keys and matches(given, api_keys)):
                raise ApiKeyInvalid("the credential is not valid")
            elif tokens and request.path.startswith(internal_prefixes):
                raise ApiKeyMissing(f"{request.path} takes the internal credential, not an API key")
        return await handler(request)

    return middleware


def backend_headers(tokens: tuple[str, ...]) -> dict[str, str]:
    """What the frontend adds to every backend call: its first token, when it has one."""
    return {INTERNAL_TOKEN_HEADER: tokens[0]} if tokens else {}
