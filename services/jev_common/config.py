"""Typed configuration from environment variables.

Each service's settings module declares its variables once, as an `EnvTable` of `EnvVar`s (name,
upstream aliases, default as documented, meaning); the README tables are rendered from those tables
(`python -m jev_common.config --check` / `--write`, tests/unit/test_config_docs.py), so a name, a
default or a doc line lives in one place.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str, *aliases: str) -> str:
    for key in (name, *aliases):
        if key in os.environ:
            return os.environ[key]
    return default


def _source(name: str, aliases: tuple[str, ...]) -> str:
    """The name a value came from (for error messages): the first of name/aliases that is set."""
    return next((key for key in (name, *aliases) if key in os.environ), name)


def env_list(name: str, *aliases: str) -> tuple[str, ...]:
    """A comma-separated list; blanks dropped."""
    return tuple(item.strip() for item in env_str(name, "", *aliases).split(",") if item.strip())


def env_int(name: str, default: int, *aliases: str) -> int:
    raw = env_str(name, str(default), *aliases).strip()
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{_source(name, aliases)} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float, *aliases: str) -> float:
    raw = env_str(name, str(default), *aliases).strip()
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{_source(name, aliases)} must be a number, got {raw!r}") from None


def env_bool(name: str, default: bool, *aliases: str) -> bool:
    raw = env_str(name, "1" if default else "0", *aliases).strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{_source(name, aliases)} must be 0/1/true/false, got {raw!r}")


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
        raise ValueError(f"{_source(name, aliases)} must be a byte count like 512M, got {raw!r}") from None


@dataclass(frozen=True)
class EnvVar:
    """One environment variable: its name, the upstream names read as aliases, the default as shown
    in the docs (markdown) and what it means."""
    name: str
    default: str
    doc: str
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def is_set(self) -> bool:
        return any(key in os.environ for key in self.names)

    def get(self, default: str) -> str:
        return env_str(self.name, default, *self.aliases)

    def get_int(self, default: int) -> int:
        return env_int(self.name, default, *self.aliases)

    def get_float(self, default: float) -> float:
        return env_float(self.name, default, *self.aliases)

    def get_bool(self, default: bool) -> bool:
        return env_bool(self.name, default, *self.aliases)

    def get_bytes(self, default: int) -> int:
        return env_bytes(self.name, default, *self.aliases)

    def get_list(self) -> tuple[str, ...]:
        return env_list(self.name, *self.aliases)

    def get_optional(self) -> str | None:
        """The value, or None when unset or empty."""
        return env_str(self.name, "", *self.aliases) or None

    def row(self) -> str:
        name = f"`{self.name}`" + (f" (alias {', '.join(f'`{a}`' for a in self.aliases)})" if self.aliases else "")
        return f"| {name} | {self.default} | {self.doc} |"


class EnvTable:
    """A service's variables, in documentation order; `table[name]` is the EnvVar."""

    def __init__(self, service: str, variables: list[EnvVar]):
        self.service = service
        self.variables = list(variables)
        self._by_name = {v.name: v for v in self.variables}
        if len(self._by_name) != len(self.variables):
            raise ValueError(f"{service}: a variable is declared twice")

    def __getitem__(self, name: str) -> EnvVar:
        return self._by_name[name]

    def __iter__(self):
        return iter(self.variables)

    def names(self) -> set[str]:
        return {n for v in self.variables for n in v.names}

    def markdown(self) -> str:
        return "\n".join(["| env | default | meaning |", "|---|---|---|", *(v.row() for v in self.variables)])


# read by every service (jev_common.logs, jev_common.recipe)
LOG_LEVEL = EnvVar("JEV_LOG_LEVEL", "`INFO`", "log level; every log line is one JSON object on stderr")
RECIPES_DIR = EnvVar("JEV_RECIPES_DIR", "`recipes/` of this checkout", "where recipe names are looked up")
