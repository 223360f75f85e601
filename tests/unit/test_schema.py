"""The shared API schema accepts what it should and rejects what it should."""

from __future__ import annotations

import json
import math

import pytest
from pydantic import ValidationError

from jev_common.schema import DecisionRequest, DecisionResponse

BASE = {"kind": "choice", "state": {"text": "a red ball"}, "question": "What colour?", "options": ["red", "blue"]}


def test_text_shorthand_and_optional_fields():
    request = DecisionRequest.model_validate(dict(BASE, state="a red ball", request_id="r1", deadline_s=2))
    assert request.state.text == "a red ball" and request.deadline_s == 2.0


def test_image_only_state_is_allowed():
    request = DecisionRequest.model_validate(dict(BASE, state={"image": "data:image/png;base64,AAAA"}))
    assert request.state.image.startswith("data:image/png")


@pytest.mark.parametrize(
    "change",
    [
        {"kind": "rank"},
        {"options": []},
        {"options": ["red"]},
        {"options": ["red", "red"]},
        {"options": ["red", ""]},
        {"question": ""},
        {"state": {}},
        {"state": {"text": "  "}},
        {"state": {"image": "http://x/y.png"}},
        {"deadline_s": 0},
        {"deadline_s": 1e9},
        {"extra": 1},
        {"kind": "score"},
        {"kind": "score", "options": ["1", "nan"]},
        {"kind": "span", "options": ["red", "green"]},
        {"options": [f"o{i}" for i in range(256)]},
        {"question": 5},
        {"options": "red,blue"},
    ],
)
def test_rejections(change):
    with pytest.raises(ValidationError):
        DecisionRequest.model_validate(dict(BASE, **change))


def response(**fields):
    base = dict(
        kind="choice",
        model="m",
        probabilities=[0.25, 0.75],
        choice_index=1,
        choice="blue",
        usage={"prompt_tokens": 10, "cached_tokens": 0},
        elapsed_seconds=0.01,
    )
    base.update(fields)
    return DecisionResponse.model_validate(base)


def test_response_probability_invariants():
    response()
    response(kind="noul", probabilities=[0.2, 0.3], noul=0.5, choice_index=None, choice=None)
    for bad in ([0.5, 0.6], [math.nan, 1.0], [math.inf, 0.0], [-0.5, 1.5]):
        with pytest.raises(ValidationError):
            response(probabilities=bad)
    with pytest.raises(ValidationError):
        response(kind="noul", probabilities=[0.5, 0.5], noul=0.5)


def test_single_question_form_accepts_the_model_field_upstream_examples_send():
    request = DecisionRequest.model_validate(dict(BASE, model="jev-27b-vl"))
    assert request.model == "jev-27b-vl" and request.kind == "choice"


def test_single_question_state_forms_and_optional_options():
    """Besides text and {text, image}: a list of parts and any other JSON object (JEV-VL's forms; a family
    says whether it reads them), and options only where the kind's options are the question."""
    parts = ["shot ", {"image": "data:image/png;base64,AAAA"}, {"type": "image_url", "image_url": {"url": "data:x"}}]
    request = DecisionRequest.model_validate(dict(BASE, state=parts))
    assert request.state == parts
    assert request.route_state() == (json.dumps(parts), ["data:image/png;base64,AAAA", "data:x"])
    request = DecisionRequest.model_validate(dict(BASE, state={"text": "a", "extra": 1}))
    assert request.state == {"text": "a", "extra": 1} and request.route_state() == ('{"text": "a", "extra": 1}', [])
    assert DecisionRequest.model_validate(dict(BASE, state={"text": "a"})).route_state() == ("a", [])
    for kind in ("noul", "score"):
        assert DecisionRequest.model_validate({"kind": kind, "state": "s", "question": "q?"}).options is None
    for kind in ("choice", "span", "set"):
        with pytest.raises(ValidationError, match="needs options"):
            DecisionRequest.model_validate({"kind": kind, "state": "s", "question": "q?"})
