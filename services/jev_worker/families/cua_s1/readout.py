"""cua-s1-labels: Cua-S1 4B 0.2's text-adapter contract (system1-omni `src/models/cua_s1/text/contract.py` and
`model.py`, after trycua/cua `libs/cua-s1/python/src/cua_s1/four_b.py`), on the causal-lm backend.

Choice questions only (Cua-S1 answers no noul or score: 422), 1 to 26 options. One row per question, the
whole user message after the recipe's system prompt, the chat template's generation prompt, no thinking
kwargs:

    ["Goal: " GOAL "\\n\\n"]  "App: Cua Driver\\nTask family: closed-candidate decision\\n\\n"
    "Accessibility tree:\\n" STATE "\\n\\nOptions:\\n" ('A. Decision "LABEL" -> select' per option, by lines)
    "\\n\\nAnswer with a single letter."

GOAL is the instructions (no line when they are null), STATE the state (an object or array as Python's
`json.dumps(ensure_ascii=False)` writes it), LABEL an option's description (its name when null) JSON-escaped
without the quotes. Probabilities: a float32 softmax over the option letters' logits at the last position
(no temperature), read from the LM-head rows in FP32. The question comes before the state, so only the
template head is shared between questions (the recipe's state block is empty).
"""

from __future__ import annotations

import json

import torch

from jev_common.checkpoint_files import ServingError
from jev_common.errors import UnreadableInput
from jev_common.schema import ChoiceAnswer, ChoiceQuestion, choice_answer
from jev_common.state_text import render_state

from ...engine.head import DecisionHead
from ...prompt.builder import RowSpec
from ...protocols import QuestionKind
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def user_message(goal: str, state_block: str, codes: list[str], labels: list[str]) -> str:
    """The user message of both adapters' contracts; `state_block` is what shows the state (the accessibility
    tree, or the screenshot line after the image)."""
    options = "\n".join(f'{code}. Decision "{label}" -> select' for code, label in zip(codes, labels))
    return (
        (f"Goal: {goal}\n\n" if goal else "")
        + "App: Cua Driver\nTask family: closed-candidate decision\n\n"
        + f"{state_block}Options:\n{options}\n\nAnswer with a single letter."
    )


def option_sources(question: ChoiceQuestion) -> list[str]:
    """What each option shows: its description as text, its name when the description is null."""
    return [name if value is None else render_state(value) for name, value in question.criteria.items()]


def escaped(source: str) -> str:
    """An option's text JSON-escaped without the quotes, as upstream lists it."""
    return json.dumps(source, ensure_ascii=False)[1:-1]


class CuaChoice(QuestionKind):
    """The text adapter's choice: the state as the accessibility tree."""

    type = "choice"
    min_options = 1  # upstream answers 1 to 26 options

    def state_block(self, ctx: BuildContext, where: str) -> str:
        if ctx.state in ("", {}, []):
            raise UnreadableInput(f"{where}: Cua-S1 reads no empty state")
        return f"Accessibility tree:\n{render_state(ctx.state)}\n\n"

    def texts(self, question: ChoiceQuestion, where: str) -> tuple[str, list[str]]:
        """(goal, option labels): the instructions as text (no Goal line when null), the escaped labels."""
        goal = "" if question.instructions is None else render_state(question.instructions)
        return goal, [escaped(source) for source in option_sources(question)]

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        codes, ids = ctx.builder.coded(len(question.criteria))
        goal, labels = self.texts(question, where)
        content = user_message(goal, self.state_block(ctx, where), codes, labels)
        ctx.builder.check_user_text(content, where)
        return [RowSpec(content, ids)]

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        return choice_answer(list(question.criteria), torch.softmax(logits[0].to(torch.float32), -1).tolist())


class CuaS1Labels(StandardReadout):
    """On the causal-lm backend with the recipe's chat template (the protocol's defaults)."""

    name = "cua-s1-labels"
    question_types = frozenset({"choice"})
    needs_lm_head = True
    choice = CuaChoice  # the question type answered (the screenshot adapter's shows the image instead of the tree)

    def load(self, loaded, builder) -> None:
        if builder.codes != list(LETTERS) or builder.recipe.prompt.state_block != "":
            raise ServingError(
                f"readout {self.name!r} needs the recipe's verbalizer labels {LETTERS!r} without "
                "two-letter codes and an empty prompt.state_block (the question precedes the state)"
            )
        self.head = DecisionHead(loaded.model, loaded.folder)
        self.kinds = {"choice": self.choice()}

    def describe(self) -> dict:
        return {
            "readout": self.name,
            "question_types": sorted(self.question_types),
            "calibration": {"source": None, "temperature": 1.0},
        }
