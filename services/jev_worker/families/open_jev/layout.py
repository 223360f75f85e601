"""Open-Jev's prompts, as its request compiler writes them (Zefan-Cai/Open-Jev `jev/api.py` `compile_request` /
`candidate_prompts`, reference @ 3308a15; ported literally in ThinkFlowLab/system1-omni
`src/models/open_jev/native/src/contract.rs` and checked against its golden `tests/open_jev/data/contract.json`).

Every candidate is its own sequence, one user turn of the chat template with thinking off, no system prompt:

    Context:\\n{state}\\n\\nQuestion: {question}\\n  then
      choice / score:  Proposed answer: {option}\\nIs this proposed answer correct? Answer Yes or No.
      noul:            Is the answer to this question yes? Answer Yes or No.
    ...<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n   (the head reads the last token)

Text is used as sent; any other value as `json.dumps(value, ensure_ascii=False, sort_keys=True)` with the default
separators (upstream's `render`). The template trims the user message (`|trim`), which never changes it: it
starts with `Context:` and ends with `No.`. A candidate longer than `max_length` tokens (4096, the native export's
default) is refused, never truncated.
"""

from __future__ import annotations

import json

from jev_common.checkpoint_files import ServingError
from jev_common.errors import UnreadableInput
from jev_common.recipe import PromptSpec

from ...prompt.builder import ChatPromptBuilder, PreparedRequest, RowSpec, family_prompt

CONTEXT = "Context:\n{state}\n\n"
QUESTION = "Question: {question}\n"
CANDIDATE = "Proposed answer: {option}\nIs this proposed answer correct? Answer Yes or No."
NOUL = "Is the answer to this question yes? Answer Yes or No."
NOUL_CRITERIA = "\nYes means: {true}\nNo means: {false}"
MAX_LENGTH = 4096
PROMPT = PromptSpec(
    system=None,
    use_chat_template=True,
    chat_template_kwargs={"enable_thinking": False},
    state_block=CONTEXT,
    question_block=QUESTION,
)


def render(value: object) -> str:
    """Text as sent; an object or array as upstream's sorted JSON (NaN and Infinity refused, as upstream does)."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, sort_keys=True, allow_nan=False)
    except ValueError:
        raise UnreadableInput("Open-Jev reads no NaN or Infinity in a value") from None


class OpenJevBuilder(ChatPromptBuilder):
    """The state block is `Context:` with the state rendered as Open-Jev renders it; every candidate row over
    `max_length` tokens (the whole sequence) is refused."""

    def __init__(self, tokenizer, recipe, identity: str, *, max_length: int = MAX_LENGTH):
        if not getattr(tokenizer, "chat_template", None):
            raise ServingError(
                "Open-Jev renders every candidate with the checkpoint's chat template; its tokenizer has none"
            )
        super().__init__(tokenizer, family_prompt(recipe, PROMPT, "open-jev"), identity)
        self.max_length = max_length

    def prepare(
        self, state_text: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        prepared = super().prepare(render(plan.state) if plan is not None else state_text, rows, image_keys, plan)
        longest = len(prepared.prefix_ids) + max(len(row) for row in prepared.rows)
        if longest > self.max_length:
            raise UnreadableInput(
                f"Input length {longest} exceeds max_length={self.max_length}; "
                "no silent truncation (Open-Jev refuses a longer candidate)"
            )
        return prepared
