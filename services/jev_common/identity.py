"""Who a caller is, for fairness, rate limits and metrics, without its API key: `key:` and an HMAC of the key, keyed
by a per-deployment secret, or `addr:` and its address when it sent no key.

The secret is derived from the internal token (jev_common/internal_auth.py), which every frontend and backend of
one deployment shares: so every frontend names a key alike (one rate-limit bucket, one fairness key), a worker
reached directly names it as the frontend would, and an identity seen in a header, a Redis key or a metric says
nothing about the key itself, nor matches the same key's identity in another deployment. With no token configured
the secret is a fixed label: identities are then stable, but computable by anyone who holds the key.
"""

from __future__ import annotations

import hashlib
import hmac

from aiohttp import web

NO_TOKEN_LABEL = b"jev caller identity: no internal token configured"
IDENTITY_HEX = 16  # 64 bits: distinct for any realistic number of keys, short in headers and Redis keys


class CallerIdentity:
    """Names callers; made once per service from its internal tokens (`for_tokens`). `by_key=False` (a frontend
    with keys off) names every caller by its address: a key nobody checks would let a caller pick its own name."""

    def __init__(self, secret: bytes, *, by_key: bool = True) -> None:
        self._secret = secret
        self.by_key = by_key

    @classmethod
    def for_tokens(cls, tokens: tuple[str, ...], *, by_key: bool = True) -> CallerIdentity:
        """Keyed by the first internal token (the one a frontend sends), domain-separated so the secret is not the
        token itself; with none, by a fixed label."""
        if not tokens:
            return cls(NO_TOKEN_LABEL, by_key=by_key)
        return cls(hmac.new(tokens[0].encode(), b"jev caller identity", hashlib.sha256).digest(), by_key=by_key)

    @property
    def namespace(self) -> str:
        """The deployment's name where callers of several deployments could meet (one Redis): its secret's digest."""
        return hmac.new(self._secret, b"jev deployment namespace", hashlib.sha256).hexdigest()[:12]

    def of_key(self, key: str) -> str:
        return "key:" + hmac.new(self._secret, key.encode(), hashlib.sha256).hexdigest()[:IDENTITY_HEX]

    def of(self, request: web.Request) -> str:
        """The caller's API key (`Authorization: Bearer`), named; else its peer address."""
        key = bearer_key(request) if self.by_key else None
        return self.of_key(key) if key else "addr:" + (request.remote or "unknown")


def bearer_key(request: web.Request) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None."""
    scheme, _, key = request.headers.get("Authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None
