"""A tiny random Qwen3.5 checkpoint whose chat template renders a conversation as the real Qwen3.5 one does,
for families whose upstream renders `apply_chat_template(..., enable_thinking=False)` (Open-Jev, pplx-decider,
D3).

The template is the part of Qwen3.5's `chat_template.jinja` those families use, written the same way: every
message's content (a string, or a list of image and text items) rendered and then `|trim`med, as
`<|im_start|>{role}\\n{content}<|im_end|>\\n`, and the generation prompt `<|im_start|>assistant\\n` followed by
`<think>\\n\\n</think>\\n\\n` when `enable_thinking` is false, else `<think>\\n` (the real template's last
lines). The tokenizer is SmolLM2's plus the Qwen vision tokens and `<think>` / `</think>` (added, not
special, as in Qwen's tokenizer): tools.tiny_checkpoints and tools.tiny_clef_checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path

QWEN3_5_CHAT_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{- content -}}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for item in content -%}"
    "{%- if 'image' in item or 'image_url' in item or item.type == 'image' -%}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in item -%}{{- item.text -}}{%- endif -%}"
    "{%- endfor -%}"
    "{%- elif content is none or content is undefined -%}{{- '' -}}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{%- set content = render_content(message.content)|trim -%}"
    "{{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}"
    "{%- else -%}{{- '<think>\n' -}}{%- endif -%}"
    "{%- endif -%}"
)


def set_chat_template(path: str | os.PathLike) -> None:
    """Give the checkpoint in `path` (tokenizer and, when saved, processor) the Qwen3.5-style template."""
    from transformers import AutoTokenizer

    path = Path(path)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = QWEN3_5_CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    template = path / "chat_template.jinja"
    if template.is_file():  # the processor's copy (transformers writes one file for both)
        template.write_text(QWEN3_5_CHAT_TEMPLATE, encoding="utf-8")


def make_tiny_qwen3_5_chat(path: str | os.PathLike, *, seed: int = 0, hidden: int = 64, **layout) -> Path:
    """A Qwen3_5ForConditionalGeneration (three Gated DeltaNet layers, one gated full-attention layer, a tiny
    vision tower: tools.tiny_checkpoints.make_tiny_qwen3_5_vl) with `<think>` / `</think>` and the Qwen3.5-style
    chat template: the layout of the Qwen/Qwen3.5 base checkpoints (`model.language_model.*`, `model.visual.*`,
    `lm_head.weight`); `layout` as make_tiny_qwen3_5_vl takes it (e.g. `layer_types`)."""
    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl
    from tools.tiny_clef_checkpoint import add_think_tokens

    path = Path(make_tiny_qwen3_5_vl(path, seed=seed, hidden=hidden, **layout))
    add_think_tokens(path)
    set_chat_template(path)
    return path
