"""The worker's registries map a name to "module:Class", imported on first use (a family's module pulls in
only what that family needs)."""

from __future__ import annotations

import importlib

from jev_common.checkpoint_files import ServingError


def named_class(table: dict[str, str], name: str, what: str, where: str = "") -> type:
    """The class `table[name]` names; ServingError naming `what` (found `where`) and every known name when
    there is none."""
    if name not in table:
        raise ServingError(f"unknown {what} {name!r}{where}; this worker has: {', '.join(sorted(table))}")
    module, _, cls = table[name].partition(":")
    return getattr(importlib.import_module(module), cls)
