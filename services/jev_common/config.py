"""Typed configuration from environment variables.

Each service's settings module declares its variables once, as an `EnvTable` of `EnvVar`s: name,
upstream aliases, the typed default value and its parser (`int_var`, `float_var`, `bool_var`,
`bytes_var`, `str_var`, `list_var`, `optional_var`, `custom_var`), and what it means. From that one
declaration

- the settings dataclass takes its field defaults (`max_queue: int = ENV["JEV_MAX_QUEUE"].field()`),
- `from_env` reads each variable by its type (`ENV["JEV_MAX_QUEUE"].get()`, no default restated), and
- the docs' default column is rendered (`python -m tools.env_tables --check` / `--write`,
  tests/unit/test_config_docs.py), so a name, a default or a doc line lives in one place.

A default that is not a constant (the recipe's, `hostname:port`) declares how the docs show it
(`shown=`) and is passed to `get()` by `from_env`; one taken from the recipe schema's default is
shown as "recipe (`value`)" (`from_recipe=True`); the upstream default that applies when a service is
started with upstream names is `upstream=` ("(upstream names: `value`)").
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


COMPUTED: Any = _Marker("COMPUTED")  # the default is computed by from_env (declare `shown=` for the docs)
_SAME: Any = _Marker("SAME")  # no separate upstream default
_UNSET: Any = _Marker("UNSET")


def parse_bytes(raw: str) -> int:
    """'512M', '2G', '1048576' -> bytes."""
    text = raw.strip().upper().removesuffix("B").removesuffix("I")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if text[-1:] in "KMG" else text
    return int(float(number) * scale)


def format_bytes(value: int) -> str:
    """16 << 20 -> '16M': the largest of G, M, K that divides it, else plain bytes."""
    for suffix, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if value and value % scale == 0:
            return f"{value // scale}{suffix}"
    return str(value)


# --- parsers: (raw text, the name it was read from) -> value; ValueError names that variable --------


def _parse_str(raw: str, source: str) -> str:
    return raw


def _parse_int(raw: str, source: str) -> int:
    raw = raw.strip()
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{source} must be an integer, got {raw!r}") from None


def _parse_float(raw: str, source: str) -> float:
    raw = raw.strip()
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{source} must be a number, got {raw!r}") from None


def _parse_bool(raw: str, source: str) -> bool:
    raw = raw.strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise ValueError(f"{source} must be 0/1/true/false, got {raw!r}")


def _parse_bytes(raw: str, source: str) -> int:
    try:
        return parse_bytes(raw)
    except ValueError:
        raise ValueError(f"{source} must be a byte count like 512M, got {raw!r}") from None


def _parse_list(raw: str, source: str) -> tuple[str, ...]:
    """A comma-separated list; blanks dropped."""
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def _parse_optional(raw: str, source: str) -> str | None:
    """The value, or None when empty."""
    return raw or None


# --- how a value is written in the environment (and so in the docs) ----------------------------------


def _text(value: object) -> str | None:
    """The env text that sets `value`; None for 'nothing' (None, '', ())."""
    if value is None or value == "" or value == ():
        return None
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return repr(value).removesuffix(".0")
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


@dataclass(frozen=True)
class Kind(Generic[T]):
    """A variable's type: how its text is parsed and how a value is written back."""

    name: str
    parse: Callable[[str, str], T]
    text: Callable[[Any], str | None] = _text


