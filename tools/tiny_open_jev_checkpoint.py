"""A tiny random Open-Jev release in its published layout, and its export as the recipe documents it.

- base: a Qwen3.5 base checkpoint (tools.tiny_qwen3_5_chat: `Qwen3_5ForConditionalGeneration`, the Qwen3.5
  chat template with its thinking block);
- repo: the hub repository's `package/checkpoint/` as Open-Jev's `jev/model.py` reads it: `model.json`
  (`model_id`, `revision`, `max_length`, `lora_rank`, `method`), `head.pt` (the `nn.Linear(hidden, 1)` state dict),
  `temperature.json` (`{"temperature": T}`) and `adapter/` (a PEFT LoRA of the text model, `r = lora_rank`,
  `lora_alpha = 2 r`, targets `q_proj, k_proj, v_proj, o_proj, in_proj_qkv, out_proj`, tensors named as PEFT saves
  an adapter of `full.model.language_model`: `base_model.model.layers.{i}.{module}.lora_{A,B}.weight`).

`export_open_jev` runs a recipe's `export.py` (the documented command) in this process.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path

from jev_common.recipe import REPO_ROOT

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "out_proj")


def make_tiny_open_jev_release(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 64,
    rank: int = 4,
    temperature: float = 1.8969118766347646,
    max_length: int = 4096,
) -> tuple[Path, Path]:
    """(base folder, repository folder) of a tiny Open-Jev release (module docstring)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from tools.tiny_qwen3_5_chat import make_tiny_qwen3_5_chat

    path = Path(path)
    base = make_tiny_qwen3_5_chat(path / "base", seed=seed, hidden=hidden)
    checkpoint = path / "repo" / "package" / "checkpoint"
    (checkpoint / "adapter").mkdir(parents=True)
    torch.manual_seed(seed + 1)
    adapter = {}
    prefix = "model.language_model."
    with safe_open(str(base / "model.safetensors"), framework="pt") as handle:
        for name in handle.keys():
            module = name.removeprefix(prefix).removesuffix(".weight")
            if not name.startswith(prefix) or module.split(".")[-1] not in TARGETS:
                continue
            out_features, in_features = handle.get_slice(name).get_shape()
            adapter[f"base_model.model.{module}.lora_A.weight"] = torch.randn(rank, in_features) / in_features**0.5
            adapter[f"base_model.model.{module}.lora_B.weight"] = torch.randn(out_features, rank) * 0.2
    save_file(adapter, str(checkpoint / "adapter" / "adapter_model.safetensors"))
    (checkpoint / "adapter" / "adapter_config.json").write_text(
        json.dumps(
            {
                "peft_type": "LORA",
                "r": rank,
                "lora_alpha": 2 * rank,
                "target_modules": list(TARGETS),
                "lora_dropout": 0.0,
                "bias": "none",
                "fan_in_fan_out": False,
                "use_rslora": False,
                "use_dora": False,
                "base_model_name_or_path": "Qwen/Qwen3.5-9B",
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    torch.save({"weight": torch.randn(1, hidden) * 0.5, "bias": torch.randn(1)}, checkpoint / "head.pt")
    (checkpoint / "temperature.json").write_text(json.dumps({"temperature": temperature}), encoding="utf-8")
    (checkpoint / "model.json").write_text(
        json.dumps(
            {
                "model_id": "Qwen/Qwen3.5-9B",
                "revision": "c202236235762e1c871ad0ccb60c8ee5ba337b9a",
                "max_length": max_length,
                "lora_rank": rank,
                "method": "lora",
            },
            indent=2,
        ),
        encoding="utf-8",
    )
    return base, path / "repo"


def export_open_jev(recipe: str, base: Path, repo: Path, out: Path, dtype: str = "float32") -> Path:
    """`python recipes/<recipe>/export.py --base BASE --adapter REPO --out OUT --dtype DTYPE`, run in this process
    (FP32 by default: a test compares it to an unrounded reference; the documented export writes BF16)."""
    argv = sys.argv
    sys.argv = ["export.py", "--base", str(base), "--adapter", str(repo), "--out", str(out), "--dtype", dtype]
    try:
        runpy.run_path(str(REPO_ROOT / "recipes" / recipe / "export.py"), run_name="__main__")
    except SystemExit as done:
        if done.code:
            raise RuntimeError(f"recipes/{recipe}/export.py exited {done.code}") from None
    finally:
        sys.argv = argv
    return out


def make_tiny_open_jev(path: str | os.PathLike, *, seed: int = 0, recipe: str = "open-jev-9b", **release) -> Path:
    """The served folder: a tiny release exported by `recipe`'s export.py (to `path/export`)."""
    base, repo = make_tiny_open_jev_release(path, seed=seed, **release)
    return export_open_jev(recipe, base, repo, Path(path) / "export")
