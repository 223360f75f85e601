"""The code-readout v1 prompt, for families whose upstream writes it (pplx-decider, D3): one sequence per
question, a system turn and a user turn, the chat template with thinking off:

    system: {system}
    user:   State:\\n{state}\\n\\nQuestion:\\n{instructions}\\n\\nOptions:\\n{code}: {option}\\n...\\n\\n{closing}

It is Perplexity's `decision_messages` (pplx-decider `autojev/model.py`); D3's prompt module (`d3_format.py`
`user_prompt`, `messages`) writes the same lines with its own system prompt and closing line. Each family's
`CodePrompt` holds its upstream's text (families/<family>/). Values are `describe`d as upstream does: text as
sent, anything else `json.dumps(ensure_ascii=False)` (default separators, keys in request order). Instructions
that are missing or empty take the default question (`instructions or default`). Options:
- choice: `name` or `name: description`, in request order;
- score: each level (`describe(level)`); the answer's score is sum(i * p_i);
- noul: `false` then `true`, each `describe(criteria.false or "No / false")` / `describe(criteria.true or
  "Yes / true")`; the answer is P(true).
The head scores the question's codes (readouts/code_readout.py); a prompt longer than the family's limit is
refused, never truncated.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from jev_common.checkpoint_files import ServingError
from jev_common.errors import UnreadableInput
from jev_common.recipe import PromptSpec
from jev_common.schema import (
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    choice_answer,
    score_answer,
)

from ..prompt.builder import ChatPromptBuilder, PreparedRequest, RowSpec, family_prompt
from ..protocols import QuestionKind
from ..questions.base import BuildContext
from .code_readout import CodeReadout

STATE = "State:\n{state}\n\n"
DEFAULT_QUESTION = "Choose the best matching option."
NOUL_OPTIONS = ("No / false", "Yes / true")


@dataclass(frozen=True)
class CodePrompt:
    """A family's code-readout v1 prompt text (its upstream's)."""

    family: str
    system: str
    closing: str
    empty_state: str | None = None  # what an empty text state reads as (None: as sent)
    distinct_levels: bool = False  # score levels must be distinct and non-empty (else 422)

    def user_row(self, instructions: str, options: list[str], codes: list[str]) -> str:
        listing = "\n".join(f"{code}: {text}" for code, text in zip(codes, options))
        return f"Question:\n{instructions}\n\nOptions:\n{listing}\n\n{self.closing}"


def describe(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class CodePromptBuilder(ChatPromptBuilder):
    """The family's system turn and `State:` block around each question's row; refuses a prompt over
    `max_length` tokens (None: no limit of the family's own)."""

    def __init__(self, tokenizer, recipe, identity: str, prompt: CodePrompt, max_length: int | None):
        if not getattr(tokenizer, "chat_template", None):
            raise ServingError(
                f"{prompt.family} renders every question with the checkpoint's chat template; its tokenizer has none"
            )
        spec = PromptSpec(
            system=prompt.system,
            use_chat_template=True,
            chat_template_kwargs={"enable_thinking": False},
            state_block=STATE,
        )
        super().__init__(tokenizer, family_prompt(recipe, spec, prompt.family), identity)
        self.prompt = prompt
        self.max_length = max_length

    def state_text(self, state: object) -> str:
        if state == "" and self.prompt.empty_state is not None:
            return self.prompt.empty_state
        return describe(state)

    def prepare(
        self, state_text: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        text = self.state_text(plan.state) if plan is not None else state_text
        prepared = super().prepare(text, rows, image_keys, plan)
        longest = len(prepared.prefix_ids) + max(len(row) for row in prepared.rows)
        if self.max_length is not None and longest > self.max_length:
            raise UnreadableInput(
                f"a question's prompt is {longest} tokens, over {self.prompt.family}'s limit of "
                f"{self.max_length}; no input was truncated"
            )
        return prepared

    def check_codes_after_prompt(self) -> None:
        """Each code stays its one token right after the generation prompt (upstream's `answer_codes` check)."""
        prefix = self.layout.head + "Choose an option." + self.layout.tail
        ids = self.tokenizer.encode(prefix, add_special_tokens=False)
        for code in self.codes:
            if self.tokenizer.encode(prefix + code, add_special_tokens=False) != ids + [self.single_token(code)]:
                raise ServingError(f"answer code {code!r} does not stay one token after the chat prompt")


class _Coded(QuestionKind):
    """A question as one row listing its options under the codes; its answer from their probabilities."""

    def __init__(self, prompt: CodePrompt):
        self.prompt = prompt

    @abstractmethod
    def options(self, question, ctx: BuildContext, where: str) -> list[str]:
        """The option texts, in code order."""

    def rows(self, question, ctx: BuildContext, where: str) -> list[RowSpec]:
        asked = describe(question.instructions) if question.instructions else DEFAULT_QUESTION
        ctx.builder.check_user_text(asked, f"{where}.instructions")
        options = self.options(question, ctx, where)
        codes, ids = ctx.builder.coded(len(options))
        return [RowSpec(self.prompt.user_row(asked, options, codes), ids)]

    @staticmethod
    def probabilities(logits) -> list[float]:
        return torch.softmax(logits[0].to(torch.float32), dim=-1).tolist()

    @staticmethod
    def checked(text: str, ctx: BuildContext, where: str) -> str:
        ctx.builder.check_user_text(text, where)
        return text


class CodedChoice(_Coded):
    type = "choice"

    def options(self, question: ChoiceQuestion, ctx, where) -> list[str]:
        return [
            self.checked(name if value is None else f"{name}: {describe(value)}", ctx, f"{where}.criteria[{name!r}]")
            for name, value in question.criteria.items()
        ]

    def answer(self, question: ChoiceQuestion, logits, ctx) -> ChoiceAnswer:
        return choice_answer(list(question.criteria), self.probabilities(logits))


class CodedScore(_Coded):
    type = "score"

    def options(self, question: ScoreQuestion, ctx, where) -> list[str]:
        levels = [
            self.checked(describe(level), ctx, f"{where}.criteria[{i}]") for i, level in enumerate(question.criteria)
        ]
        if self.prompt.distinct_levels and (not all(levels) or len(set(levels)) != len(levels)):
            raise UnreadableInput(
                f"{where}.criteria: {self.prompt.family} needs score levels that are distinct and non-empty"
            )
        return levels

    def answer(self, question: ScoreQuestion, logits, ctx) -> ScoreAnswer:
        return score_answer(question.criteria, self.probabilities(logits))


class CodedNoul(_Coded):
    type = "noul"

    def options(self, question: NoulQuestion, ctx, where) -> list[str]:
        given = question.criteria
        sides = (None, None) if given is None else (given.false, given.true)
        return [
            self.checked(describe(side or default), ctx, f"{where}.criteria")
            for side, default in zip(sides, NOUL_OPTIONS)
        ]

    def answer(self, question: NoulQuestion, logits, ctx) -> NoulAnswer:
        return NoulAnswer(noul=self.probabilities(logits)[1])


class CodePromptReadout(CodeReadout):
    """A code-readout v1 checkpoint served with its family's own prompt (`prompt`): choice, score and noul; the
    family says its token limit (`limit`, from the checkpoint's files)."""

    prompt: ClassVar[CodePrompt]
    question_types = frozenset({"choice", "score", "noul"})
    max_length: int | None = None  # the family's limit for this checkpoint, once `check` has read it

    @abstractmethod
    def limit(self, folder: str, config: dict) -> int | None:
        """The most tokens a question's prompt may have (None: no limit of the family's own)."""

    def check(self, folder: str) -> None:
        super().check(folder)
        self.max_length = self.limit(folder, self.config)

    def prompt_builder(self, tokenizer, recipe, identity: str) -> CodePromptBuilder:
        return CodePromptBuilder(tokenizer, recipe, identity, self.prompt, self.max_length)

    def question_kinds(self) -> list[QuestionKind]:
        return [CodedChoice(self.prompt), CodedScore(self.prompt), CodedNoul(self.prompt)]

    def load(self, loaded, builder) -> None:
        super().load(loaded, builder)
        builder.check_codes_after_prompt()

    def describe(self) -> dict:
        return {**super().describe(), "max_length": self.max_length}
