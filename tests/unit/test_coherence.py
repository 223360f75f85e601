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
    body = {
        "model": "jev-latest",
        "state": STATE,
        "questions": {"q": {"type": "choice", "instructions": "What is the kettle doing?", "criteria": criteria}},
    }
    if coherence is not None:
        body["x_coherence"] = coherence
    return body


def test_shifts_are_all_of_them_up_to_the_bound_then_evenly_spaced():
    assert cyclic_shifts(3) == [0, 1, 2] and cyclic_shifts(8) == list(range(8))
    assert cyclic_shifts(16) == [0, 2, 4, 6, 8, 10, 12, 14] and len(cyclic_shifts(255)) == 8


async def test_a_shifted_option_order_gets_the_same_answer_under_cyclic(worker_settings):
    options = {"boiling": "water at 100 C", "cooling": None, "broken": "it makes no sound"}
    shifted = {"cooling": None, "broken": "it makes no sound", "boiling": "water at 100 C"}
    swapped = {"cooling": None, "boiling": "water at 100 C", "broken": "it makes no sound"}  # not a shift
    async with worker_client(worker_settings()) as (client, service):
        answers = {}
        for mode in ("off", "cyclic"):
            for name, criteria in (("sent", options), ("shifted", shifted), ("swapped", swapped)):
                response = await client.post("/v1/systemone", json=ask(criteria, mode))
                assert response.status == 200, await response.text()
                body = await response.json()
                answers[mode, name] = body["answers"]["q"]["probabilities"]
                answers[mode, name, "tokens"] = body["usage"]["input_tokens"]
        for option in options:  # cyclic: the shifts of the options by name, whatever order they were sent in
            assert abs(answers["cyclic", "sent"][option] - answers["cyclic", "shifted"][option]) <= 1e-5
            assert abs(answers["cyclic", "sent"][option] - answers["cyclic", "swapped"][option]) <= 1e-5
        assert max(abs(answers["off", "sent"][o] - answers["off", "shifted"][o]) for o in options) > 1e-4
        assert abs(sum(answers["cyclic", "sent"].values()) - 1) <= 1e-6
        # the three shifts are three rows after ONE prefill of the state: no state prefill per shift
        model = service.model
        request = SystemOneRequest.model_validate(ask(options, "cyclic"))
        rows, plan = rows_for(
            request.questions, request.state, model.builder, model.readout.kinds, model.readout.name, "cyclic"
        )
        prepared = model.builder.prepare(STATE, rows, (), plan)
        assert len(prepared.rows) == 3
        assert answers["cyclic", "sent", "tokens"] == prepared.prompt_tokens
        assert answers["cyclic", "sent", "tokens"] < 3 * answers["off", "sent", "tokens"]
        models = (await (await client.get("/v1/models")).json())["models"]
        assert all(m["x_coherence"] == ["cyclic", "off"] for m in models)


def test_every_shift_cancels_a_purely_positional_preference_and_a_subset_does_not():
    """The shifts' balance is the debiasing (each option once at each position): a model that only prefers a
    position gets a uniform answer under cyclic; the canonical order alone (or too few shifts) would not."""
    import torch

    from jev_worker.questions.choice import Listings

    names = ["c", "a", "d", "b"]
    by_position = torch.log(torch.tensor([0.7, 0.1, 0.1, 0.1]))
    assert Listings(names, "cyclic").shifts == [0, 1, 2, 3]
    assert all(abs(p - 0.25) <= 1e-6 for p in Listings(names, "cyclic").mean([by_position] * 4))
    assert abs(Listings(names, "off").mean([by_position])[0] - 0.7) <= 1e-6  # "c", sent first, gets position 0's
    many = [f"o{i:02d}" for i in range(16)]  # past MAX_SHIFTS: 8 evenly spaced shifts, every other position
    first = torch.log(torch.tensor([0.7] + [0.02] * 15))
    probs = Listings(many, "cyclic").mean([first] * 8)
    assert abs(sum(probs) - 1) <= 1e-6 and max(probs) - min(probs) > 0.05


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


