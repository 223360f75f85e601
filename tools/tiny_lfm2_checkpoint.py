"""A tiny random-weight LFM2.5 checkpoint in LiquidAI/LFM2.5-350M's on-disk layout, for tests.

What `save_pretrained` of the real `Lfm2ForCausalLM` writes: `config.json` (model_type `lfm2`, `layer_types`
mixing `conv` and `full_attention`, `conv_L_cache` 3, tied embeddings, bos 1 / eos 7 / pad 0 in the real one),
`generation_config.json`, `model.safetensors`, the tokenizer files and `chat_template.jinja`. No calibration
file (the release ships none, and the contract reads none).

The tokenizer is the real SmolLM2 one (tools.tiny_checkpoints) with LFM2's special tokens where the contract
touches them: `<|startoftext|>` as the bos token (the chat template writes it first, and the prompt is
encoded without adding special tokens, so the template's text is what puts it there), `<|pad|>` as the pad
token, `<|im_start|>` / `<|im_end|>` (SmolLM2 has them) around every turn, eos `<|im_end|>`. The chat
template is LFM2's documented shape: `<|startoftext|>`, ChatML turns, `<|im_start|>assistant\\n` as the
generation prompt, no default system prompt and no thinking switch.
"""

from __future__ import annotations

import os
from pathlib import Path

from tools.tiny_checkpoints import smollm2_tokenizer

BOS, PAD = "<|startoftext|>", "<|pad|>"
LFM2_CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- set ns = namespace(system_prompt='') -%}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set ns.system_prompt = messages[0]['content'] -%}{%- set messages = messages[1:] -%}"
    "{%- endif -%}"
    "{%- if ns.system_prompt -%}{{- '<|im_start|>system\n' + ns.system_prompt + '<|im_end|>\n' -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def lfm2_tokenizer():
    """SmolLM2's tokenizer with LFM2's bos / pad special tokens and chat template."""
    from transformers import AddedToken

    tokenizer = smollm2_tokenizer()
    tokenizer.add_special_tokens(
        {
            "bos_token": AddedToken(BOS, special=True, normalized=False),
            "pad_token": AddedToken(PAD, special=True, normalized=False),
            "eos_token": "<|im_end|>",
        }
    )
    tokenizer.chat_template = LFM2_CHAT_TEMPLATE
    return tokenizer


def make_tiny_lfm2(path: str | os.PathLike, *, seed: int = 0, hidden: int = 64, output_std: float = 0.6) -> Path:
    """An `Lfm2ForCausalLM` (conv, attention, conv, attention; width `hidden`) with random weights. The tied
    embedding matrix is drawn wider than the default init (`output_std`) so candidates' likelihoods differ."""
    import torch
    from transformers import GenerationConfig, Lfm2Config, Lfm2ForCausalLM

    path = Path(path)
    tokenizer = lfm2_tokenizer()
    config = Lfm2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        conv_L_cache=3,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Lfm2ForCausalLM(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0.0, output_std)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
