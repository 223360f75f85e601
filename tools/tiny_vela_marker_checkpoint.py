"""A tiny random-weight Vela 2.0 encoder package (the 0.3B's on-disk layout, `vela2-unified`) for tests.

Layout as the release and vLLM-SR's fixture writer (`vllm_srun/testing/vela2.py`) describe it: `config.json`
(model_type vela2-unified, format_version 1, `encoder_config` = a ModernBERT configuration with the 0.3B's
global / local layers and YaRN rotary, `proj_dim`, `readout`, `markers`, `marker_ids`, bos / eos / pad ids,
`max_length`, `window_overlap`), `calibration.json` (temperatures, thresholds, the PII rule), `tokenizer.json`
(the eight marker tokens added last, as special tokens) and `model.safetensors` (`encoder.*` and the marker
head: `norm`, `w_o`, `w_q`, `w_p`, `w_t`, `w_e`, `cls_mlp`, `log_tau`, `log_tau_span`); the package's Python
files are stubs that raise when imported (the worker must never import them). The tokenizer is the real
SmolLM2 one plus `<pad>` / `<eos>` / `<bos>` and the markers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.tiny_checkpoints import smollm2_tokenizer

MARKERS = ("[Q]", "[O]", "[ABS]", "[SEP_SCHEMA]", "[SEG_user]", "[SEG_answer]", "[E]", "[SEG_context]")
SPECIAL = ("<pad>", "<eos>", "<bos>")
PYTHON_FILES = ("modeling_vela2.py", "vela2_inference.py")
PROJECTION = 16


def encoder_config(vocab: int, pad: int, bos: int, eos: int, hidden: int, layers: int) -> dict:
    """A ModernBERT configuration shaped like the 0.3B's (global every 3rd layer, YaRN x4), tiny."""
    return {
        "architectures": ["ModernBertModel"],
        "model_type": "modernbert",
        "attention_bias": False,
        "bos_token_id": bos,
        "cls_token_id": bos,
        "eos_token_id": eos,
        "sep_token_id": eos,
        "pad_token_id": pad,
        "global_attn_every_n_layers": 3,
        "global_rope_theta": 160000,
        "local_rope_theta": 160000,
        "local_attention": 8,
        "hidden_activation": "gelu",
        "hidden_size": hidden,
        "intermediate_size": hidden * 3 // 2,
        "max_position_embeddings": 32768,
        "mlp_bias": False,
        "norm_bias": False,
        "norm_eps": 1e-5,
        "num_attention_heads": 4,
        "num_hidden_layers": layers,
        "vocab_size": vocab,
        "initializer_range": 0.1,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 8192,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": True,
        },
    }


def _head(hidden: int, readout: str, generator, log_tau: float, log_tau_span: float) -> dict:
    """The marker head's tensors under the package's names, random (LayerNorm near identity)."""
    import torch

    def randn(*shape, scale=0.3):
        return scale * torch.randn(shape, generator=generator)

    tensors = {"norm.weight": 1.0 + randn(hidden, scale=0.1), "norm.bias": randn(hidden, scale=0.1)}
    for name in ("w_o", "w_q", "w_p", "w_t", "w_e"):
        tensors[f"{name}.weight"] = randn(PROJECTION, hidden)
        tensors[f"{name}.bias"] = randn(PROJECTION)
    if readout in ("mlp", "both"):
        tensors.update(
            {
                "cls_mlp.0.weight": randn(2 * hidden, hidden),
                "cls_mlp.0.bias": randn(2 * hidden),
                "cls_mlp.3.weight": randn(1, 2 * hidden),
                "cls_mlp.3.bias": randn(1),
            }
        )
    tensors["log_tau"] = torch.tensor(log_tau)
    tensors["log_tau_span"] = torch.tensor(log_tau_span)
    return tensors


def make_tiny_vela_marker(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 3,
    readout: str = "both",
    max_length: int = 2048,
    log_tau: float = -0.5,
    log_tau_span: float = 0.0,
) -> Path:
    import torch
    from safetensors.torch import save_file
    from tokenizers import AddedToken
    from transformers import ModernBertConfig, ModernBertModel

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = smollm2_tokenizer().backend_tokenizer
    text.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL + MARKERS])
    text.save(str(path / "tokenizer.json"))
    vocab = text.get_vocab_size()
    pad, eos, bos = (text.token_to_id(t) for t in SPECIAL)
    marker_ids = {name: vocab - len(MARKERS) + i for i, name in enumerate(MARKERS)}
    assert all(text.token_to_id(name) == i for name, i in marker_ids.items())
    encoder = encoder_config(vocab, pad, bos, eos, hidden, layers)
    torch.manual_seed(seed)
    model = ModernBertModel(ModernBertConfig(**{k: v for k, v in encoder.items() if k != "model_type"})).eval()
    tensors = {f"encoder.{k}": v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    tensors.update(_head(hidden, readout, torch.Generator().manual_seed(seed + 1), log_tau, log_tau_span))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["Vela2Model"],
                "model_type": "vela2-unified",
                "format_version": 1,
                "model_name": "tiny/Vela-2.0-Tiny-Encoder",
                "encoder_config": encoder,
                "proj_dim": PROJECTION,
                "readout": readout,
                "markers": list(MARKERS),
                "marker_ids": marker_ids,
                "bos_token_id": bos,
                "eos_token_id": eos,
                "pad_token_id": pad,
                "max_length": max_length,
                "window_overlap": 64,
            },
            indent=2,
        )
    )
    (path / "calibration.json").write_text(
        json.dumps(
            {
                "temperature": {"choice": 1.3, "score": 1.1, "set": 1.05, "span": 0.4},
                "thresholds": {"set:*": 0.3, "span:*": 0.5, "span:halu": 0.55, "span:toxic": 0.1},
                "pii_types": ["EMAIL_ADDRESS", "PERSON", "PHONE_NUMBER"],
                "pii_length_rule": {
                    "anchors": [{"n_tokens": 21, "threshold": 0.75}, {"n_tokens": 1022, "threshold": 0.005919}]
                },
                "pii_sparse_gate": {"K": 3, "t_sparse": 0.1, "probe_threshold": 0.5},
            },
            indent=2,
        )
    )
    for name in PYTHON_FILES:
        (path / name).write_text('raise RuntimeError("the worker must never import the package code")\n')
    return path