# ----- score: both listing orders ----------------------------------------------------------------
async def test_a_score_under_cyclic_averages_its_levels_asked_in_both_orders(worker_settings):
    import torch

    body = {
        "model": "jev-latest",
        "state": STATE,
        "x_coherence": "cyclic",
        "questions": {
            "s": {"type": "score", "instructions": "How hot is the kettle?", "criteria": ["cold", "warm", "hot"]}
        },
    }
    async with worker_client(worker_settings()) as (client, service):
        served = (await (await client.post("/v1/systemone", json=body)).json())["answers"]["s"]
        off = (await (await client.post("/v1/systemone", json=dict(body, x_coherence="off"))).json())["answers"]["s"]
        model = service.model
        request = SystemOneRequest.model_validate(body)
        rows, plan = rows_for(
            request.questions, request.state, model.builder, model.readout.kinds, model.readout.name, "cyclic"
        )
        assert [r.content.split("Levels:\n")[1].split("\nAnswer")[0] for r in rows] == [
            "0. cold\n1. warm\n2. hot",
            "2. hot\n1. warm\n0. cold",
        ]  # reversed, digit i still level i
        assert rows[0].labels == rows[1].labels
        prepared = model.builder.prepare(STATE, rows, (), plan)
        with torch.inference_mode():  # each order as a plain forward over its whole prompt
            want = [
                torch.softmax(
                    service.model.loaded.model(input_ids=torch.tensor([prepared.full_ids(i)]))
                    .logits[0, -1, list(prepared.row_labels[i])]
                    .float(),
                    -1,
                ).tolist()
                for i in range(2)
            ]
    assert served["legend"] == {"0": "cold", "1": "warm", "2": "hot"}
    for level in range(3):
        assert abs(served["probabilities"][str(level)] - (want[0][level] + want[1][level]) / 2) <= 1e-5
        assert abs(off["probabilities"][str(level)] - want[0][level]) <= 1e-5


# ----- span: candidates listed under codes, as choice's options ----------------------------------------
async def test_a_span_under_cyclic_gets_the_same_answer_in_any_candidate_order_and_the_shifts_mean(worker_settings):
    import torch

    candidates = ["steam comes out", "The kettle whistles", "its spout"]

    def body(order, mode):
        return {
            "model": "jev-latest",
            "state": STATE,
            "x_coherence": mode,
            "questions": {"s": {"type": "span", "instructions": "What shows the water boils?", "criteria": order}},
        }

    async with worker_client(worker_settings()) as (client, service):
        got = {}
        for mode in ("off", "cyclic"):
            for name, order in (("sent", candidates), ("reversed", candidates[::-1])):
                response = await client.post("/v1/systemone", json=body(order, mode))
                assert response.status == 200, await response.text()
                got[mode, name] = (await response.json())["answers"]["s"]
        model = service.model
        request = SystemOneRequest.model_validate(body(candidates, "cyclic"))
        rows, plan = rows_for(
            request.questions, request.state, model.builder, model.readout.kinds, model.readout.name, "cyclic"
        )
        prepared = model.builder.prepare(STATE, rows, (), plan)
        with torch.inference_mode():  # each shift as a plain forward over its whole prompt
            shifts = [
                torch.softmax(
                    service.model.loaded.model(input_ids=torch.tensor([prepared.full_ids(i)]))
                    .logits[0, -1, list(prepared.row_labels[i])]
                    .float(),
                    -1,
                ).tolist()
                for i in range(len(rows))
            ]
        models = (await (await client.get("/v1/models")).json())["models"]
    ordered = sorted(candidates)  # by text, then shifted: row k lists ordered[k:] + ordered[:k]
    assert [r.content.split("Options:\n")[1].split("\nAnswer")[0].splitlines()[0][3:] for r in rows] == ordered
    for i, candidate in enumerate(ordered):
        want = sum(shifts[k][(i - k) % 3] for k in range(3)) / 3  # where candidate i stood in shift k
        assert abs(got["cyclic", "sent"]["probabilities"][candidate] - want) <= 1e-5
        assert abs(got["cyclic", "reversed"]["probabilities"][candidate] - want) <= 1e-5
    assert (
        max(
            abs(got["off", "sent"]["probabilities"][c] - got["off", "reversed"]["probabilities"][c]) for c in candidates
        )
        > 1e-4
    )
    best = max(candidates, key=got["cyclic", "sent"]["probabilities"].__getitem__)
    assert got["cyclic", "sent"]["span"]["text"] == best and STATE[got["cyclic", "sent"]["span"]["start"] :].startswith(
        best
    )
    assert all(m["x_coherence_types"]["span"]["modes"] == ["cyclic", "off"] for m in models)


def test_vela_s_span_is_position_free():
    from jev_worker.families.vela.readout import VelaSpan
    from jev_worker.questions import coherence

    assert coherence.entries({"span": VelaSpan(None)})["span"].position_free


