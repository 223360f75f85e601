"""Clef's prompt: every question of a request in ONE sequence, laid out as `encode_record` of Clef's
`joint_schema_model.py` does, with the token spans its joint head pools.

    <|im_start|>system\\n{SYSTEM}<|im_end|>\\n<|im_start|>user\\nSTATE:\\n   (prefix)
    <|vision_start|><|image_pad|>*n<|vision_end|> per image, then \\n     (media: only with images)
    {state}                                                              (text as is, else compact sorted JSON)
    \\n\\nSCHEMA FIELDS:\\n
    per question n:  \\nFIELD n\\nID: {id}\\nTYPE: {type}\\nINSTRUCTION: [instructions]\\nALLOWED OPTIONS:\\n
                     per option k:  OPTION k: [{"description":..,"option_id":..}]\\n      then END FIELD\\n
    \\n<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\nJOINT SCHEMA DECISIONS:   (suffix)

Each piece is tokenised on its own (no special tokens added) and the ids are concatenated; [..] are the
pooled spans. Options: noul `true`, `false` (Clef's default descriptions unless the criteria give one),
choice by sorted option id, score "0".."n-1" described by its levels. The state is cut to what the schema
leaves of `max_length` (the schema itself never is: over the limit it is a 422).

Images: Clef's record carries them beside the state, and `encode_record` puts them, processor-expanded, after
the prefix, then a newline. Here they are the images the state names, in the order it names them; the state
is rendered as sent, its references included (they are what names each image for the model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ...loading.vision import placed_images
from ...prompt.builder import ChatPromptBuilder, PreparedRequest, ids_key

SYSTEM_PROMPT = (
    "Read the complete state and schema. Decide every field jointly. Each answer must be exactly one "
    "of that field's allowed options."
)
PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\nSTATE:\n"
SUFFIX = "\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nJOINT SCHEMA DECISIONS:"
TEMPLATE_TOKENS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>")
TYPE_IDS = {"noul": 0, "choice": 1, "score": 2}
NOUL_DEFAULTS = {
    "true": "The proposition is true or the answer is yes.",
    "false": "The proposition is false or the answer is no.",
}


def render(value: object) -> str:
    """Text as sent; anything else as compact JSON with sorted keys (Clef's rendering, not the envelope's)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def options_of(question) -> list[tuple[str, object]]:
    """(option id, description or None) in Clef's order."""
    if question.type == "noul":
        described = dict(NOUL_DEFAULTS)
        if question.criteria is not None:  # what the request sent, an explicit null included, replaces the default
            described.update({key: getattr(question.criteria, key) for key in question.criteria.model_fields_set})
        return [(key, described[key]) for key in ("true", "false")]
    if question.type == "choice":
        return sorted(question.criteria.items())
    return [(str(i), level) for i, level in enumerate(question.criteria)]


@dataclass(frozen=True)
class JointField:
    """One question's place in the sequence: its type id, instructions span and option spans (end exclusive)."""

    type_id: int
    question: tuple[int, int]
    options: tuple[tuple[int, int], ...]
    option_ids: tuple[str, ...]


@dataclass(frozen=True)
class JointPlan:
    """The envelope's plan (questions in request order, one answer row each) plus the joint layout."""

    questions: tuple
    state: object
    fields: tuple[JointField, ...]
    state_tokens: int  # the state's tokens kept (after the cut to max_length)


class ClefBuilder(ChatPromptBuilder):
    """Lays a whole request out as one sequence. The envelope hands `prepare` one placeholder row per
    question and its plan (the questions and the state as sent); the state text the service rendered
    is not used, since Clef renders the state its own way."""

    max_length = 16384
    max_state_tokens: int | None = None

    def _pieces(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def prepare(self, state_text, rows, image_keys=(), plan=None) -> PreparedRequest:
        images = placed_images(state_text, image_keys)
        texts = ["\n\nSCHEMA FIELDS:\n"]
        marks = []  # per question: (index of its instructions piece, indices of its option pieces)
        for number, q in enumerate(plan.questions, 1):
            question = q.question
            instructions = question.instructions
            texts.append(f"\nFIELD {number}\nID: {q.qid}\nTYPE: {question.type}\nINSTRUCTION: ")
            texts.append(render(q.qid if instructions is None or instructions == "" else instructions))
            at = len(texts) - 1
            texts.append("\nALLOWED OPTIONS:\n")
            option_at = []
            for k, (option_id, description) in enumerate(options_of(question), 1):
                semantics = {"option_id": option_id}
                if description is not None:
                    semantics["description"] = description
                texts += [f"OPTION {k}: ", render(semantics), "\n"]
                option_at.append(len(texts) - 2)
            texts.append("END FIELD\n")
            marks.append((at, option_at))
        prefix, suffix, state, *schema_pieces = self._pieces([PREFIX, SUFFIX, render(plan.state)] + texts)
        if images:
            prefix = prefix + [i for piece in self._pieces(images + ["\n"]) for i in piece]
        starts, schema = [], []
        for piece in schema_pieces:
            starts.append(len(schema))
            schema += piece
        fixed = len(prefix) + len(schema) + len(suffix)
        if fixed > self.max_length:
            raise ValueError(
                f"the schema needs {fixed} tokens before the state; at most {self.max_length} "
                "tokens fit (Clef's max_length)"
            )
        if self.max_state_tokens is not None:
            state = state[: self.max_state_tokens]
        state = state[: self.max_length - fixed]
        offset = len(prefix) + len(state)

        def span(piece: int) -> tuple[int, int]:
            start = offset + starts[piece]
            return start, start + len(schema_pieces[piece])

        fields = []
        for q, (at, option_at) in zip(plan.questions, marks):
            option_ids = tuple(option_id for option_id, _ in options_of(q.question))
            fields.append(
                JointField(TYPE_IDS[q.question.type], span(at), tuple(span(i) for i in option_at), option_ids)
            )
            if any(end <= start for start, end in (fields[-1].question, *fields[-1].options)):
                raise ValueError(f"questions[{q.qid!r}]: an instruction or option renders to no tokens")
        ids = tuple(prefix + state + schema + suffix)
        joint = JointPlan(plan.questions, plan.state, tuple(fields), len(state))
        return PreparedRequest(
            prefix_ids=(),
            rows=(ids,),
            row_labels=((),),
            image_keys=tuple(image_keys),
            prefix_key=ids_key(f"{self.identity}|clef|{','.join(image_keys)}|", ids),
            plan=joint,
        )
