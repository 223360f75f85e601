"""A tiny random-weight Valen checkpoint in Valen's own on-disk layout (Liuziyu77/Valen
`valen/training/checkpoint.py`, stage `vision_top`), on a tiny Qwen3.5 base.

`<path>/base/`: a tiny Qwen3_5ForConditionalGeneration with its processor (tools.tiny_checkpoints), five
vision blocks. `<path>/valen/`: what Valen saves, and nothing else:
- `config.json`: the flat training config (stage vision_top, projection_dim, lora_rank, lora_alpha,
  max_length, dtype, model_path, media_kwargs);
- `checkpoint.pt` (torch.save of plain containers and tensors): `weights` = the trainable parameters of
  ValenQwen by name (PEFT LoRA A/B on every Linear of the language model under
  `backbone.language_model.base_model.model.`, the last four vision blocks and the merger under
  `backbone.visual.`, `head.decision.weight` / `head.candidate.weight`), an optimizer state, RNG states, the
  config, and `base_manifest` (repo, revision, weight_sha256 of the base's safetensors, versions).
LoRA B is random, not zero as at initialisation, so the adapter changes the answers.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

LORA_RANK, LORA_ALPHA, PROJECTION_DIM = 4, 8, 16
BASE_REPO, BASE_REVISION = "test/tiny-qwen3.5", "0123456789abcdef0123456789abcdef01234567"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_tiny_valen(path: str | os.PathLike, *, seed: int = 0, max_length: int = 8192) -> tuple[Path, Path]:
    """-> (valen folder, base folder)."""
    import torch
    from transformers import Qwen3_5ForConditionalGeneration

    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl

    path = Path(path)
    base = make_tiny_qwen3_5_vl(path / "base", seed=seed, vision_depth=5)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(base).eval()
    backbone = model.model
    generator = torch.Generator().manual_seed(seed + 1)

    def normal(shape, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * std

    weights = {}
    for name, module in backbone.language_model.named_modules():
        if isinstance(module, torch.nn.Linear):
            prefix = f"backbone.language_model.base_model.model.{name}"
            weights[f"{prefix}.lora_A.default.weight"] = normal((LORA_RANK, module.in_features), 0.2)
            weights[f"{prefix}.lora_B.default.weight"] = normal((module.out_features, LORA_RANK), 0.2)
    visual = backbone.visual
    trained = [f"blocks.{len(visual.blocks) - 4 + i}." for i in range(4)] + ["merger."]
    for name, value in visual.state_dict().items():
        if any(name.startswith(p) for p in trained):
            weights[f"backbone.visual.{name}"] = value + normal(value.shape, 0.05)
    hidden = model.config.text_config.hidden_size
    weights["head.decision.weight"] = normal((PROJECTION_DIM, hidden), 0.15)
    weights["head.candidate.weight"] = normal((PROJECTION_DIM, hidden), 0.15)

    config = {
        "architecture": "qwen",
        "model_path": "models/tiny-qwen3.5",
        "stage": "vision_top",
        "dtype": "fp32",
        "projection_dim": PROJECTION_DIM,
        "lora_rank": LORA_RANK,
        "lora_alpha": LORA_ALPHA,
        "max_length": max_length,
        "media_kwargs": {},
        "method": "sft",
    }
    manifest = {
        "repo": BASE_REPO,
        "revision": BASE_REVISION,
        "versions": {"torch": str(torch.__version__)},
        "weight_sha256": {f.name: _sha256(f) for f in sorted(base.glob("*.safetensors"))},
        "processor": "Qwen3VLProcessor",
        "hidden_size": hidden,
    }
    rng = random.Random(seed)
    payload = {
        "weights": weights,
        "optimizer": {
            "state": {0: {"step": torch.tensor(3.0), "exp_avg": torch.zeros(2)}},
            "param_groups": [{"lr": 2e-4, "name": "head", "params": [0]}],
        },
        "config": config,
        "progress": {"epoch": 0, "step": 3},
        "rng": rng.getstate(),
        "python_rng": random.Random(seed + 2).getstate(),
        "torch_rng": torch.get_rng_state(),
        "cuda_rng_current": None,
        "base_manifest": manifest,
    }
    valen = path / "valen"
    valen.mkdir(parents=True, exist_ok=True)
    torch.save(payload, valen / "checkpoint.pt")
    (valen / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return valen, base
