"""LFM2.5's prompt, token by token, as system1-omni's LFM2 engine builds it (`src/models/lfm2/engine.py`:
`Engine.prompt`, `Engine.score`; `worker.py`: `build_schema`).

A question is a one-field JSON extraction: the system turn is the fixed instruction plus the question's schema,
the user turn is the state as sent, the assistant turn the chat template's generation prompt plus `{\\n`. Each
option key is a candidate value of the `answer` field:

    ids = encode(template(system, state) + "{\\n") + encode('  "answer": ') + encode(json.dumps(key) + "\\n")

the three pieces tokenised ON THEIR OWN (without special tokens) and concatenated, as upstream does: never one
pass over the whole text. The value tokens are the row's labels (what the head scores).

One request's questions each have their own prefill (the question is in the system turn, before the state), so
each question is its own prefix group (`prefix_groups`, the pipeline prepares and runs each on its own): its
prefix is the question's whole prompt (kept in L3 under its own key) and its rows are the candidates'
`'  "answer": '` + value tokens, which is what upstream's engine runs (one prefill forked per candidate batch).
Prepared together, several questions' rows follow what their prompts share (the same token ids, unsplit).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from jev_common.checkpoint_files import ServingError
from jev_common.control_tokens import ControlTokens

from ...prompt.builder import PreparedRequest, RowSpec, _common_prefix_length, ids_key
from ...protocols import PromptBuilder

SYSTEM_HEAD = (
    "Extract the attributes from the text. Return only a JSON object matching this schema. "
    "Use the exact allowed values. No explanation or markdown.\n"
)
FIELD = "answer"
FIELD_SUFFIX = "  " + json.dumps(FIELD, ensure_ascii=False) + ": "  # '  "answer": '
ASSISTANT_OPEN = "{\n"


def schema(instructions, criteria: dict) -> dict:
    """worker.build_schema: one string field whose enum is the option keys (request order) and whose
    description is the instructions and criteria as a JSON string."""
    description = json.dumps({"instructions": instructions, "criteria": criteria}, ensure_ascii=False)
    return {
        "type": "object",
        "properties": {FIELD: {"type": "string", "description": description, "enum": list(criteria)}},
        "required": [FIELD],
        "additionalProperties": False,
    }


def system_prompt(instructions, criteria: dict) -> str:
    return SYSTEM_HEAD + json.dumps(schema(instructions, criteria), ensure_ascii=False)


def candidate_value(key: str) -> str:
    return json.dumps(key, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class CandidateRow(RowSpec):
    """One candidate: `content` is its question's system prompt, `value` the JSON value it scores."""

    value: str = ""


class Lfm2Builder(PromptBuilder):
    """The checkpoint's own chat template around upstream's system and user turns; no recipe layout."""

    def __init__(self, tokenizer, recipe, identity: str):
        super().__init__(
            tokenizer,
            recipe,
            identity,
            controls=ControlTokens.of(
                tokenizer, hint="the model's template cannot carry it as text; remove it from the request"
            ),
        )
        if not recipe.prompt.use_chat_template or not tokenizer.chat_template:
            raise ServingError(
                f"recipe {recipe.name}: LFM2.5's contract renders its turns with the checkpoint's "
                "chat template (prompt.use_chat_template, and a tokenizer that has one)"
            )
        self.suffix = tuple(self.encode(FIELD_SUFFIX))

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def prompt_text(self, system: str, state: str) -> str:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": state}]
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + ASSISTANT_OPEN

    def prefix_groups(self, questions: dict) -> list[dict]:
        """One group per question: each question's prompt (its schema in the system turn, then the state) is its
        own prefill."""
        return [{qid: question} for qid, question in questions.items()]

    def prepare(
        self, state_text: str, rows: list[CandidateRow], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        runs: list[tuple[str, list[CandidateRow]]] = []  # consecutive rows of one system prompt (a question)
        for row in rows:
            if runs and runs[-1][0] == row.content:
                runs[-1][1].append(row)
            else:
                runs.append((row.content, [row]))
        parts = []
        for system, candidates in runs:
            prefix = tuple(self.encode(self.prompt_text(system, state_text)))
            values = [tuple(self.encode(row.value)) for row in candidates]
            parts.append(
                PreparedRequest(
                    prefix_ids=prefix,
                    rows=tuple(self.suffix + v for v in values),
                    row_labels=tuple(values),
                    image_keys=(),
                    prefix_key=self._key(prefix),
                )
            )
        shared = _common_prefix_length([part.prefix_ids for part in parts])
        prefix = parts[0].prefix_ids[:shared]
        return PreparedRequest(
            prefix_ids=prefix,
            rows=tuple(part.prefix_ids[shared:] + row for part in parts for row in part.rows),
            row_labels=tuple(labels for part in parts for labels in part.row_labels),
            image_keys=tuple(image_keys),
            prefix_key=self._key(prefix),
            plan=plan,
        )

    def _key(self, prefix: tuple[int, ...]) -> str:
        return ids_key(f"{self.identity}|lfm2|", prefix)
