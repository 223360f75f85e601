"""A tiny random-weight Clef checkpoint in Cloudflare/clef's on-disk layout: a Qwen3_5ForConditionalGeneration
backbone (tools.tiny_checkpoints.make_tiny_qwen3_5_vl) whose tokenizer also has Qwen's `<think>` / `</think>`,
plus `joint_head.safetensors` (the published JointSchemaHead's parameter names and shapes) and
`joint_head_config.json` ({hidden_size, width, routing_layers, layers, heads, feedforward})."""

from __future__ import annotations

import json
import os
from pathlib import Path

THINK_TOKENS = ("<think>", "</think>")


def clef_head_modules(config: dict):
    """torch modules named and shaped as Clef's JointSchemaHead parameters (no forward: the tests write the
    head's math out themselves, using these modules' own attention and decoder layers)."""
    import torch
    from torch import nn

    hidden, width, heads, ff = config["hidden_size"], config["width"], config["heads"], config["feedforward"]

    class Routing(nn.Module):
        def __init__(self):
            super().__init__()
            self.query_norm, self.memory_norm, self.feedforward_norm = (nn.LayerNorm(width) for _ in range(3))
            self.attention = nn.MultiheadAttention(width, heads, batch_first=True)
            self.feedforward = nn.Sequential(
                nn.Linear(width, ff), nn.GELU(), nn.Dropout(0.0), nn.Linear(ff, width), nn.Dropout(0.0)
            )

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.hidden_norm = nn.LayerNorm(hidden)
            for name in (
                "memory_projection",
                "question_projection",
                "option_question_projection",
                "global_projection",
                "option_context_projection",
                "option_lexical_projection",
            ):
                setattr(self, name, nn.Linear(hidden, width, bias=False))
            self.type_embedding = nn.Embedding(3, width)
            self.evidence_layers = nn.ModuleList([Routing() for _ in range(config["routing_layers"])])
            self.option_summary_norm = nn.LayerNorm(width)
            self.layers = nn.ModuleList(
                [
                    nn.TransformerDecoderLayer(
                        width, heads, ff, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
                    )
                    for _ in range(config["layers"])
                ]
            )
            self.field_norm, self.option_norm = nn.LayerNorm(width), nn.LayerNorm(width)
            self.residual_scorer = nn.Sequential(
                nn.Linear(4 * width, width), nn.GELU(), nn.Dropout(0.0), nn.Linear(width, 1)
            )
            self.prior_logit_scale = nn.Parameter(torch.zeros(()))
            self.joint_logit_scale = nn.Parameter(torch.zeros(()))
            self.residual_gate = nn.Parameter(torch.zeros(()))

    return Head().eval()


def add_think_tokens(path: Path) -> None:
    """Qwen's tokenizer has `<think>` / `</think>` (added, not special); SmolLM2's has not: add them and
    grow the embeddings and LM head to match."""
    import torch
    from transformers import AddedToken, AutoTokenizer, Qwen3_5ForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in THINK_TOKENS])
    tokenizer.save_pretrained(path)
    model = Qwen3_5ForConditionalGeneration.from_pretrained(path, dtype=torch.float32)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[-len(THINK_TOKENS) :].normal_(0.0, 0.02)
        model.get_output_embeddings().weight[-len(THINK_TOKENS) :].normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)


def make_tiny_clef(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 64,
    width: int = 32,
    routing_layers: int = 2,
    layers: int = 2,
    heads: int = 4,
    feedforward: int = 64,
) -> Path:
    import torch
    from safetensors.torch import save_file

    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl

    path = Path(make_tiny_qwen3_5_vl(path, seed=seed, hidden=hidden))
    torch.manual_seed(seed + 1)
    add_think_tokens(path)
    config = {
        "hidden_size": hidden,
        "width": width,
        "routing_layers": routing_layers,
        "layers": layers,
        "heads": heads,
        "feedforward": feedforward,
    }
    head = clef_head_modules(config)
    with torch.no_grad():  # every tensor random (norms and biases too), so a misread one changes the answers
        for name, tensor in head.state_dict().items():
            if name.endswith(".weight") and "norm" in name.split(".")[-2]:
                tensor.copy_(1.0 + 0.2 * torch.randn_like(tensor))
            elif tensor.dim() == 1:
                tensor.normal_(0.0, 0.2)
            elif tensor.dim() == 2:
                tensor.normal_(0.0, 1.0 / tensor.shape[1] ** 0.5)
        head.prior_logit_scale.fill_(1.0)
        head.joint_logit_scale.fill_(2.0)
        head.residual_gate.fill_(0.8)
    save_file({k: v.contiguous() for k, v in head.state_dict().items()}, str(path / "joint_head.safetensors"))
    (path / "joint_head_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path
