"""The coherence mode (x_coherence, questions/choice.py): `cyclic` answers a choice from the cyclic shifts of its
options, so an answer does not depend on the order the options were sent in."""
from __future__ import annotations

import pytest

from jev_common.errors import InvalidRequest
from jev_common.schema import ChoiceAnswer, SystemOneRequest
from jev_worker.protocols import QuestionKind
from jev_worker.questions.choice import cyclic_shifts
from jev_worker.questions.plan import rows_for

from .worker_helpers import worker_client

STATE = "The kettle whistles and steam comes out of its spout."


def ask(criteria: dict, coherence: str | None = None) -> dict:
    body = {"model": "jev-latest", "state": STATE,
            "questions": {"q": {"type": "choice", "instructions": "What is the kettle doing?", "criteria": criteria}}}
    if coherence is not None:
        body["x_coherence"] = coherence
    return body


def test_shifts_are_all_of_them_up_to_the_bound_then_evenly_spaced():
    assert cyclic_shifts(3) == [0, 1, 2] and cyclic_shifts(8) == list(range(8))
    assert cyclic_shifts(16) == [0, 2, 4, 6, 8, 10, 12, 14] and len(cyclic_shifts(255)) == 8


async def test_a_shifted_option_order_gets_the_same_answer_under_cyclic(worker_settings):
    options = {"boiling": "water at 100 C", "cooling": None, "broken": "it makes no sound"}
    shifted = {"cooling": None, "broken": "it makes no sound", "boiling": "water at 100 C"}
    async with worker_client(worker_settings()) as (client, service):
        answers = {}
        for mode in ("off", "cyclic"):
            for name, criteria in (("sent", options), ("shifted", shifted)):
                response = await client.post("/v1/systemone", json=ask(criteria, mode))
                assert response.status == 200, await response.text()
                body = await response.json()
                answers[mode, name] = body["answers"]["q"]["probabilities"]
                answers[mode, name, "tokens"] = body["usage"]["input_tokens"]
        for option in options:  # cyclic: every shift seen either way, so the same mean
            assert abs(answers["cyclic", "sent"][option] - answers["cyclic", "shifted"][option]) <= 1e-5
        assert max(abs(answers["off", "sent"][o] - answers["off", "shifted"][o]) for o in options) > 1e-4
        assert abs(sum(answers["cyclic", "sent"].values()) - 1) <= 1e-6
        # the three shifts are three rows after ONE prefill of the state: no state prefill per shift
        model = service.model
        request = SystemOneRequest.model_validate(ask(options, "cyclic"))
        rows, plan = rows_for(request.questions, request.state, model.builder, model.readout.kinds,
                              model.readout.name, "cyclic")
        prepared = model.builder.prepare(STATE, rows, (), plan)
        assert len(prepared.rows) == 3
        assert answers["cyclic", "sent", "tokens"] == prepared.prompt_tokens
        assert answers["cyclic", "sent", "tokens"] < 3 * answers["off", "sent", "tokens"]
        models = (await (await client.get("/v1/models")).json())["models"]
        assert all(m["x_coherence"] == ["cyclic", "off"] for m in models)


class FixedOrderChoice(QuestionKind):
    """A family's own choice type that offers no coherence mode."""

    type = "choice"

    def rows(self, question, ctx, where):
        raise AssertionError("refused before any row is built")

    def answer(self, question, logits, ctx) -> ChoiceAnswer:
        raise AssertionError


def test_a_readout_without_the_mode_refuses_it_by_name():
    request = SystemOneRequest.model_validate(ask({"a": None, "b": None}, "cyclic"))
    with pytest.raises(InvalidRequest, match="does not offer 'cyclic'") as raised:
        rows_for(request.questions, request.state, None, {"choice": FixedOrderChoice()}, "jemm-labels", "cyclic")
    assert raised.value.loc == ("x_coherence",)


def test_an_unknown_mode_is_a_422_in_the_schema():
    with pytest.raises(ValueError):
        SystemOneRequest.model_validate(ask({"a": None, "b": None}, "prior-someday"))
