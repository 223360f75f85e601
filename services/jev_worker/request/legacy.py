"""The single-question form of the JEV-VL worker contract (`kind`, `state`, `question`, `options`), as a thin
adapter: the served family says how it asks one (`Readout.single_question`, a `SingleQuestionForm`), the
pipeline (pipeline.py) runs the job like any envelope, and the form's fields are read from the typed answer.

The default (`QuestionForm`, every label-token recipe) asks each kind as the System One question it is
(questions/); its state is text, an image, or both (the image first, then a newline, then the text):

| kind | asked as | fields |
|---|---|---|
| choice | a choice over the options | probabilities, argmax |
| span | a span over the options | probabilities, argmax, its place in state.text |
| set | a set of the options (one yes/no row each) | P(yes) each, normalised; selected >= 0.5 |
| noul | a choice over the options + the verbalizer's "None of these" | none wins: choice null |
| score | numeric levels (questions/numeric.py) | probabilities, argmax, sum(value * p) |

A family with its own single-question contract (JEV-VL: families/jev_vl/) answers it its own way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence

from jev_common.errors import validation_error
from jev_common.schema import ChoiceQuestion, DecisionRequest, DecisionResponse, SetQuestion, SpanQuestion, State, Usage

from ..prompt.builder import PreparedRequest
from ..protocols import SingleQuestionForm
from ..questions.numeric import NumericLevels, NumericQuestion
from ..questions.plan import rows_for
from ..questions.registry import QUESTION_KINDS
from .job import ImageSlot, Job

QID = "question"
FORM_KINDS = {"numeric": NumericLevels()}  # kinds the form asks beyond the System One types


def as_question(request: DecisionRequest, noul_option: str):
    """The System One question (or numeric levels) that asks what the single-question request asks."""
    options = request.options or []  # the form's validation requires options for every kind asked this way
    names = dict.fromkeys(options)
    if request.kind == "noul" and noul_option in names:
        raise validation_error(
            f"option {noul_option!r} is what kind 'noul' adds for none of the options; name it otherwise", ("options",)
        )
    if request.kind == "choice":
        return ChoiceQuestion.model_construct(type="choice", instructions=request.question, criteria=names)
    if request.kind == "noul":
        return ChoiceQuestion.model_construct(
            type="choice", instructions=request.question, criteria={**names, noul_option: None}
        )
    if request.kind == "span":
        return SpanQuestion.model_construct(type="span", instructions=request.question, criteria=list(options))
    if request.kind == "set":
        return SetQuestion.model_construct(type="set", instructions=request.question, criteria=names)
    return NumericQuestion(instructions=request.question, options=tuple(options))


def fields(request: DecisionRequest, answer) -> dict:
    """The form's response fields from the question's typed answer."""
    options = list(request.options or [])
    if request.kind == "set":
        yes = [answer.probabilities[o] for o in options]
        total = sum(yes)
        best = max(range(len(yes)), key=yes.__getitem__)
        return {
            "probabilities": [p / total for p in yes] if total > 0 else [1.0 / len(yes)] * len(yes),
            "choice_index": best,
            "choice": options[best],
            "yes_probabilities": yes,
            "selected": [options.index(name) for name in answer.selected],
        }
    probs = list(answer.probabilities.values()) if isinstance(answer.probabilities, dict) else answer.probabilities
    if request.kind == "noul":
        noul, option_probs = probs[-1], probs[:-1]
        best = max(range(len(option_probs)), key=option_probs.__getitem__)
        won = noul < option_probs[best]
        return {
            "probabilities": option_probs,
            "choice_index": best if won else None,
            "choice": options[best] if won else None,
            "noul": noul,
        }
    best = max(range(len(probs)), key=probs.__getitem__)
    out = {"probabilities": probs, "choice_index": best, "choice": options[best]}
    if request.kind == "score":
        out["score"] = answer.score
    elif request.kind == "span":
        out["span"] = answer.span
    return out


def _state_text(request: DecisionRequest) -> str:
    """The text of the form's `{text, image}` state (QuestionForm.job refuses the other forms)."""
    state = request.state
    return (state.text or "") if isinstance(state, State) else ""


def l1_key(request: DecisionRequest, image_keys: tuple[str, ...]) -> str:
    """Identifies a request's prompt: everything but request_id and deadline."""
    payload = request.model_dump_json(include={"kind", "question", "options"}) + "|" + _state_text(request)
    return hashlib.sha256(("legacy|" + payload + "|" + ",".join(image_keys)).encode()).hexdigest()


class QuestionForm(SingleQuestionForm):
    """Each kind asked as the System One question it is (the table above); `noul_option` is the recipe's
    verbalizer's name for none of the options."""

    def __init__(self, noul_option: str):
        self.noul_option = noul_option

    def job(self, request: DecisionRequest, image_key: Callable[[str], str] | None) -> Job:
        state = request.state
        if not isinstance(state, State):
            raise validation_error(
                "this model reads the single-question form's state as text or {text, image}; "
                "a list of parts or another JSON object is JEV-VL's form: send the System One "
                "envelope ({model, state, questions})",
                ("state",),
            )
        if request.options is None:
            raise validation_error(f"kind {request.kind!r} needs options for this model (2 to 255)", ("options",))
        key = image_key(state.image) if state.image and image_key is not None else None
        keys = (key,) if key else ()
        text = state.text or ""
        pieces = ((ImageSlot(key), "\n") if key else ()) + (text,)
        return Job(
            questions={QID: as_question(request, self.noul_option)},
            state=text,
            pieces=pieces,
            where="state.text",
            route_text=text,
            route_images=keys,
            l1_key=l1_key(request, keys),
            extra_kinds=FORM_KINDS,
            has_images=state.image is not None,
        )

    def fields(self, request: DecisionRequest, answer) -> dict:
        return fields(request, answer)


def response(
    request: DecisionRequest, model: str, fields: dict, prompt_tokens: int, cached_tokens: int, elapsed: float
) -> DecisionResponse:
    """The form's response from its fields (SingleQuestionForm.fields)."""
    return DecisionResponse(
        request_id=request.request_id,
        kind=request.kind,
        model=model,
        usage=Usage(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens),
        elapsed_seconds=elapsed,
        **fields,
    )


# ----- for tests and benchmarks: the form's rows and prompt with a builder, as the pipeline makes them ----
def legacy_rows(request: DecisionRequest, builder):
    """(rows, plan) of a single-question request."""
    question = as_question(request, builder.recipe.verbalizer.noul_option)
    return rows_for({QID: question}, _state_text(request), builder, {**QUESTION_KINDS, **FORM_KINDS})


def legacy_state_text(request: DecisionRequest, image_placeholders: Sequence[str]) -> str:
    return "".join(p + "\n" for p in image_placeholders) + _state_text(request)


def prepare_legacy(
    builder, request: DecisionRequest, image_placeholders: Sequence[str] = (), image_keys: tuple[str, ...] = ()
) -> PreparedRequest:
    rows, plan = legacy_rows(request, builder)
    return builder.prepare(legacy_state_text(request, list(image_placeholders)), rows, tuple(image_keys), plan)
