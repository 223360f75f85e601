"""Export for recipe jemm: merge the `.` LoRA into the base, cut the FP32 head rows.

Thin wrapper over tools/export_checkpoint.py; usage in README.md. CPU only, streams one tensor at a time.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "services")]

from tools.export_checkpoint import recipe_export_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(recipe_export_main("jemm", adapter_subdir=".", extra_globs=["decision_config.json"], head_json=None))
