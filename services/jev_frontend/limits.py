"""Rate limits as configured: requests and prompt tokens per minute, a default for every caller and limits of
their own for some API keys (`JEV_RATE_LIMITS`, `JEV_RATE_LIMITS_FILE`).

Entries are `NAME=RPM:TPM`, comma- or line-separated (`#` starts a comment in a file):

    default=60:20000                    every caller (each key, or each address when keys are off)
    sha256:9f86d081884c7d65=600:200000  the API key whose sha256 starts with these hex digits (12 to 64)
    sha256:5e884898da280471=120         requests only (TPM empty or 0: no token limit)

A key is named by a digest, never by itself, so the setting may sit in plain config while the keys stay in a
Secret: `printf %s "$KEY" | sha256sum | cut -c1-16`. A key with no entry of its own gets the default; with no
default, only the keys listed are limited.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field

DEFAULT = "default"
DIGEST = re.compile(r"sha256:([0-9a-f]{12,64})")


@dataclass(frozen=True)
class Limit:
    """Per minute; 0 means no limit on that dimension."""

    requests: int = 0
    tokens: int = 0

    def __bool__(self) -> bool:
        return bool(self.requests or self.tokens)

    def text(self) -> str:
        return f"{self.requests}:{self.tokens}"


@dataclass(frozen=True)
class RateLimits:
    default: Limit = Limit()
    by_digest: tuple[tuple[str, Limit], ...] = field(default=())  # (sha256 hex prefix, limit)

    def __bool__(self) -> bool:
        return bool(self.default) or any(limit for _digest, limit in self.by_digest)

    def merged(self, other: RateLimits) -> RateLimits:
        """These limits with `other`'s entries over them (a file read after the variable)."""
        digests = dict(self.by_digest) | dict(other.by_digest)
        return RateLimits(other.default or self.default, tuple(digests.items()))

    def for_key(self, key: str) -> Limit:
        """The limit of an API key: its own entry (the longest digest prefix that matches), else the default."""
        digest = hashlib.sha256(key.encode()).hexdigest()
        matching = [(len(prefix), limit) for prefix, limit in self.by_digest if digest.startswith(prefix)]
        return max(matching, key=lambda item: item[0])[1] if matching else self.default

    def unmatched(self, keys: tuple[str, ...]) -> list[str]:
        """Digest entries that name none of `keys` (a typo, or a key since removed): for a warning at start."""
        digests = [hashlib.sha256(key.encode()).hexdigest() for key in keys]
        return [prefix for prefix, _limit in self.by_digest if not any(d.startswith(prefix) for d in digests)]

    def text(self) -> str:
        entries = ([f"{DEFAULT}={self.default.text()}"] if self.default else []) + [
            f"sha256:{prefix}={limit.text()}" for prefix, limit in self.by_digest
        ]
        return ",".join(entries)


def parse_rate_limits(text: str, source: str = "JEV_RATE_LIMITS") -> RateLimits:
    """Entries `NAME=RPM:TPM` (module docstring). An error names the entry by its position, never by its text:
    an entry written wrong might hold a key."""
    default, by_digest = Limit(), {}
    lines = (line.split("#", 1)[0] for line in text.splitlines())
    entries = [entry.strip() for line in lines for entry in line.split(",") if entry.strip()]
    for number, entry in enumerate(entries, 1):
        name, sep, value = (part.strip() for part in entry.partition("="))
        where = f"{source}, entry {number}"
        if not sep:
            raise ValueError(f"{where}: expected NAME=RPM:TPM (NAME `default` or `sha256:<hex>`)")
        limit = _limit(value, where)
        if name.lower() == DEFAULT:
            default = limit
            continue
        match = DIGEST.fullmatch(name.lower())
        if not match:
            raise ValueError(
                f"{where}: the name must be `default` or `sha256:` and 12 to 64 hex digits of the key's sha256 "
                '(printf %s "$KEY" | sha256sum), never the key itself'
            )
        by_digest[match.group(1)] = limit
    return RateLimits(default, tuple(by_digest.items()))


def _limit(value: str, where: str) -> Limit:
    requests, _, tokens = (part.strip() for part in value.partition(":"))
    numbers = []
    for part, what in ((requests, "requests"), (tokens, "tokens")):
        if part and not part.isdigit():
            raise ValueError(f"{where}: {what} per minute must be a whole number >= 0 (empty or 0: no limit)")
        numbers.append(int(part or 0))
    return Limit(*numbers)
