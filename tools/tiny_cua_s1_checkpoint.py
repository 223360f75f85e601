"""A tiny random-weight Cua-S1 4B 0.2 screenshot checkpoint, in the layout recipes/cua-s1-4b-0.2-screenshot's
export serves: a merged Qwen3.5 vision-language model (Qwen3_5ForConditionalGeneration, `config.json`,
`model.safetensors`) with its processor files (Qwen3VLProcessor, patch 16, merge 2) and tokenizer, no
calibration file (the contract reads none). Built on tools.tiny_checkpoints.make_tiny_qwen3_5_vl (SmolLM2's
tokenizer plus the Qwen vision tokens; A..Z are single tokens).

The chat template is Qwen3.5-shaped where the contract depends on it, so a test can tell a right prompt from a
wrong one: a message whose content is a list renders an image item as `<|vision_start|><|image_pad|><|vision_end|>`
and a text item as its text, with no separator; every message's content is trimmed; the generation prompt is
`<|im_start|>assistant\\n<think>\\n`, or `<think>\\n\\n</think>\\n\\n` after it only when `enable_thinking` is false
(which upstream never passes).
"""

from __future__ import annotations

import os
from pathlib import Path

QWEN35_SHAPED_TEMPLATE = (
    "{%- macro render(content) -%}{%- if content is string -%}{{- content -}}{%- else -%}"
    "{%- for item in content -%}"
    "{%- if item['type'] == 'image' or 'image' in item -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif 'text' in item -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}{%- endmacro -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' + (render(message['content']) | trim) + '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}"
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{- '<think>\n\n</think>\n\n' -}}"
    "{%- else -%}{{- '<think>\n' -}}{%- endif -%}{%- endif -%}"
)


def make_tiny_cua_s1_screenshot(path: str | os.PathLike, *, seed: int = 0) -> Path:
    """-> the checkpoint folder (tokenizer and processor read `chat_template.jinja`)."""
    from tools.tiny_checkpoints import make_tiny_qwen3_5_vl

    folder = make_tiny_qwen3_5_vl(path, seed=seed)
    (folder / "chat_template.jinja").write_text(QWEN35_SHAPED_TEMPLATE, encoding="utf-8")
    return folder
