"""decider-labels: Decider-2B v11's own System One contract on the causal-lm backend, its LM-head label rows.

After Mapika/decider 50d0be0 (`systemone.py` render_question / assemble, `model.py` slot_logits, `temperature.py`)
and its native port ThinkFlowLab/system1-omni `src/models/decider/native/src/` (`contract.rs`, `processing.rs`,
`config.rs`, `math.rs`). Rows are prompt.py's. Per question type:

- choice: options in request order, `name` or `name: description` (a description that is not a string as JSON);
  probabilities = softmax(label logits / T_choice).
- noul: options `no[: criteria.false]`, `yes[: criteria.true]`; noul = P(B). Without instructions the question is
  "Which answer fits the context?", allowed only when criteria.true or criteria.false is described.
- score: one row per level, each the noul-shaped question "TEXT\\nProposed answer: LEVEL\\nDoes the proposed answer
  fit?" (LEVEL without a leading "N:"), fit_k = P(B) at T_score; probabilities = fit / sum(fit) (1e-9 when 0).

Label logits are the FP32 product of the final hidden state and the label rows, rounded to BF16 as upstream's BF16
projection returns them, then divided by the type's temperature (`decider_config.json`: `temperature`, and
`temperature_by_type` where it names the type; each rounded to FP32) and softmaxed in FP32.
A choice or score without instructions is refused, as upstream refuses an absent one (422).
"""

from __future__ import annotations

import math
import os
import re

import torch

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.errors import UnreadableInput
from jev_common.schema import ChoiceAnswer, NoulAnswer, ScoreAnswer, choice_answer, score_answer

from ...engine.head import DecisionHead
from ...loading.checkpoint import Requirement
from ...protocols import QuestionKind
from ...questions.base import BuildContext
from ...readouts.calibration import Calibration
from ...readouts.standard import StandardReadout
from .prompt import DeciderBuilder, DeciderRow, text

CONFIG = "decider_config.json"
TYPES = ("choice", "noul", "score")
NOUL_WITHOUT_INSTRUCTIONS = "Which answer fits the context?"
ISOLATED = "{question}\nProposed answer: {level}\nDoes the proposed answer fit?"
_LEVEL_NUMBER = re.compile(r"^\s*-?\d+\s*:\s*")  # "2: somewhat" -> "somewhat" (Python's Unicode \s and \d)


def _fp32(value, what: str) -> float:
    """A positive temperature as upstream materialises it: FP32, finite and > 0."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise ServingError(f"{CONFIG}: {what} must be numeric, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServingError(f"{CONFIG}: {what} must be numeric, got {value!r}")
    rounded = torch.tensor(float(value), dtype=torch.float32).item()
    if not (math.isfinite(value) and value > 0 and math.isfinite(rounded) and rounded > 0):
        raise ServingError(f"{CONFIG}: {what} must be finite and positive in FP32, got {value!r}")
    return rounded


def read_config(folder: str) -> dict[str, float]:
    """The temperature of each question type from the released `decider_config.json` (config.rs checks)."""
    config = read_json(os.path.join(folder, CONFIG))
    if not isinstance(config, dict):
        raise ServingError(f"{CONFIG}: expected a JSON object")
    wanted = {"version": "2b-v11", "layout": "plain"}
    for key, value in wanted.items():
        if config.get(key) != value:
            raise ServingError(
                f"{CONFIG}: {key} must be {value!r} (Decider-2B v11's plain layout), got {config.get(key)!r}"
            )
    for key, value in (
        ("chat_template", False),
        ("schema_first", False),
        ("schema_first_trained", False),
        ("neutralize_none", False),
        ("isolated_levels", True),
    ):
        if key in config and config[key] is not value:
            raise ServingError(f"{CONFIG}: unsupported {key}: expected {str(value).lower()}")
    for key in ("neutralize_none", "isolated_levels", "temperature"):
        if key not in config:
            raise ServingError(f"{CONFIG}: missing {key}")
    for key, value in (("max_options", 255), ("max_state_tokens", 32768)):
        if isinstance(config.get(key), bool) or config.get(key) != value or not isinstance(config.get(key), int):
            raise ServingError(f"{CONFIG}: unsupported option/state limits ({key} must be {value})")
    for key in ("temperature_by_options", "temperature_schema_first", "temperature_schema_first_by_type"):
        if key in config:
            raise ServingError(f"{CONFIG}: unsupported calibration {key}")
    fallback = _fp32(config["temperature"], "temperature")
    temperatures = dict.fromkeys(TYPES, fallback)
    by_type = config.get("temperature_by_type")
    if by_type is not None:
        if not isinstance(by_type, dict):
            raise ServingError(f"{CONFIG}: temperature_by_type must be an object")
        for key, value in by_type.items():
            if key not in TYPES:
                raise ServingError(f"{CONFIG}: unknown calibration type {key!r}")
            if isinstance(value, str):
                raise ServingError(f"{CONFIG}: temperature_by_type.{key} must be numeric")
            temperatures[key] = _fp32(value, f"temperature_by_type.{key}")
    return temperatures


class DeciderHead(DecisionHead):
    """The label rows' FP32 logits rounded to BF16, as upstream's BF16 projection (`F.linear(h, W).float()`)."""

    def logits(self, hidden: torch.Tensor, label_ids: tuple[int, ...]) -> torch.Tensor:
        return super().logits(hidden, label_ids).to(torch.bfloat16).to(torch.float32)


def question_text(question, where: str) -> str:
    """The question's text (`render_question`), or UnreadableInput where upstream refuses it."""
    raw = question.instructions
    if question.type == "noul" and raw in (None, ""):
        criteria = question.criteria
        if criteria is None or all(d in (None, "") for d in (criteria.true, criteria.false)):
            raise UnreadableInput(f"{where}: noul question without instructions: criteria must describe true or false")
        return NOUL_WITHOUT_INSTRUCTIONS
    if raw is None or not text(raw):
        raise UnreadableInput(
            f"{where}: question without instructions (Decider answers no {question.type} without them)"
        )
    return text(raw)


