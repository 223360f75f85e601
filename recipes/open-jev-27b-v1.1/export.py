"""Export for recipe open-jev-27b-v1.1: merge the `package/checkpoint/adapter` LoRA into the base; copy the scalar head
(`head.pt`), `temperature.json` and `model.json` of `package/checkpoint` beside the weights, where the worker's
open-jev family reads them.

Thin wrapper over tools/export_checkpoint.py; usage in README.md. CPU only, streams one tensor at a time.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "services")]

from tools.export_checkpoint import recipe_export_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(
        recipe_export_main(
            "open-jev-27b-v1.1",
            adapter_subdir="package/checkpoint/adapter",
            extras_subdir="package/checkpoint",
            extra_globs=["head.pt", "temperature.json", "model.json"],
            extras_into=".",
            decision_head=False,
        )
    )
