"""jemm-labels: JEMM's own System One contract (ypcypc/JEMM `jemm/systemone.py`, `jemm/contract.py`,
`jemm/model.py`), on the causal-lm backend with its LM-head label rows.

Every question, whatever its type, is one single-choice request over candidates (`candidates_for`):
- choice: the criteria in request order, each shown by its description only (names never enter the prompt;
  a null description is an empty line); noul: `yes` (criteria.true, else "yes"), `no` (criteria.false, else
  "no"), answer P(yes); score: the levels (a null one is "level i"), score = sum(i * p_i).
The row, with the recipe's prompt (system prompt, `enable_thinking: false`, state block `{state}\\n\\n`):

    user: [each image] "State:\\n" STATE.strip() "\\n\\nQuestion: " QUESTION "\\n\\nCandidates:\\n"
          "A) candidate" ... "\\n\\nAnswer with exactly one candidate label."

whitespace runs in the question and candidates collapsed to one space; a non-text state is compact JSON
(unsorted keys), as JEMM renders it. Labels are A..Z then 0..5 (2 to 32 candidates); the logits of their
first tokens at the last position, softmax at `decision_config.json`'s `temperature` (text) or
`mm_temperature` (with images), JEMM's own defaults where the file lacks them. Images: the ones the state
names, in order, before the text (JEMM's `images` precede it); the state keeps its references as written.
As JEMM does, more than four images, or a prompt over 8192 tokens (3072 with images), is refused.
"""

from __future__ import annotations

import json
import os
import re
from abc import abstractmethod
from dataclasses import dataclass

import torch

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.schema import ChoiceAnswer, NoulAnswer, ScoreAnswer, choice_answer, score_answer

from ...engine.head import DecisionHead
from ...loading.vision import placed_images
from ...prompt.builder import ChatPromptBuilder, PreparedRequest, RowSpec
from ...protocols import QuestionKind
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout

LABELS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ012345"
ANSWER = "Answer with exactly one candidate label."
TEMPERATURE = 1.3480874159655591  # jemm/model.py, used when decision_config.json has none
CONFIG = "decision_config.json"
MAX_IMAGES, MAX_TOKENS, MAX_IMAGE_TOKENS = 4, 8192, 3072  # JEMM refuses more (systemone.py, contract.py)
_WS = re.compile(r"\s+")


def flat(text: str) -> str:
    return _WS.sub(" ", text or "").strip()


def description(spec) -> str:
    """A criterion's text as JEMM reads it: an object's `description`, None as empty, anything else str()."""
    if isinstance(spec, dict):
        return str(spec.get("description", ""))
    return "" if spec is None else str(spec)


def _parameter_names(params) -> list[str]:
    if not isinstance(params, dict):
        return []
    props = params.get("properties", params) if isinstance(params.get("properties"), dict) else params
    required = set(params.get("required", [])) if isinstance(params.get("required", []), list) else set()
    names = []
    for key, spec in props.items():
        if key in {"properties", "required", "type"} and not isinstance(spec, dict):
            continue
        piece = key
        if isinstance(spec, dict):
            if key in required:
                piece += "*"
            default = spec.get("default")
            if default not in (None, ""):
                piece += "=" + flat(str(default))[:24]
        names.append(piece)
    return names


def candidate_text(spec) -> str:
    """A candidate line's text; a tool action (`action.tool_name`) shows its tool as JEMM renders tools."""
    text = description(spec)
    action = spec.get("action") if isinstance(spec, dict) else None
    if not (isinstance(action, dict) and "tool_name" in action):
        return flat(text)
    try:
        tool = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return flat(text)
    if not isinstance(tool, dict) or "name" not in tool:
        return flat(text)
    out = flat(str(tool.get("name", "")))
    summary = flat(str(tool.get("description", "")))
    if summary:
        out += " \u2014 " + summary
    names = _parameter_names(tool.get("parameters"))
    return out + (" | params: " + ", ".join(names) if names else "")


def state_text(state) -> str:
    return state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))


@dataclass(frozen=True)
class JemmPlan:
    """The envelope's plan and how many images the request shows (they change the temperature)."""

    questions: tuple
    state: object
    images: int


class JemmBuilder(ChatPromptBuilder):
    def prepare(
        self, state: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        images = placed_images(state, image_keys)
        if len(images) > MAX_IMAGES:
            raise ValueError(f"the state names {len(images)} images; JEMM reads at most {MAX_IMAGES}")
        raw = plan.state if plan is not None else state
        text = "".join(images) + "State:\n" + state_text(raw).strip()
        jemm = JemmPlan(plan.questions, plan.state, len(images)) if plan is not None else None
        prepared = super().prepare(text, rows, image_keys, jemm)
        limit = MAX_IMAGE_TOKENS if images else MAX_TOKENS
        longest = len(prepared.prefix_ids) + max(len(row) for row in prepared.rows)
        if longest > limit:
            raise ValueError(
                f"a question's prompt is {longest} tokens; JEMM reads at most {limit}{' with images' if images else ''}"
            )
        return prepared


class _Candidates(QuestionKind):
    """A question as JEMM's one single-choice request; subclasses say what its candidates are."""

    def __init__(self, readout: JemmLabels):
        self.readout = readout

    @abstractmethod
    def candidates(self, question) -> list[str]: ...

    def rows(self, question, ctx: BuildContext, where: str) -> list[RowSpec]:
        texts = self.candidates(question)
        codes, ids = ctx.builder.coded(len(texts))
        # upstream's `str(question.get("instructions", ""))` (systemone.py): absent is empty, an explicit null "None"
        asked = str(question.instructions) if "instructions" in question.model_fields_set else ""
        lines = [f"{code}) {text}" for code, text in zip(codes, texts)]
        content = f"Question: {flat(asked)}\n\nCandidates:\n" + "\n".join(lines) + f"\n\n{ANSWER}"
        ctx.builder.check_user_text(content, where)
        return [RowSpec(content, ids)]

    def probabilities(self, logits, ctx: BuildContext) -> list[float]:
        temperature = self.readout.mm_temperature if ctx.plan.images else self.readout.temperature  # a JemmPlan
        return torch.softmax(logits[0].to(torch.float32) / temperature, -1).tolist()


class JemmChoice(_Candidates):
    type = "choice"

    def candidates(self, question) -> list[str]:
        return [candidate_text(spec) for spec in question.criteria.values()]

    def answer(self, question, logits, ctx: BuildContext) -> ChoiceAnswer:
        probs = self.probabilities(logits, ctx)
        names = list(question.criteria)
        return choice_answer(names, probs)


class JemmNoul(_Candidates):
    type = "noul"

    def candidates(self, question) -> list[str]:
        criteria = question.criteria
        yes = description(None if criteria is None else criteria.true) or "yes"
        no = description(None if criteria is None else criteria.false) or "no"
        return [flat(yes), flat(no)]

    def answer(self, question, logits, ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=self.probabilities(logits, ctx)[0])


class JemmScore(_Candidates):
    type = "score"

    def candidates(self, question) -> list[str]:
        return [flat(description(level) or f"level {i}") for i, level in enumerate(question.criteria)]

    def answer(self, question, logits, ctx: BuildContext) -> ScoreAnswer:
        probs = self.probabilities(logits, ctx)
        return score_answer(question.criteria, probs)


class JemmLabels(StandardReadout):
    name = "jemm-labels"
    question_types = frozenset({"choice", "noul", "score"})
    needs_lm_head = True
    temperature: float | None = None  # decision_config.json's (JEMM's default without it), once loaded
    mm_temperature: float | None = None  # with images
    calibration_source: str | None = None

    def prompt_builder(self, tokenizer, recipe, identity: str) -> JemmBuilder:
        return JemmBuilder(tokenizer, recipe, identity)

    def load(self, loaded, builder) -> None:
        if builder.codes != list(LABELS):
            raise ServingError(
                f"readout {self.name!r} needs the recipe's verbalizer labels {LABELS!r} without "
                "two-letter codes (JEMM's candidate labels)"
            )
        path = os.path.join(loaded.folder, CONFIG)
        config = read_json(path) if os.path.isfile(path) else {}
        for key in ("temperature", "mm_temperature"):
            value = config.get(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0):
                raise ServingError(f"{CONFIG}: {key} must be a positive number, got {value!r}")
        self.temperature = float(config.get("temperature", TEMPERATURE))
        self.mm_temperature = float(config.get("mm_temperature", self.temperature))
        self.calibration_source = CONFIG if config else None
        self.head = DecisionHead(loaded.model, loaded.folder)
        self.kinds = {kind.type: kind for kind in (JemmChoice(self), JemmNoul(self), JemmScore(self))}

    def describe(self) -> dict:
        calibration = None
        if self.temperature is not None:
            calibration = {
                "source": self.calibration_source,
                "temperature": self.temperature,
                "mm_temperature": self.mm_temperature,
            }
        return {"readout": self.name, "question_types": sorted(self.question_types), "calibration": calibration}
