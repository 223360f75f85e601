"""A tiny JEV-27B-VL checkpoint in the release's own layout, for tests (tools/tiny_checkpoints.py's Qwen3.5
vision-language backbone with random weights).

    <folder>/calibration.json                    {"per_kind": {"noul": T, "score": T, "choice": T}}
    <folder>/adapter_vllm/decision_head.json     {"slots": {num_slots, ranges, verbalizers, template_version},
                                                  "verbalizer_ids": [24 ids], "bias": [24 floats]}
    <folder>/label_head.safetensors              `rows` F32 [n, hidden], `ids` I64 [n] (export_merged.py)

The 24 verbalizer slots are the tokenizer's `false`, `true`, `0`..`5` and the first 16 option labels
(A..P); the label head covers them and every single-token option label (serve_decide.py's scan), its rows
the LM head's plus a fixed FP32 delta (standing in for the LoRA delta a BF16 backbone would round away), so
a test can tell which rows were read. `add_lora` adds a PEFT LoRA in `adapter_vllm/` (lm_head and one
attention projection), the source snapshot's layout for recipes/jev-27b-vl/export.py.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

CALIBRATION = {"per_kind": {"noul": 1.31, "score": 1.12, "choice": 0.87}}
# small non-zero slot biases (noul 0-1, score 2-7, choice 8-23)
BIAS = [round(0.04 * ((7 * i) % 11 - 5) + 0.01, 4) for i in range(24)]
LABEL_HEAD_DELTA = 0.05  # std of the fixed delta added to the label rows


def _lm_head(folder: Path):
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        return handle.get_tensor("lm_head.weight")


def decision_head(tokenizer) -> dict:
    """decision_head.json for `tokenizer`: the release's slot layout with this tokenizer's ids."""
    from jev_worker.families.jev_vl.contract import RANGES, single_token_labels

    labels = [label for label, _ in single_token_labels(tokenizer)[:16]]
    verbalizers = ["false", "true"] + [str(i) for i in range(6)] + labels
    ids = []
    for text in verbalizers:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        assert len(encoded) == 1, (text, encoded)
        ids.append(encoded[0])
    return {
        "slots": {"num_slots": 24, "ranges": RANGES, "verbalizers": verbalizers, "template_version": "bare-v1"},
        "verbalizer_ids": ids,
        "bias": list(BIAS),
    }


def make_tiny_jev_vl(
    path: str | os.PathLike, *, seed: int = 5, label_head: bool = True, calibration: dict | None = CALIBRATION
) -> Path:
    """The tiny backbone plus JEV-VL's decision files (label_head.safetensors only with `label_head`,
    calibration.json only when `calibration` is not None)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from jev_worker.families.jev_vl.contract import single_token_labels
    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl

    folder = make_tiny_qwen3_5_vl(path, seed=seed)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    head = decision_head(tokenizer)
    (folder / "adapter_vllm").mkdir()
    (folder / "adapter_vllm" / "decision_head.json").write_text(json.dumps(head, indent=2))
    if calibration is not None:
        (folder / "calibration.json").write_text(json.dumps(calibration))
    if label_head:
        ids = list(dict.fromkeys(head["verbalizer_ids"] + [t for _, t in single_token_labels(tokenizer)]))
        index = torch.tensor(ids, dtype=torch.int64)
        generator = torch.Generator().manual_seed(seed + 1000)
        rows = _lm_head(folder)[index].float()
        rows = rows + LABEL_HEAD_DELTA * torch.randn(rows.shape, generator=generator)
        save_file({"rows": rows.contiguous(), "ids": index}, str(folder / "label_head.safetensors"))
    return folder


def add_lora(folder: str | os.PathLike, *, seed: int = 7, r: int = 4, alpha: float = 8.0) -> Path:
    """A PEFT LoRA in `<folder>/adapter_vllm/` (inference_mode, dropout 0) on lm_head and the full-attention
    layer's q_proj, keys `base_model.model.<module>.lora_A/B.weight` as the release's adapter has them."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    folder = Path(folder)
    modules = ["lm_head", "model.language_model.layers.3.self_attn.q_proj"]
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as handle:
        for module in modules:
            out_features, in_features = handle.get_slice(module + ".weight").get_shape()
            key = f"base_model.model.{module}"
            tensors[f"{key}.lora_A.weight"] = 0.2 * torch.randn(r, in_features, generator=generator)
            tensors[f"{key}.lora_B.weight"] = 0.2 * torch.randn(out_features, r, generator=generator)
    adapter = folder / "adapter_vllm"
    adapter.mkdir(exist_ok=True)
    save_file(tensors, str(adapter / "adapter_model.safetensors"))
    config = {
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "inference_mode": True,
        "target_modules": ["lm_head", "q_proj"],
        "bias": "none",
        "task_type": "CAUSAL_LM",
    }
    (adapter / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder
