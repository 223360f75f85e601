"""A tiny random code-readout v1 checkpoint in the layout pplx-decider and D3 publish: a `Qwen3_5Model` (the
backbone without its LM head: `language_model.*`, `visual.*`, saved as `DecisionModel.save` saves
`self.backbone`), its tokenizer with the Qwen3.5-style chat template (tools/tiny_qwen3_5_chat.py),
`readout.safetensors` (`weight` [255, hidden], BF16) and `decision_config.json` (`format_version` 1,
`base_model`, `revision`, `codes`, `token_ids`, `temperature`, plus what the family's files carry).

The codes are chosen as upstream's `answer_codes` chooses them: A..Z then AA, AB, ..., each one token alone
and right after the thinking-off generation prompt, the first 255.
"""

from __future__ import annotations

import itertools
import json
import os
import string
from pathlib import Path


def answer_codes(tokenizer, count: int = 255) -> tuple[list[str], list[int]]:
    prefix = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Choose an option."}],
        tokenize=False,
        add_generation_prompt=True,
        enable_thinking=False,
    )
    prefix_ids = tokenizer.encode(prefix, add_special_tokens=False)
    codes, ids = [], []
    for code in list(string.ascii_uppercase) + [
        "".join(p) for p in itertools.product(string.ascii_uppercase, repeat=2)
    ]:
        encoded = tokenizer.encode(code, add_special_tokens=False)
        if len(encoded) != 1 or encoded[0] in ids:
            continue
        if tokenizer.encode(prefix + code, add_special_tokens=False) != prefix_ids + encoded:
            continue
        codes.append(code)
        ids.append(encoded[0])
        if len(codes) == count:
            return codes, ids
    raise RuntimeError(f"the tokenizer has only {len(codes)} answer codes, {count} wanted")


def make_tiny_code_readout_package(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 64,
    temperature: float = 1.37,
    layer_types: tuple[str, ...] | None = None,
    **decision,
) -> Path:
    """The checkpoint folder; `decision` adds fields to decision_config.json (attention_mode, prompt, ...).
    `layer_types` as make_tiny_qwen3_5_vl takes them (a full-attention layer before the last one is what
    noncausal attention changes at the last position)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen3_5ForConditionalGeneration

    from tools.tiny_qwen3_5_chat import make_tiny_qwen3_5_chat

    path = Path(path)
    layout = {"layer_types": layer_types} if layer_types else {}
    base = make_tiny_qwen3_5_chat(path.parent / f".{path.name}-base", seed=seed, hidden=hidden, **layout)
    full = Qwen3_5ForConditionalGeneration.from_pretrained(base, dtype=torch.float32)
    full.model.save_pretrained(path, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.save_pretrained(path)
    codes, ids = answer_codes(tokenizer)
    torch.manual_seed(seed + 1)
    save_file({"weight": (torch.randn(len(codes), hidden) * 0.5).to(torch.bfloat16)}, str(path / "readout.safetensors"))
    config = {
        "format_version": 1,
        "base_model": "Qwen/Qwen3.8-27B",
        "revision": "1d4bf0f2ff6012fd82039f2fa52739d0dd7c60c0",
        "codes": codes,
        "token_ids": ids,
        "temperature": temperature,
        **decision,
    }
    (path / "decision_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path
