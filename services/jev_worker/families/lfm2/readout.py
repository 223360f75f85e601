"""lfm2-json-values: LFM2.5-350M as system1-omni serves it (`src/models/lfm2/worker.py`, `engine.py`, adapted
upstream from the LFM2.5-350M-RLCD engine): not next-token letters, a JSON-extraction prompt per question whose
candidate values are the option keys, each scored by its log-likelihood.

Per question (prompt.py): the system turn is upstream's instruction and a one-field schema (`answer`, enum =
the option keys in request order, description = `{"instructions", "criteria"}` as a JSON string); the user turn
is the state as sent; the assistant turn is the chat template's generation prompt plus `{\\n`. A candidate's
score is the sum over its value tokens (`json.dumps(key)` + `\\n`, after `'  "answer": '`) of their FP32
log-probabilities over the full vocabulary; probabilities are the softmax of the scores (no length
normalisation, no temperature, no calibration file). Choice only, as upstream: noul and score are 422; the state
must be non-empty text and the instructions present (upstream refuses object / array / blank states and null
or missing instructions); at most 255 options (the API's limit too).
"""

from __future__ import annotations

import math

from jev_common.checkpoint_files import ServingError
from jev_common.errors import ForwardFailed, UnreadableInput
from jev_common.schema import ChoiceAnswer, ChoiceQuestion, SystemOneRequest, choice_confidence

from ...protocols import QuestionKind
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout
from .backend import Lfm2Values, ValueLogProbHead
from .prompt import CandidateRow, Lfm2Builder, candidate_value, system_prompt

# worker.py Worker.warmup's request (e0ef7a29): the worker is ready after one decision of its own kind
WARMUP = {
    "state": "A customer requests a refund for a duplicate charge.",
    "questions": {
        "routing": {
            "type": "choice",
            "instructions": "Choose the responsible team.",
            "criteria": {"billing": "Refunds and charges", "technical": "Software issues"},
        }
    },
}


def softmax(scores: list[float]) -> list[float]:
    """worker.softmax: in Python floats, shifted by the largest score; non-finite scores are an error."""
    if not all(math.isfinite(s) for s in scores):
        raise ForwardFailed("LFM2.5 returned non-finite candidate scores")
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


class Lfm2Choice(QuestionKind):
    type = "choice"
    min_options = 1  # upstream's enum takes 1 to 255 values
    # no coherence mode: the options' order is the schema's enum in the system turn, before the state, so every
    # permutation would pay a whole state prefill (nothing after the prefix to vary)
    coherence_note = (
        "the options are listed in the system turn before the state (LFM2.5's contract), so each "
        "permutation would pay a whole state prefill: no coherence mode is offered"
    )

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[CandidateRow]:
        if not isinstance(ctx.state, str) or not ctx.state.strip():
            raise UnreadableInput(
                "state: LFM2.5's contract reads a non-empty text state (an object, array or "
                "blank state is refused, as upstream refuses it)"
            )
        if question.instructions is None:
            raise UnreadableInput(
                f"{where}.instructions: LFM2.5's contract needs instructions (a string, object "
                "or array); upstream refuses null or missing instructions"
            )
        system = system_prompt(question.instructions, dict(question.criteria))
        ctx.builder.check_user_text(system, where)
        return [CandidateRow(system, (), value=candidate_value(key)) for key in question.criteria]

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        scores = [float(x) for x in logits]
        probabilities = softmax(scores)
        names = list(question.criteria)
        best = max(range(len(scores)), key=scores.__getitem__)  # worker.py: argmax of the scores, ties first
        return ChoiceAnswer(
            choice=names[best],
            probabilities=dict(zip(names, probabilities)),
            confidence=choice_confidence(probabilities),
        )


class Lfm2JsonValues(StandardReadout):
    """On the family's lfm2-values backend (causal-lm with per-question prefills and value-token scoring)."""

    name = "lfm2-json-values"
    question_types = frozenset({"choice"})
    needs_lm_head = True

    def make_backend(self) -> Lfm2Values:
        return Lfm2Values()

    def prompt_builder(self, tokenizer, recipe, identity: str) -> Lfm2Builder:
        return Lfm2Builder(tokenizer, recipe, identity)

    def load(self, loaded, builder) -> None:
        if builder.recipe.prompt.system:
            raise ServingError(
                f"readout {self.name!r} builds LFM2.5's own system turn (the question's schema); "
                "the recipe must not set prompt.system"
            )
        self.head = ValueLogProbHead(loaded.model)
        self.kinds = {"choice": Lfm2Choice()}

    def warmup_request(self, request: SystemOneRequest) -> SystemOneRequest:
        return SystemOneRequest.model_validate({"model": request.model, **WARMUP})

    def describe(self) -> dict:
        return {
            "readout": self.name,
            "question_types": sorted(self.question_types),
            "calibration": {"source": None, "temperature": 1.0},
        }
