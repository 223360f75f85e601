"""A tiny random-weight Vela 2.0 decoder package (the 0.8B's on-disk layout) for tests.

Layout as the release and vLLM-SR's fixture writer describe it: `config.json` (model_type vela2-decoder,
format_version 1, `backbone_config` = a Qwen3.5 text config, `head_dim`, `span_head` {d, slots},
`max_length`, `span_layout`), `calibration.json` (temperatures, thresholds, broad head, noul fit),
`tokenizer.json`, two shards indexed by `model.safetensors.index.json` (`backbone.*`; then `head.*`,
`set_bias`, `span2.*`), `broad_head.safetensors` (`span_broad.*`), and the package's Python files, here
stubs that raise when imported (the worker must never import them).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.tiny_checkpoints import smollm2_tokenizer

PROJECTION, SLOTS = 16, 8
PYTHON_FILES = ("modeling_vela2.py", "vela2_inference.py")
CANDIDATE_SHAPES = lambda h, d: {  # noqa: E731 - the release's tensor names and shapes
    "candidate_norm.weight": [h],
    "candidate_norm.bias": [h],
    "query_norm.weight": [h],
    "query_norm.bias": [h],
    "key.weight": [d, h],
    "query.weight": [d, h],
    "candidate_mlp.weight": [d, h],
    "candidate_mlp.bias": [d],
    "query_mlp.weight": [d, h],
    "scalar.weight": [1, d],
}
SPAN_SHAPES = lambda h, d, s: {  # noqa: E731
    "wn.weight": [h],
    "wn.bias": [h],
    "ln.weight": [h],
    "ln.bias": [h],
    "slot.weight": [s, h],
    "K.weight": [d, h],
    "Q.weight": [d, h],
    "M.weight": [d, h],
    "M.bias": [d],
    "N.weight": [d, h],
    "v.weight": [1, d],
    "o.weight": [1, h],
    "o.bias": [1],
}


def _random(shapes: dict, prefix: str, generator) -> dict:
    import torch

    out = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight") or name in ("wn.weight", "ln.weight"):
            value = 1.0 + 0.1 * torch.randn(shape, generator=generator)
        else:
            value = 0.3 * torch.randn(shape, generator=generator)
        out[prefix + name] = value.contiguous()
    return out


def make_tiny_vela(
    path: str | os.PathLike, *, seed: int = 0, hidden: int = 32, broad: bool = True, max_length: int = 4096
) -> Path:
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = smollm2_tokenizer()
    tokenizer.backend_tokenizer.save(str(path / "tokenizer.json"))
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        max_position_embeddings=max_length,
    )
    torch.manual_seed(seed)
    backbone = Qwen3_5TextModel(config).eval()
    tensors = {f"backbone.{k}": v.detach().clone().contiguous() for k, v in backbone.state_dict().items()}
    generator = torch.Generator().manual_seed(seed + 1)
    heads = _random(CANDIDATE_SHAPES(hidden, PROJECTION), "head.", generator)
    heads["set_bias"] = torch.tensor(0.3)
    heads.update(_random(SPAN_SHAPES(hidden, PROJECTION, SLOTS), "span2.", generator))
    shards = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    save_file(tensors, str(path / shards[0]))
    save_file(heads, str(path / shards[1]))
    weight_map = {**dict.fromkeys(tensors, shards[0]), **dict.fromkeys(heads, shards[1])}
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    if broad:
        save_file(
            _random(SPAN_SHAPES(hidden, PROJECTION, SLOTS), "span_broad.", generator),
            str(path / "broad_head.safetensors"),
        )
    backbone_config = config.to_dict()
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Vela2DecoderModel"],
                "model_type": "vela2-decoder",
                "format_version": 1,
                "model_name": "tiny/Vela-2.0-Tiny",
                "backbone_config": backbone_config,
                "head_dim": PROJECTION,
                "span_head": {"d": PROJECTION, "slots": SLOTS},
                "pad_token_id": 0,
                "max_length": max_length,
                "span_layout": {"hybrid_rmax": 2048, "window": 1800, "stride": 1536, "window_above": 2048},
            },
            indent=2,
        )
    )
    (path / "calibration.json").write_text(
        json.dumps(
            {
                "temperature": {"choice": 1.3, "score": 1.1, "set": 1.05, "span": 0.4},
                "thresholds": {"set:*": 0.3, "span:*": 0.5, "span:halu": 0.55, "span:toxic": 0.1},
                "broad_head": {
                    "temperature": 0.9,
                    "threshold": 0.55,
                    "router_label_sets": [["PERSON"], ["unsupported"]],
                },
                "noul_calibration": {"T": 2.0, "b": 0.25, "default": False},
            },
            indent=2,
        )
    )
    for name in PYTHON_FILES:
        (path / name).write_text('raise RuntimeError("the worker must never import the package code")\n')
    return path
