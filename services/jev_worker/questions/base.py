"""What every question type implements: its rows after the state prefix, and its answer from their logits.

A question type is one module with one object satisfying `QuestionKind`; `registry.py` names them.
Logits arrive in FP32 (one tensor per row, over that row's label tokens); answers are computed in FP32.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

import torch
from pydantic import BaseModel

from jev_common.recipe import PromptSpec

from ..prompt import PromptBuilder, RowSpec


def render_content(value: object) -> str:
    """Text as sent; objects and arrays as compact JSON text (non-ASCII kept as is)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class BuildContext:
    builder: PromptBuilder
    state: object  # the request's state as sent (span questions locate candidates in it)
    plan: object = None  # when answering: the prepared request's plan (a readout's own, e.g. its image count)

    @property
    def prompt(self) -> PromptSpec:
        return self.builder.recipe.prompt

    def user_text(self, value: object, where: str) -> str:
        """Render a user-supplied value and refuse it if it carries the model's control tokens."""
        text = render_content(value)
        self.builder.check_user_text(text, where)
        return text

    def question_line(self, question, default: str, where: str) -> str:
        text = default if question.instructions is None else self.user_text(question.instructions, f"{where}.instructions")
        return self.prompt.question_block.format(question=text)


def probabilities(logits: torch.Tensor) -> list[float]:
    return torch.softmax(logits.to(torch.float32), dim=-1).tolist()


class QuestionKind(Protocol):
    type: str

    def rows(self, question, ctx: BuildContext, where: str) -> list[RowSpec]: ...

    def answer(self, question, logits: list[torch.Tensor], ctx: BuildContext) -> BaseModel: ...
