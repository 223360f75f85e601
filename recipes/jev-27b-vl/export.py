"""Export for recipe jev-27b-vl: merge the `adapter_vllm` LoRA into the base, cut the FP32 head rows.

Thin wrapper over tools/export_checkpoint.py; usage in README.md. CPU only, streams one tensor at a time.
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "services")]

from tools.export_checkpoint import recipe_export_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(recipe_export_main('jev-27b-vl', adapter_subdir='adapter_vllm', extra_globs=['*.json'],
                                head_json="decision_head.json"))
