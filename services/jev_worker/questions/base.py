"""What every question type is given: the context its rows are built in and its answer is computed in.

A question type is one module with one `protocols.QuestionKind` subclass; `registry.py` names them.
Logits arrive in FP32 (one tensor per row, over that row's label tokens); answers are computed in FP32.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from jev_common.recipe import PromptSpec
from jev_common.state_text import render_state

from ..protocols import PromptBuilder

render_content = render_state  # the envelope's name for the one state renderer


@dataclass(frozen=True)
class BuildContext:
    builder: PromptBuilder
    state: object  # the request's state as sent (span questions locate candidates in it)
    plan: object = None  # when answering: the prepared request's plan (a readout's own, e.g. its image count)
    coherence: str = "off"  # the request's x_coherence: how a kind that offers it lays out and reads its rows

    @property
    def prompt(self) -> PromptSpec:
        return self.builder.recipe.prompt

    def default_question(self, type_: str) -> str:
        """The recipe's question for a question of `type_` sent without instructions (span and set read as
        choice and noul)."""
        prompt = self.prompt
        return {
            "noul": prompt.default_noul_question,
            "set": prompt.default_noul_question,
            "choice": prompt.default_choice_question,
            "span": prompt.default_choice_question,
            "score": prompt.default_score_question,
        }[type_]

    def user_text(self, value: object, where: str) -> str:
        """Render a user-supplied value and refuse it if it carries the model's control tokens."""
        text = render_state(value)
        self.builder.check_user_text(text, where)
        return text

    def instructions(self, question, where: str) -> str:
        """The question's instructions as checked user text, or the recipe's default question of its type."""
        if question.instructions is None:
            return self.default_question(question.type)
        return self.user_text(question.instructions, f"{where}.instructions")

    def criteria(self, question, where: str) -> list[tuple[str, str | None]]:
        """(name, description as checked user text, or None) of a choice or set question's criteria, in order."""
        out = []
        for name, description in question.criteria.items():
            self.builder.check_user_text(name, f"{where}.criteria")
            out.append(
                (name, None if description is None else self.user_text(description, f"{where}.criteria[{name!r}]"))
            )
        return out

    def question_line(self, question, where: str) -> str:
        return self.prompt.question_block.format(question=self.instructions(question, where))


def probabilities(logits: torch.Tensor) -> list[float]:
    """Softmax over a row's label logits (FP32 values, exact as Python floats), in double precision: for the handful
    of labels a row has, this is a few microseconds where a torch call costs tens on the event loop."""
    values = logits.tolist()
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = math.fsum(weights)
    return [w / total for w in weights]
