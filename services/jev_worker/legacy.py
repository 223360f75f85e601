"""The single-question form of the JEV-VL worker contract (`kind`, `state`, `question`, `options`), as a thin
adapter: each kind is asked as the System One question it is (questions/), and the typed answer is read
back into the form's fields. The pipeline (pipeline.py) runs it like any envelope.

| kind | asked as | fields |
|---|---|---|
| choice | a choice over the options | probabilities, argmax |
| span | a span over the options | probabilities, argmax, its place in state.text |
| set | a set of the options (one yes/no row each) | P(yes) each, normalised; selected >= 0.5 |
| noul | a choice over the options + the verbalizer's "None of these" | none wins: choice null |
| score | numeric levels (questions/numeric.py) | probabilities, argmax, sum(value * p) |
"""
from __future__ import annotations

import hashlib

from jev_common.errors import validation_error
from jev_common.schema import ChoiceQuestion, DecisionRequest, DecisionResponse, SetQuestion, SpanQuestion, Usage

from .envelope import rows_for
from .pipeline import ImageSlot, Job
from .prompt import PreparedRequest
from .questions.numeric import NumericLevels, NumericQuestion
from .questions.registry import QUESTION_KINDS

QID = "question"
FORM_KINDS = {"numeric": NumericLevels()}  # kinds the form asks beyond the System One types


def as_question(request: DecisionRequest, noul_option: str):
    """The System One question (or numeric levels) that asks what the single-question request asks."""
    names = dict.fromkeys(request.options)
    if request.kind == "noul" and noul_option in names:
        raise validation_error(f"option {noul_option!r} is what kind 'noul' adds for none of the options; "
                               "name it otherwise", ("options",))
    if request.kind == "choice":
        return ChoiceQuestion.model_construct(type="choice", instructions=request.question, criteria=names)
    if request.kind == "noul":
        return ChoiceQuestion.model_construct(type="choice", instructions=request.question,
                                              criteria={**names, noul_option: None})
    if request.kind == "span":
        return SpanQuestion.model_construct(type="span", instructions=request.question, criteria=list(request.options))
    if request.kind == "set":
        return SetQuestion.model_construct(type="set", instructions=request.question, criteria=names)
    return NumericQuestion(instructions=request.question, options=tuple(request.options))


def fields(request: DecisionRequest, answer) -> dict:
    """The form's response fields from the question's typed answer."""
    options = list(request.options)
    if request.kind == "set":
        yes = [answer.probabilities[o] for o in options]
        total = sum(yes)
        best = max(range(len(yes)), key=yes.__getitem__)
        return {"probabilities": [p / total for p in yes] if total > 0 else [1.0 / len(yes)] * len(yes),
                "choice_index": best, "choice": options[best], "yes_probabilities": yes,
                "selected": [options.index(name) for name in answer.selected]}
    probs = list(answer.probabilities.values()) if isinstance(answer.probabilities, dict) else answer.probabilities
    if request.kind == "noul":
        noul, option_probs = probs[-1], probs[:-1]
        best = max(range(len(option_probs)), key=option_probs.__getitem__)
        won = noul < option_probs[best]
        return {"probabilities": option_probs, "choice_index": best if won else None,
                "choice": options[best] if won else None, "noul": noul}
    best = max(range(len(probs)), key=probs.__getitem__)
    out = {"probabilities": probs, "choice_index": best, "choice": options[best]}
    if request.kind == "score":
        out["score"] = answer.score
    elif request.kind == "span":
        out["span"] = answer.span
    return out


def l1_key(request: DecisionRequest, image_keys: tuple[str, ...]) -> str:
    """Identifies a request's prompt: everything but request_id and deadline."""
    payload = request.model_dump_json(include={"kind", "question", "options"}) + "|" + (request.state.text or "")
    return hashlib.sha256(("legacy|" + payload + "|" + ",".join(image_keys)).encode()).hexdigest()


def job(request: DecisionRequest, image_key: str | None, noul_option: str) -> Job:
    """`image_key`: the asset key of state.image (None without one)."""
    keys = (image_key,) if image_key else ()
    text = request.state.text or ""
    pieces = ((ImageSlot(image_key), "\n") if image_key else ()) + (text,)
    return Job(questions={QID: as_question(request, noul_option)}, state=text, pieces=pieces,
               where="state.text", route_text=text, route_images=keys, l1_key=l1_key(request, keys),
               extra_kinds=FORM_KINDS, has_images=request.state.image is not None)


def response(request: DecisionRequest, model: str, answers: dict, prompt_tokens: int, cached_tokens: int,
             elapsed: float) -> DecisionResponse:
    return DecisionResponse(request_id=request.request_id, kind=request.kind, model=model,
                            usage=Usage(prompt_tokens=prompt_tokens, cached_tokens=cached_tokens),
                            elapsed_seconds=elapsed, **fields(request, answers[QID]))


# ----- for tests and benchmarks: the form's rows and prompt with a builder, as the pipeline makes them ----
def legacy_rows(request: DecisionRequest, builder):
    """(rows, plan) of a single-question request."""
    question = as_question(request, builder.recipe.verbalizer.noul_option)
    return rows_for({QID: question}, request.state.text or "", builder, {**QUESTION_KINDS, **FORM_KINDS})


def legacy_state_text(request: DecisionRequest, image_placeholders: list[str]) -> str:
    return "".join(p + "\n" for p in image_placeholders) + (request.state.text or "")


def prepare_legacy(builder, request: DecisionRequest, image_placeholders: list[str] = (),
                   image_keys: tuple[str, ...] = ()) -> PreparedRequest:
    rows, plan = legacy_rows(request, builder)
    return builder.prepare(legacy_state_text(request, list(image_placeholders)), rows, tuple(image_keys), plan)