def described(name: str, description) -> str:
    return name if description in (None, "") else f"{name}: {text(description)}"


def probabilities(logits: torch.Tensor) -> list[float]:
    return torch.softmax(logits.to(torch.float32), -1).tolist()


class DeciderChoice(QuestionKind):
    type = "choice"

    def rows(self, question, ctx: BuildContext, where: str) -> list[DeciderRow]:
        options = [described(name, d) for name, d in question.criteria.items()]
        return [ctx.builder.row(question_text(question, where), options)]

    def answer(self, question, logits, ctx: BuildContext) -> ChoiceAnswer:
        return choice_answer(list(question.criteria), probabilities(logits[0]))


class DeciderNoul(QuestionKind):
    type = "noul"

    def rows(self, question, ctx: BuildContext, where: str) -> list[DeciderRow]:
        criteria = question.criteria
        options = [
            described("no", None if criteria is None else criteria.false),
            described("yes", None if criteria is None else criteria.true),
        ]
        return [ctx.builder.row(question_text(question, where), options)]

    def answer(self, question, logits, ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=probabilities(logits[0])[1])


class DeciderScore(QuestionKind):
    type = "score"

    def rows(self, question, ctx: BuildContext, where: str) -> list[DeciderRow]:
        asked = question_text(question, where)
        return [
            ctx.builder.row(ISOLATED.format(question=asked, level=_LEVEL_NUMBER.sub("", text(level))), ["no", "yes"])
            for level in question.criteria
        ]

    def answer(self, question, logits, ctx: BuildContext) -> ScoreAnswer:
        fit = [probabilities(row)[1] for row in logits]
        mass = sum(fit) or 1e-9
        return score_answer([text(level) for level in question.criteria], [f / mass for f in fit])


class DeciderLabels(StandardReadout):
    """On the causal-lm backend (the protocol's default) with its own prompt builder; no chat template."""

    name = "decider-labels"
    question_types = frozenset(TYPES)
    needs_lm_head = True

    def prompt_builder(self, tokenizer, recipe, identity: str) -> DeciderBuilder:
        return DeciderBuilder(tokenizer, recipe, identity)

    def requirements(self) -> list[Requirement]:
        return [Requirement(CONFIG)]

    def check(self, folder: str) -> None:
        super().check(folder)
        read_config(folder)

    def load(self, loaded, builder) -> None:
        prompt = builder.recipe.prompt
        if prompt.use_chat_template or prompt.system:
            raise ServingError(
                f"readout {self.name!r} reads Decider's plain text: the recipe must set "
                "prompt.use_chat_template false and no prompt.system"
            )
        self.head = DeciderHead(loaded.model, loaded.folder)
        self.serve(
            [DeciderChoice(), DeciderNoul(), DeciderScore()], Calibration(read_config(loaded.folder), source=CONFIG)
        )
