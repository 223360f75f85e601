"""The env tables in README.md and docs/, rendered from each service's settings module (`ENV`), and the error
table of docs/CONTRACTS.md, rendered from jev_common.errors (`ERRORS`).

    python -m tools.env_tables --check    # exit 1 and name the table when a doc differs from the code
    python -m tools.env_tables --write    # rewrite the tables in place

A table in a markdown file sits between `<!-- env-table: SERVICE -->` and `<!-- /env-table -->`;
the quick map of ports and defaults (docs/CONTRACTS.md) between `<!-- env-map -->` and
`<!-- /env-map -->`, and the error table (docs/CONTRACTS.md, from jev_common.errors) between
`<!-- error-table -->` and `<!-- /error-table -->`. What is between the markers is generated, so names,
defaults, meanings and error statuses live only in the code.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/frontend.md", "docs/images.md", "docs/CONTRACTS.md")
_BLOCK = re.compile(r"(<!-- env-table: (?P<service>[a-z]+) -->\n)(?P<body>.*?)(<!-- /env-table -->)", re.S)
_MAP = re.compile(r"(<!-- env-map -->\n)(?P<body>.*?)(<!-- /env-map -->)", re.S)
_ERRORS = re.compile(r"(<!-- error-table -->\n)(?P<body>.*?)(\n<!-- /error-table -->)", re.S)
MAP_ORDER = ("frontend", "worker", "preencoder")


def tables() -> dict:
    from jev_frontend.settings import ENV as frontend
    from jev_preencoder.settings import ENV as preencoder
    from jev_worker.settings import ENV as worker

    return {"worker": worker, "frontend": frontend, "preencoder": preencoder}


def render(text: str, known: dict) -> str:
    def sub(match: re.Match) -> str:
        service = match.group("service")
        if service not in known:
            raise KeyError(f"env-table marker names an unknown service {service!r}; known: {sorted(known)}")
        return match.group(1) + known[service].markdown() + "\n" + match.group(4)

    from jev_common.errors import markdown_table

    text = _MAP.sub(lambda m: m.group(1) + quick_map(known) + "\n" + m.group(3), _BLOCK.sub(sub, text))
    return _ERRORS.sub(lambda m: m.group(1) + markdown_table() + m.group(3), text)


def quick_map(known: dict) -> str:
    """One row per service: its port and every variable, `NAME=default` where the default is a constant
    (the meanings and the other defaults are in the full tables)."""
    rows = ["| service | port | env (`=default` where it is a constant) |", "|---|---|---|"]
    for service in MAP_ORDER:
        table = known[service]
        env = ", ".join(
            f"`{var.name}={text}`" if (text := var.text()) is not None else f"`{var.name}`" for var in table
        )
        rows.append(f"| {service} | {table[f'JEV_{service.upper()}_PORT'].default} | {env} |")
    rows.append(f"| redis | {urlsplit(known['worker']['JEV_REDIS_URL'].default).port} | - |")
    return "\n".join(rows)


def blocks(text: str) -> list[str]:
    """The generated blocks of a markdown text, in order: service names, `map` for a quick map, `errors`."""
    found = [(m.start(), m.group("service")) for m in _BLOCK.finditer(text)]
    found += [(m.start(), "map") for m in _MAP.finditer(text)] + [(m.start(), "errors") for m in _ERRORS.finditer(text)]
    return [name for _, name in sorted(found)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.env_tables", description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true")
    mode.add_argument("--write", action="store_true")
    args = parser.parse_args(argv)
    known = tables()
    stale = []
    for name in DOCS:
        path = ROOT / name
        text = path.read_text(encoding="utf-8")
        fresh = render(text, known)
        if fresh != text:
            stale.append(f"{name} ({', '.join(blocks(text))})")
            if args.write:
                path.write_text(fresh, encoding="utf-8")
    if stale and args.check:
        print(
            "env tables differ from the settings modules: "
            + "; ".join(stale)
            + " (python -m tools.env_tables --write)",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
