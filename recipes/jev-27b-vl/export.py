"""Export for recipe jev-27b-vl: merge the `adapter_vllm` LoRA into the backbone and cut the merged FP32
label rows the System 1 readout reads, as upstream's exporter does (system1-omni recipe/jev_vl/export_merged.py).

Reads the snapshot's `adapter_vllm/decision_head.json` (24 `verbalizer_ids`, `bias`, `slots.ranges`, checked
as export_merged.py checks them) and `calibration.json` (`per_kind`), scans the tokenizer's single-token
option labels (serve_decide.py's scan; the first 16 must be the trained A-P slots), and writes through
tools/export_checkpoint.py (streamed, one tensor at a time; W + alpha/r * B@A in FP32, then the target dtype):

    <out>/label_head.safetensors            `rows` F32 [n, hidden], `ids` I64 [n]: the verbalizer ids and every
                                            option label, from the merged FP32 head before rounding
    <out>/calibration.json                  carried as is
    <out>/adapter_vllm/decision_head.json   carried as is
    <out>/manifest.json                     sha256 + size of every file

Usage in README.md. CPU only; the output folder must not exist.
"""

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "services")]

from tools.export_checkpoint import _TARGET_DTYPES, ExportError, HeadFile, add_files, export_checkpoint  # noqa: E402

RECIPE = "jev-27b-vl"
LABEL_HEAD = HeadFile("label_head.safetensors", rows="rows", ids="ids")  # export_merged.py's names


def head_ids(snapshot: Path, tokenizer_dir: Path) -> list[int]:
    """The verbalizer ids, then every option label's id (the union, order kept), as export_merged.py cuts them."""
    from transformers import AutoTokenizer

    from jev_worker.families.jev_vl.contract import (
        CALIBRATION,
        HEAD_CONFIG,
        MAX_OPTIONS,
        RANGES,
        SLOTS,
        single_token_labels,
    )

    head = json.loads((snapshot / HEAD_CONFIG).read_text(encoding="utf-8"))
    if head.get("slots", {}).get("ranges") != RANGES:
        raise ExportError(f"{HEAD_CONFIG}: slots.ranges is not {RANGES}")
    if not (len(head.get("verbalizer_ids", ())) == len(head.get("bias", ())) == SLOTS):
        raise ExportError(f"{HEAD_CONFIG}: needs {SLOTS} verbalizer_ids and {SLOTS} bias values")
    if not (snapshot / CALIBRATION).is_file():
        raise ExportError(f"{snapshot / CALIBRATION} is missing (the per-kind temperatures)")
    labels = single_token_labels(AutoTokenizer.from_pretrained(tokenizer_dir))
    if len(labels) != MAX_OPTIONS:
        print(f"export ({RECIPE}): note: only {len(labels)} single-token option labels", file=sys.stderr)
    lo, hi = RANGES["choice"]
    if [t for _, t in labels[: hi - lo]] != head["verbalizer_ids"][lo:hi]:
        raise ExportError("the tokenizer's first option labels are not the trained A-P head (verbalizer_ids[8:24])")
    return list(dict.fromkeys(head["verbalizer_ids"] + [t for _, t in labels]))


def main(argv: list[str] | None = None) -> int:
    from jev_worker.families.jev_vl.contract import CALIBRATION, HEAD_CONFIG

    parser = argparse.ArgumentParser(
        description=f"Export a checkpoint for recipe {RECIPE} (tools/export_checkpoint.py)"
    )
    parser.add_argument("--base", required=True, help="the downloaded autotrust/JEV-27B-VL snapshot folder")
    parser.add_argument("--adapter", help="folder holding adapter_vllm/ and calibration.json (default: --base)")
    parser.add_argument("--out", required=True, help="output folder; must not exist")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(_TARGET_DTYPES))
    args = parser.parse_args(argv)
    base = Path(args.base)
    snapshot = Path(args.adapter or args.base)
    try:
        ids = head_ids(snapshot, base)
        export_checkpoint(
            base, args.out, lora_dir=snapshot / "adapter_vllm", dtype=args.dtype, label_ids=ids, head_file=LABEL_HEAD
        )
        carried = {HEAD_CONFIG: snapshot / HEAD_CONFIG}
        if not (Path(args.out) / CALIBRATION).exists():  # copied with --base's other files when it is there
            carried[CALIBRATION] = snapshot / CALIBRATION
        add_files(args.out, carried)
    except (ExportError, FileExistsError, OSError, ValueError) as exc:
        print(f"export ({RECIPE}): {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