STR: Kind[str] = Kind("str", _parse_str)
INT: Kind[int] = Kind("int", _parse_int)
FLOAT: Kind[float] = Kind("float", _parse_float)
BOOL: Kind[bool] = Kind("bool", _parse_bool)
BYTES: Kind[int] = Kind("bytes", _parse_bytes, format_bytes)
LIST: Kind[tuple[str, ...]] = Kind("list", _parse_list)
OPTIONAL: Kind[str | None] = Kind("optional", _parse_optional)


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    """One environment variable: its name, its type, its default value, what it means, the upstream
    names read as aliases, and how the docs show the default where it is not a constant."""

    name: str
    kind: Kind[T]
    default: T
    doc: str
    aliases: tuple[str, ...] = ()
    upstream: T = _SAME  # the default when the service was started with upstream names
    note: str = ""  # said after the default in the docs: "`0` (torch default)"
    shown: str = ""  # the docs' default column, for a default that is not a constant
    from_recipe: bool = False  # the recipe's value; `default` is the recipe schema's default

    def __post_init__(self) -> None:
        if self.default is COMPUTED and not self.shown:
            raise ValueError(f"{self.name}: a computed default needs `shown` for the docs")

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    def is_set(self) -> bool:
        return any(key in os.environ for key in self.names)

    @property
    def has_upstream(self) -> bool:
        """Whether the default differs when the service was started with upstream names."""
        return self.upstream is not _SAME

    def default_for(self, upstream: bool = False) -> T:
        return self.upstream if upstream and self.has_upstream else self.default

    def get(self, default: T = _UNSET, *, upstream: bool = False) -> T:
        """The value of the first of name/aliases that is set, parsed by the declared type; else the
        default (`default` when given: the recipe's value or one computed by from_env; the upstream
        default when `upstream`). A bad value is a ValueError naming the variable that was set."""
        for key in self.names:
            if key in os.environ:
                return self.kind.parse(os.environ[key], key)
        if default is _UNSET:
            default = self.default_for(upstream)
        if default is COMPUTED:
            raise TypeError(f"{self.name}: the default is computed; pass it to get()")
        return default

    def field(self, *, secret: bool = False) -> Any:
        """A dataclass field whose default is this variable's (the field remembers the variable). A `secret` one
        (keys, tokens) is left out of the settings' repr, so that no log line or traceback can print it."""
        if self.default is COMPUTED:
            raise TypeError(f"{self.name}: the default is computed; it cannot be a field default")
        return dataclasses.field(default=self.default, metadata={"env": self.name}, repr=not secret)

    def text(self) -> str | None:
        """The default as env text ('64', '16M', '1'); None where it is not a constant or is empty."""
        if self.shown or self.from_recipe or self.default is COMPUTED:
            return None
        return self.kind.text(self.default)

    def shown_default(self) -> str:
        """The docs' default column (markdown), rendered from the value unless declared."""
        if self.shown:
            return self.shown
        value = _markdown(self.kind.text(self.default), self.default)
        if self.from_recipe:
            value = f"recipe ({value})"
        if self.has_upstream:
            value += f" (upstream names: {_markdown(self.kind.text(self.upstream), self.upstream)})"
        if self.note:
            value = f"{value[:-1]}: {self.note})" if value.startswith("(") else f"{value} ({self.note})"
        return value

    def row(self) -> str:
        name = f"`{self.name}`" + (f" (alias {', '.join(f'`{a}`' for a in self.aliases)})" if self.aliases else "")
        return f"| {name} | {self.shown_default()} | {self.doc} |"


def _markdown(text: str | None, value: object) -> str:
    if text is not None:
        return f"`{text}`"
    return "(none)" if value is None else "(empty)"


def _var(kind: Kind[T]) -> Callable[..., EnvVar[T]]:
    def make(name: str, default: T, doc: str, aliases: tuple[str, ...] = (), **options: Any) -> EnvVar[T]:
        return EnvVar(name, kind, default, doc, tuple(aliases), **options)

    make.__name__ = f"{kind.name}_var"
    make.__doc__ = (
        f"An EnvVar of type {kind.name}: (name, default, doc, aliases=(), upstream=, note=, shown=, from_recipe=)."
    )
    return make


str_var = _var(STR)
int_var = _var(INT)
float_var = _var(FLOAT)
bool_var = _var(BOOL)
bytes_var = _var(BYTES)
list_var = _var(LIST)


def optional_var(name: str, doc: str, aliases: tuple[str, ...] = (), **options: Any) -> EnvVar[str | None]:
    """A text variable that is None when unset or empty."""
    return EnvVar(name, OPTIONAL, None, doc, tuple(aliases), **options)


def one_of(*choices: str) -> Callable[[str], str]:
    """A custom_var parser: the value lower-cased and stripped, which must be one of `choices`."""

    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}, got {raw!r}")
        return value

    return parse


def custom_var(
    name: str, parse: Callable[[str], T], default: T, doc: str, aliases: tuple[str, ...] = (), **options: Any
) -> EnvVar[T]:
    """A variable with its own parser (text -> value; a ValueError names the variable)."""
    return EnvVar(name, Kind(parse.__name__, lambda raw, source: parse(raw)), default, doc, tuple(aliases), **options)


def env_fields(cls: type, table: EnvTable) -> dict[str, Any]:
    """{field: its variable read from the environment} for every field of the dataclass `cls` declared
    with `EnvVar.field()`, in field order."""
    return {f.name: table[f.metadata["env"]].get() for f in dataclasses.fields(cls) if "env" in f.metadata}


class EnvTable:
    """A service's variables, in documentation order; `table[name]` is the EnvVar."""

    def __init__(self, service: str, variables: list[EnvVar[Any]]) -> None:
        self.service = service
        self.variables = list(variables)
        self._by_name = {v.name: v for v in self.variables}
        if len(self._by_name) != len(self.variables):
            raise ValueError(f"{service}: a variable is declared twice")

    def __getitem__(self, name: str) -> EnvVar[Any]:
        return self._by_name[name]

    def __iter__(self) -> Iterator[EnvVar[Any]]:
        return iter(self.variables)

    def names(self) -> set[str]:
        return {n for v in self.variables for n in v.names}

    def markdown(self) -> str:
        return "\n".join(["| env | default | meaning |", "|---|---|---|", *(v.row() for v in self.variables)])


# read by every service (jev_common.logs, jev_common.recipe)
LOG_LEVEL = str_var("JEV_LOG_LEVEL", "INFO", "log level; every log line is one JSON object on stderr")
RECIPES_DIR = str_var(
    "JEV_RECIPES_DIR", COMPUTED, "where recipe names are looked up", shown="`recipes/` of this checkout"
)