# ----- prior: PriDe ------------------------------------------------------------------------------
def test_the_prior_is_pride_s_formula_on_a_hand_computed_case():
    """Zheng et al. (ICLR 2024) Eq. 4-6, worked by hand. Question 1, two options, P_obs by position under shift 0 =
    (0.8, 0.2) and shift 1 = (0.6, 0.4): mean logs -> softmax = (sqrt(.48), sqrt(.08)) / sum = (0.71010, 0.28990).
    Question 2: (0.5, 0.5) and (0.7, 0.3): (sqrt(.35), sqrt(.15)) / sum = (0.60436, 0.39564). Prior (Eq. 5): the
    mean, (0.65723, 0.34277). A later answer (0.6, 0.4) debiased (Eq. 6): (0.6 / 0.657229, 0.4 / 0.342771)
    = (0.912930, 1.166962), renormalised = (0.43893, 0.56107)."""
    import math

    import torch

    from jev_worker.values.position_prior import PositionPrior, estimate, question_prior

    logs = lambda *rows: [[math.log(p) for p in row] for row in rows]  # noqa: E731
    q1, q2 = logs((0.8, 0.2), (0.6, 0.4)), logs((0.5, 0.5), (0.7, 0.3))
    assert [round(p, 5) for p in question_prior(q1)] == [0.71010, 0.28990]
    assert [round(p, 5) for p in question_prior(q2)] == [0.60436, 0.39564]
    prior = estimate([q1, q2])
    assert [round(p, 5) for p in prior[2]] == [0.65723, 0.34277]
    debias = PositionPrior({2: tuple(prior[2])}, {"sha256": "x"}).debias(torch.tensor([math.log(0.6), math.log(0.4)]))
    assert [round(p, 5) for p in torch.softmax(debias, -1).tolist()] == [0.43893, 0.56107]
    # three options: the content term cancels because every option stands at every position once
    q3 = logs((0.5, 0.3, 0.2), (0.1, 0.6, 0.3), (0.2, 0.2, 0.6))
    mean = [
        (math.log(0.5) + math.log(0.1) + math.log(0.2)) / 3,
        (math.log(0.3) + math.log(0.6) + math.log(0.2)) / 3,
        (math.log(0.2) + math.log(0.3) + math.log(0.6)) / 3,
    ]
    want = [math.exp(m) / sum(math.exp(x) for x in mean) for m in mean]
    assert max(abs(a - b) for a, b in zip(question_prior(q3), want)) <= 1e-12


