"""The package gate: a checkpoint's own code (`trust_remote_code`) is imported only when the recipe pins
the package, checked before any of it is imported.

A recipe with `model.trust_remote_code: true` must pin `model.revision` to a 40-hex commit and give
`model.remote_code_manifest` {path relative to the checkpoint folder: sha256}. Before the model is
loaded (serving.build_serving, before any backend reads weights or code), every listed
file must exist with its digest, and every code file (`*.py`, at any depth) of the folder must be listed.
Otherwise the worker does not start (status 2, or /health for an in-process start), naming the cause:
the unpinned revision, the missing manifest, the missing, changed or unlisted file.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from jev_common.checkpoint_files import ServingError

COMMIT = re.compile(r"^[0-9a-f]{40}$")
CODE_SUFFIXES = (".py",)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def manifest_of(folder: str | os.PathLike) -> dict[str, str]:
    """The manifest a recipe would pin for the code files of `folder` (to write into a recipe)."""
    root = Path(folder)
    return {
        p.relative_to(root).as_posix(): sha256_file(p)
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.suffix in CODE_SUFFIXES
    }


def check_remote_code(recipe, folder: str | os.PathLike) -> None:
    """Raise ServingError unless `recipe` may import the code in `folder` (a no-op without trust_remote_code)."""
    model = recipe.model
    if not model.trust_remote_code:
        return
    refused = f"recipe {recipe.name} sets trust_remote_code, refused:"
    if not COMMIT.match(model.revision):
        raise ServingError(
            f"{refused} model.revision {model.revision!r} is not a 40-hex commit; remote code "
            "runs only from a pinned commit"
        )
    if not model.remote_code_manifest:
        raise ServingError(f"{refused} no model.remote_code_manifest (sha256 of every code file of the package)")
    root = Path(folder).resolve()
    for name, expected in sorted(model.remote_code_manifest.items()):
        path = (root / name).resolve()
        if root not in path.parents:
            raise ServingError(f"{refused} manifest path {name!r} is outside the checkpoint folder")
        if not path.is_file():
            raise ServingError(f"{refused} {name} (in the manifest) is missing from {root}")
        actual = sha256_file(path)
        if actual != expected.lower():
            raise ServingError(f"{refused} {name} has sha256 {actual}, the manifest pins {expected}")
    unlisted = sorted(set(manifest_of(root)) - set(model.remote_code_manifest))
    if unlisted:
        raise ServingError(f"{refused} code file(s) not in the manifest: {', '.join(unlisted)}")
