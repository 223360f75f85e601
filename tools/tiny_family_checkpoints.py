"""Tiny random-weight checkpoints in the on-disk layouts of the families with their own heads
(Laya, ...), for tests. The tokenizer is the real SmolLM2 one (tools.tiny_checkpoints) plus what the
family's layout needs (an encoder's [CLS]/[SEP]/[MASK]/[PAD]/[UNK])."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.tiny_checkpoints import smollm2_tokenizer

ENCODER_SPECIAL = {
    "cls_token": "[CLS]",
    "sep_token": "[SEP]",
    "mask_token": "[MASK]",
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
}


def _write_json(path: Path, value: object) -> None:
    path.write_text(json.dumps(value, indent=2), encoding="utf-8")


def make_tiny_laya(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    head_layers: int = 1,
    temperature=(1.3, 0.8, 1.1),
    temperature_by_options=None,
    max_len: int = 512,
    head_max_len: int = 192,
) -> Path:
    """convaiinnovations/laya's layout: `rl_agent_config.json`, `model.safetensors` (the ModernBERT
    encoder under `encoder.`, `head.layers.{i}.*` pre-norm transformer layers, `type_emb`, `scorer`,
    `act_head`, the legacy `temperature` buffer), `encoder/config.json`, `tokenizer/`."""
    import torch
    from safetensors.torch import save_file
    from torch import nn
    from transformers import ModernBertConfig, ModernBertModel

    path = Path(path)
    tokenizer = smollm2_tokenizer()
    tokenizer.add_special_tokens(ENCODER_SPECIAL)
    config = ModernBertConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        global_attn_every_n_layers=2,
        local_attention=16,
        max_position_embeddings=1024,
        initializer_range=0.1,  # larger than ModernBERT's 0.02, so the [mask] markers' states differ
        pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id,
        sep_token_id=tokenizer.sep_token_id,
        bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )
    torch.manual_seed(seed)
    encoder = ModernBertModel(config).eval()
    head = nn.TransformerEncoder(
        nn.TransformerEncoderLayer(hidden, max(1, hidden // 64), 4 * hidden, 0.1, batch_first=True, norm_first=True),
        head_layers,
        enable_nested_tensor=False,
    )
    type_emb = nn.Embedding(3, hidden)
    scorer = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))
    act_head = nn.Sequential(nn.Linear(hidden + 4, 256), nn.GELU(), nn.Linear(256, 2))
    with torch.no_grad():  # larger-than-default so the options' probabilities are not all alike
        scorer[1].weight.normal_(0.0, 1.0)
        scorer[3].weight.normal_(0.0, 2.0)
        scorer[0].weight.normal_(1.0, 0.3)
    state = {f"encoder.{k}": v for k, v in encoder.state_dict().items()}
    for prefix, module in (("head.", head), ("type_emb.", type_emb), ("scorer.", scorer), ("act_head.", act_head)):
        state.update({prefix + k: v for k, v in module.state_dict().items()})
    state["temperature"] = torch.ones(3)
    path.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
    config.save_pretrained(path / "encoder")
    tokenizer.save_pretrained(path / "tokenizer")
    _write_json(
        path / "rl_agent_config.json",
        {
            "encoder": "answerdotai/ModernBERT-large",
            "head_layers": head_layers,
            "act_costs": {"ask": 0.1},
            "max_len": max_len,
            "head_max_len": head_max_len,
            "temperature": list(temperature),
            "temperature_by_options": dict(temperature_by_options or {"choice:3-5": 1.7}),
        },
    )
    return path


def make_tiny_omnijev(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    width: int = 24,
    ordinal_width: int = 16,
    temperatures=None,
    noul_bias: float = 0.4,
) -> Path:
    """The system1-omni export's text side: a causal LM whose tokenizer has the option markers
    `<|opt|>` / `<|/opt|>`, FP32 `heads.safetensors` (`head.*` OptionScorer, `ord.*` OrdinalScoreHead,
    widths `width` / `ordinal_width` for the real 1024 / 512) and `omnijev_export.json` (format,
    option_tokens, heads, calibration)."""
    import torch
    from safetensors.torch import save_file
    from torch import nn
    from transformers import AddedToken, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = smollm2_tokenizer()
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|opt|>", "<|/opt|>")], special_tokens=True
    )
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)

    def linear(name: str, outputs: int, inputs: int, std: float | None = None) -> dict:
        layer = nn.Linear(inputs, outputs)
        if std is not None:
            nn.init.normal_(layer.weight, 0.0, std)
        return {f"{name}.weight": layer.weight.detach(), f"{name}.bias": layer.bias.detach()}

    heads = {}
    for name, out, inp, std in (
        ("head.opt.0", width, hidden, 0.5),
        ("head.opt.2", width, width, 0.5),
        ("head.que.0", width, hidden, 0.5),
        ("head.que.2", width, width, 0.5),
        ("head.score", 1, width, 0.15),
        ("head.abstain", 1, width, 0.15),
        ("head.feat", width, 6, 0.02),
        ("head.feat_lin", 1, 6, 0.02),
        ("ord.z.0", ordinal_width, hidden, 0.5),
        ("ord.z.2", 1, ordinal_width, 1.0),
        ("ord.cut.0", ordinal_width, hidden, 0.5),
        ("ord.cut.2", 1, ordinal_width, 1.0),
    ):
        heads.update(linear(name, out, inp, std))
    heads["head.log_tau"] = torch.tensor([0.1, -0.2, 0.3])
    save_file({k: v.float().contiguous() for k, v in heads.items()}, str(path / "heads.safetensors"))
    _write_json(
        path / "omnijev_export.json",
        {
            "format": "omnijev-merged/1",
            "vocabulary": len(tokenizer),
            "option_tokens": {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|opt|>", "<|/opt|>")},
            "heads": {"norm": "softmax", "lm_features": True, "ordinal": True},
            "calibration": {
                "temperatures": dict(temperatures or {"noul": 1.3, "choice": 0.8, "score": 1.5}),
                "noul_bias": noul_bias,
            },
        },
    )
    return path
