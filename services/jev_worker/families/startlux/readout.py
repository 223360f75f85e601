"""startlux-labels: StartLux-Decision's own System One contract (StartLux Instant 4B = StartLux-Decision-4B), on the
causal-lm backend with its LM-head letter rows.

After StartLux-Decision `startlux_decision/jevfmt.py` (jev_render_v3; Dilrevx/StartLux-Decision@d351f80b, the
official repository's index lacks the file) and `startlux_decision/model.py`
(StartLuxLabs/StartLux-Decision@7a8ce8d0). Every question is one prompt: the recipe's system prompt (upstream's
SYSTEM), the user message below, the chat template's generation prompt with `enable_thinking: false` (it must end
in the empty think block), tokenised in one pass:

    "Evidence:\\n" STATE "\\n\\nQuestion: " INSTRUCTIONS "\\nOptions:\\n" "A) body" "\\nB) body" ...

STATE: a text state as sent, an object or array as Python's json.dumps with `_index` on arrays of 8+ items,
`(none)` when blank. Options lettered A..Z in request order: choice `name: description` (the name alone when it
has no description or one equal to it; the description alone when every name is a bare id such as A, 1, (b),
opt3); noul `yes[: criteria.true]`, `no[: criteria.false]`, noul = P(A); score `0: level`, `1: level`, ...
Probabilities: softmax(letter logits / decision_config.json's temperature_by_type[type]) in FP32, the logits the
FP32 final hidden state times the FP32 letter rows. Refused (422), as upstream: a choice or score without
instructions, more than 26 options in one prompt (upstream answers a longer choice with knockout rounds, several
passes), a bad option id, a prompt over 262,144 tokens.
"""

from __future__ import annotations

import json
import os
import re
from abc import abstractmethod

import torch

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.errors import TooManyOptions, UnreadableInput
from jev_common.schema import ChoiceAnswer, NoulAnswer, ScoreAnswer, choice_answer, score_answer
from jev_common.state_text import indexed_json

from ...engine.head import DecisionHead
from ...loading.checkpoint import Requirement
from ...prompt.builder import ChatPromptBuilder, PreparedRequest, RowSpec
from ...protocols import QuestionKind
from ...questions.base import BuildContext
from ...readouts.calibration import Calibration
from ...readouts.standard import StandardReadout

CONFIG = "decision_config.json"
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
THINK_OFF_SUFFIX = "<think>\n\n</think>\n\n"
NOUL_DEFAULT_INSTRUCTIONS = "Which answer fits the evidence?"
MAX_LENGTH = 262144  # StartLuxDecision(max_length=262144)
MAX_ID_CHARS = 200
_BARE = re.compile(r"^(?:\(?[A-Za-z][\).]?|\(?\d{1,3}[\).]?|option[_ ]?\d{1,3}|opt[_ ]?\d{1,3})$", re.I)


def value_text(value) -> str | None:
    """A string or its JSON text, stripped; None when absent or blank."""
    if value is None:
        return None
    text = (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).strip()
    return text or None


def evidence(state) -> str:
    """The state as the prompt shows it (`state_text`, then `(none)` for a blank one)."""
    if isinstance(state, str):
        text = state
    else:
        text = "" if state in (None, {}, []) else indexed_json(state)
    return text if text.strip() else "(none)"


def _norm(text) -> str:
    return re.sub(r"[\s_\-]+", " ", str(text)).strip().lower()


def option_lines(type_: str, options: list[tuple[str, str | None]]) -> list[str]:
    hide = type_ == "choice" and all(_BARE.match(i) for i, _ in options) and all(c for _, c in options)
    lines = []
    for letter, (option_id, criterion) in zip(LETTERS, options):
        name = ("yes" if option_id == "true" else "no") if type_ == "noul" else option_id
        if hide:
            body = criterion
        elif criterion is None or not criterion.strip() or _norm(criterion) == _norm(name):
            body = name
        else:
            body = f"{name}: {criterion}"
        lines.append(f"{letter}) {body}")
    return lines