def write_set(path, counts) -> None:
    import json

    lines = []
    for i, n in enumerate(counts):
        lines.append(
            json.dumps(
                {
                    "id": f"q{i}",
                    "state": f"Scene {i}: the kettle whistles and the cat sleeps.",
                    "instructions": "What fits best?",
                    "criteria": {f"option {k}": (None if k % 2 else f"described {k}") for k in range(n)},
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def prior_checkpoint(tiny_text_dir, tiny_recipe, tmp_path_factory):
    """The tiny checkpoint with a prior for 2 and 3 options in its decision_config.json, computed by
    tools.calibrate_prior through the worker's engine."""
    import asyncio
    import shutil
    from pathlib import Path

    from jev_worker.settings import CacheSettings, WorkerSettings
    from tools.calibrate_prior import calibrate, write

    folder = tmp_path_factory.mktemp("prior") / "tiny"
    shutil.copytree(tiny_text_dir, folder)
    calibration_set = folder.parent / "set.jsonl"
    write_set(calibration_set, [2, 3, 3, 2])
    settings = WorkerSettings(
        recipe=tiny_recipe,
        model_path=str(folder),
        device="cpu",
        dtype="float32",
        redis_url="redis://127.0.0.1:1/0",
        asset_dir="/nonexistent",
        worker_id="test",
        cache=CacheSettings(True, 1024, 64 << 20, 64 << 20),
    )
    result = asyncio.run(calibrate(settings, calibration_set))
    write(Path(folder) / "decision_config.json", result["prior"])
    return str(folder), result, calibration_set


async def test_prior_answers_single_pass_debiased_and_refuses_an_option_count_it_has_no_prior_for(
    worker_settings, prior_checkpoint
):
    import hashlib
    import json
    import math
    from pathlib import Path

    folder, result, calibration_set = prior_checkpoint
    prior = result["prior"]
    stored = json.loads((Path(folder) / "decision_config.json").read_text())["position_prior"]["priors"]["3"]
    assert sorted(prior.priors) == [2, 3] and result["rows"] == 2 + 3 + 3 + 2  # every shift of every question
    assert prior.calibration_set["sha256"] == hashlib.sha256(calibration_set.read_bytes()).hexdigest()
    three = {"boiling": "water at 100 C", "cooling": None, "broken": None}
    async with worker_client(worker_settings(model_path=folder)) as (client, service):
        models = (await (await client.get("/v1/models")).json())["models"]
        assert models[0]["x_coherence"] == ["cyclic", "off", "prior"]
        assert models[0]["x_coherence_types"]["choice"]["modes"] == ["cyclic", "off", "prior"]
        health = (await (await client.get("/health")).json())["detail"]["serving"]["calibration"]
        assert health["position_prior"]["option_counts"] == "2, 3"
        assert health["position_prior"]["calibration_set"]["sha256"] == prior.calibration_set["sha256"]
        replies = {}
        for mode in ("off", "prior"):
            response = await client.post("/v1/systemone", json=ask(three, mode))
            assert response.status == 200, await response.text()
            replies[mode] = await response.json()
        refused = await client.post("/v1/systemone", json=ask(dict(three, spare=None), "prior"))
        detail = (await refused.json())["detail"][0]
    observed = replies["off"]["answers"]["q"]["probabilities"]
    weights = {name: p / stored[i] for i, (name, p) in enumerate(observed.items())}
    for name, weight in weights.items():  # Eq. 6 on the single pass: p / prior, renormalised
        assert math.isclose(
            replies["prior"]["answers"]["q"]["probabilities"][name], weight / sum(weights.values()), abs_tol=1e-5
        )
    assert replies["prior"]["usage"]["input_tokens"] == replies["off"]["usage"]["input_tokens"]  # single pass
    assert refused.status == 422 and detail["loc"] == ["body", "questions", "q", "criteria"]
    assert "no position prior for a choice of 4 options" in detail["msg"] and "covers 2, 3" in detail["msg"]


async def test_a_model_without_a_prior_refuses_the_mode_and_does_not_list_it(worker_settings):
    async with worker_client(worker_settings()) as (client, service):
        response = await client.post("/v1/systemone", json=ask({"a": None, "b": None}, "prior"))
        detail = (await response.json())["detail"][0]
        models = (await (await client.get("/v1/models")).json())["models"]
    assert (
        response.status == 422
        and "does not offer 'prior'" in detail["msg"]
        and detail["loc"] == ["body", "x_coherence"]
    )
    assert models[0]["x_coherence"] == ["cyclic", "off"]


async def test_a_recipe_prior_estimated_on_another_checkpoint_is_not_applied(worker_settings, tmp_path):
    """The embedded recipe names its prior file beside recipe.yaml; served with another checkpoint (JEV_MODEL_PATH),
    the prior is not applied (it was estimated on the pinned one), /health says why and `prior` is not offered."""
    from jev_common.recipe import load_recipe

    recipe = load_recipe()
    assert recipe.serving.options["position_prior_file"] == "position_prior.json"
    tiny = recipe.model_copy(update={"model": recipe.model.model_copy(update={"gguf_file": None, "dtype": "float32"})})
    async with worker_client(worker_settings(recipe=tiny)) as (client, service):
        calibration = (await (await client.get("/health")).json())["detail"]["serving"]["calibration"]
        models = (await (await client.get("/v1/models")).json())["models"]
    assert (
        "not applied, it was estimated on 'HuggingFaceTB/SmolLM2-135M-Instruct"
        in calibration["position_prior"]["unused"]
    )
    assert models[0]["x_coherence"] == ["cyclic", "off"]


async def test_a_checkpoint_s_own_prior_is_used_before_a_recipe_s_prior_for_another_checkpoint(
    worker_settings, prior_checkpoint
):
    """The embedded recipe names its prior file; a checkpoint that carries its own prior (decision_config.json)
    served with that recipe answers with its own, and the recipe's is reported unused."""
    from jev_common.recipe import load_recipe

    recipe = load_recipe()
    tiny = recipe.model_copy(update={"model": recipe.model.model_copy(update={"gguf_file": None, "dtype": "float32"})})
    async with worker_client(worker_settings(recipe=tiny, model_path=prior_checkpoint[0])) as (client, service):
        calibration = (await (await client.get("/health")).json())["detail"]["serving"]["calibration"]
        response = await client.post("/v1/systemone", json=ask({"a": None, "b": None, "c": None}, "prior"))
    assert calibration["position_prior"]["source"] == "decision_config.json position_prior"
    assert response.status == 200
