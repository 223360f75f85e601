"""Lay out wheel files as a PEP 503 simple index: DIR/simple/<normalised name>/<wheel file>.

    python3 tools/container_ci/wheel_index.py OUT_DIR WHEEL...

Used by tools/container_ci.sh to serve the CPU torch wheel (and the wheels it depends on) to image
builds where the PyTorch CPU index is not reachable; `python3 -m http.server` serves OUT_DIR and its
directory listings are the index pages pip reads.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path


def project_of(wheel: str) -> str:
    """The PEP 503 normalised project name of a wheel file name."""
    name = Path(wheel).name
    if not name.endswith(".whl") or name.count("-") < 4:
        raise ValueError(f"not a wheel file name: {name}")
    return re.sub(r"[-_.]+", "-", name.split("-", 1)[0]).lower()


def lay_out(out: Path, wheels: list[str]) -> list[Path]:
    placed = []
    for wheel in wheels:
        folder = out / "simple" / project_of(wheel)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / Path(wheel).name
        if not target.exists():
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)
        placed.append(target)
    return placed


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    placed = lay_out(Path(argv[1]), argv[2:])
    print(f"wheel_index: {len(placed)} wheels under {Path(argv[1]) / 'simple'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
