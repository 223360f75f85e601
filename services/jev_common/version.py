"""The code version every answer names (`x-jev-code-version`, `/v1/models` `x_code_version`), so that a changed answer
can be traced to a changed model or changed code. A deployment may set it (the worker's JEV_CODE_VERSION: an image
build can pass its git commit); else it is `src-` and a digest of the services' Python sources as they are on disk:
the same code gives the same version on every machine, with or without a git checkout."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

SERVICES = Path(__file__).resolve().parents[1]


@functools.lru_cache(maxsize=1)
def source_version() -> str:
    digest = hashlib.sha256()
    for path in sorted(SERVICES.rglob("*.py")):
        digest.update(str(path.relative_to(SERVICES)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
    return "src-" + digest.hexdigest()[:12]
