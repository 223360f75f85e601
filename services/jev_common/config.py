"""Typed configuration from environment variables. Each service documents its table in README.md."""
from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str, *aliases: str) -> str:
    for key in (name, *aliases):
        if key in os.environ:
            return os.environ[key]
    return default


def env_list(name: str, *aliases: str) -> tuple[str, ...]:
    """A comma-separated list; blanks dropped."""
    return tuple(item.strip() for item in env_str(name, "", *aliases).split(",") if item.strip())


def env_int(name: str, default: int, *aliases: str) -> int:
    raw = env_str(name, str(default), *aliases).strip()
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float, *aliases: str) -> float:
    raw = env_str(name, str(default), *aliases).strip()
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


def env_bool(name: str, default: bool, *aliases: str) -> bool:
    raw = env_str(name, "1" if default else "0", *aliases).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{name} must be 0/1/true/false, got {raw!r}")


def parse_bytes(raw: str) -> int:
    """'512M', '2G', '1048576' -> bytes."""
    text = raw.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    return int(float(number) * scale)


def env_bytes(name: str, default: int, *aliases: str) -> int:
    raw = env_str(name, str(default), *aliases)
    try:
        return parse_bytes(raw)
    except ValueError:
        raise ValueError(f"{name} must be a byte count like 512M, got {raw!r}") from None