class StartLuxBuilder(ChatPromptBuilder):
    """The recipe's chat template around `Evidence:` + the state as StartLux renders it (from the plan's state)."""

    def prepare(
        self, state: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        prepared = super().prepare(evidence(plan.state if plan is not None else state), rows, image_keys, plan)
        longest = len(prepared.prefix_ids) + max(len(row) for row in prepared.rows)
        if longest > MAX_LENGTH:
            raise UnreadableInput(f"a question's prompt is {longest} tokens; StartLux reads at most {MAX_LENGTH}")
        return prepared


class _Lettered(QuestionKind):
    """A question as one lettered prompt; subclasses say what its options are."""

    @abstractmethod
    def options(self, question) -> list[tuple[str, str | None]]:
        """(id, criterion) per option, in prompt order."""

    def instructions(self, question, where: str) -> str:
        text = value_text(question.instructions)
        if text is None:
            raise UnreadableInput(f"{where}: instructions required (StartLux answers no {question.type} without them)")
        return text

    def rows(self, question, ctx: BuildContext, where: str) -> list[RowSpec]:
        options = self.options(question)
        if len(options) > len(LETTERS):
            raise TooManyOptions(
                f"{where}: StartLux reads at most {len(LETTERS)} options in one prompt (upstream "
                "answers longer choice lists with knockout rounds, several passes this worker does not run)"
            )
        for option_id, _ in options:
            if not option_id.strip() or "\n" in option_id or "\r" in option_id or len(option_id) > MAX_ID_CHARS:
                raise UnreadableInput(
                    f"{where}: bad option id {option_id!r} (StartLux ids are one line of at most "
                    f"{MAX_ID_CHARS} characters)"
                )
        content = (
            f"Question: {self.instructions(question, where)}\nOptions:\n" + "\n".join(option_lines(self.type, options))
        ).rstrip()  # the template trims the message
        ctx.builder.check_user_text(content, where)
        return [RowSpec(content, ctx.builder.coded(len(options))[1])]

    @staticmethod
    def probabilities(logits) -> list[float]:
        return torch.softmax(logits[0].to(torch.float32), -1).tolist()


class StartLuxChoice(_Lettered):
    type = "choice"

    def options(self, question) -> list[tuple[str, str | None]]:
        return [(name, value_text(description)) for name, description in question.criteria.items()]

    def answer(self, question, logits, ctx: BuildContext) -> ChoiceAnswer:
        return choice_answer(list(question.criteria), self.probabilities(logits))


class StartLuxNoul(_Lettered):
    type = "noul"

    def options(self, question) -> list[tuple[str, str | None]]:
        criteria = question.criteria
        return [
            ("true", None if criteria is None else value_text(criteria.true)),
            ("false", None if criteria is None else value_text(criteria.false)),
        ]

    def instructions(self, question, where: str) -> str:
        return value_text(question.instructions) or NOUL_DEFAULT_INSTRUCTIONS

    def answer(self, question, logits, ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=self.probabilities(logits)[0])


class StartLuxScore(_Lettered):
    type = "score"

    def options(self, question) -> list[tuple[str, str | None]]:
        return [(str(i), value_text(level)) for i, level in enumerate(question.criteria)]

    def answer(self, question, logits, ctx: BuildContext) -> ScoreAnswer:
        return score_answer(question.criteria, self.probabilities(logits))


def letter_ids(builder: ChatPromptBuilder) -> list[int]:
    """jevfmt.check_tokenizer: the prompt ends in the empty think block, and every letter is one token that a prompt
    followed by it tokenises to the prompt's ids plus that token."""
    probe = "Evidence:\ns\n\nQuestion: q\nOptions:\n" + "\n".join(
        option_lines("noul", [("true", None), ("false", None)])
    )
    text = builder.layout.head + probe + builder.layout.tail
    if not text.endswith(THINK_OFF_SUFFIX):
        raise ServingError(
            "StartLux's prompt must end in the thinking-off assistant prefix "
            f"{THINK_OFF_SUFFIX!r}: the recipe's chat_template_kwargs need enable_thinking: false"
        )
    tokenizer = builder.tokenizer
    ids = tokenizer.encode(text, add_special_tokens=False)
    letters = []
    for letter in LETTERS:
        token = tokenizer.encode(letter, add_special_tokens=False)
        if len(token) != 1 or tokenizer.encode(text + letter, add_special_tokens=False) != ids + token:
            raise ServingError(f"letter {letter!r} is not a separate single token after StartLux's prompt")
        letters.append(token[0])
    if len(set(letters)) != len(LETTERS):
        raise ServingError("StartLux's letter ids are not distinct")
    return letters


class StartLuxLabels(StandardReadout):
    """On the causal-lm backend (the protocol's default) with the recipe's chat template."""

    name = "startlux-labels"
    question_types = frozenset({"choice", "noul", "score"})
    needs_lm_head = True

    def prompt_builder(self, tokenizer, recipe, identity: str) -> StartLuxBuilder:
        return StartLuxBuilder(tokenizer, recipe, identity)

    def requirements(self) -> list[Requirement]:
        return [Requirement(CONFIG, ("letter_token_ids", "temperature_by_type"))]

    def load(self, loaded, builder) -> None:
        if builder.codes != list(LETTERS) or builder.recipe.prompt.state_block != "Evidence:\n{state}\n\n":
            raise ServingError(
                f"readout {self.name!r} needs the recipe's verbalizer labels {LETTERS!r} without "
                "two-letter codes and prompt.state_block 'Evidence:\\n{state}\\n\\n'"
            )
        letters = letter_ids(builder)
        if letters != read_json(os.path.join(loaded.folder, CONFIG))["letter_token_ids"] or letters != list(
            builder.code_ids
        ):
            raise ServingError("tokenizer letter ids differ from decision_config.json")
        self.head = DecisionHead(loaded.model, loaded.folder)
        self.serve([StartLuxChoice(), StartLuxNoul(), StartLuxScore()], Calibration.from_file(loaded.folder, CONFIG))
