"""A tiny StartLux-Decision checkpoint in the release's layout (StartLux-Decision-4B: `Qwen3_5ForConditionalGeneration`,
model_type qwen3_5 with its vision tower, the tokenizer with Qwen3.5's chat template, `decision_config.json` with
`letter_token_ids`, `temperature_by_type` and `wide_choice`).

The tokenizer is the Qwen3.5-style one of tools/tiny_decider_checkpoint.py (SmolLM2's BPE with Qwen3.5's special
tokens and a Qwen3.5-shaped template that renders the empty think block for `enable_thinking=False`), plus `"\\n\\n"`
as an added token: SmolLM2's BPE would otherwise re-split the prompt's closing `"\\n\\n"` before a letter, which
upstream's letter check (`jevfmt.check_tokenizer`) refuses; Qwen3.5's own tokenizer passes it as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

TEMPERATURES = {"choice": 1.3872, "noul": 1.5905, "score": 1.4172}  # a third-party run log of the 4B (startlux.md)


def make_tiny_startlux(path: str | os.PathLike, *, seed: int = 0, temperatures: dict | None = None) -> Path:
    import torch
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl
    from tools.tiny_decider_checkpoint import qwen3_5_style_tokenizer

    path = make_tiny_qwen3_5_vl(path, seed=seed)
    tokenizer = qwen3_5_style_tokenizer(AutoTokenizer.from_pretrained(path), extra=("\n\n",))
    model = Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(seed + 1)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    letters = [tokenizer.encode(letter, add_special_tokens=False)[0] for letter in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    (path / "decision_config.json").write_text(
        json.dumps(
            {
                "letter_token_ids": letters,
                "temperature_by_type": TEMPERATURES if temperatures is None else temperatures,
                "wide_choice": {"group": 25, "keep": 3, "residual": 0.001},
                "release_date": "2026-10-01",
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return path
