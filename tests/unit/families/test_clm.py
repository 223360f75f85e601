"""CLM (clm-v0.1-8b) on the external-http backend + clm-cosine readout, against CLM's OWN server: PyPI
contrastive-lm 0.1.0 (wheel sha256 7f3eed12d3aa10173f71bac7e50fc387565b485a2a2fc4c4323af32b1950055f), its
`clm.server.create_app` over its `Engine`, `Embedder` and `HeadPair`, run in-process by uvicorn on loopback
(tests/unit/clm_helpers.py) with a fake encoder under it and a tiny head in CLM's checkpoint layout.

- the body our worker sends is, as CLM's handler parses it, exactly what CLM's own client
  (`clm.client.CLMClient.system_one`, contrastive-lm 0.1.0 `clm/client.py`) sends for the same questions, and our
  answers equal the answers CLM's client gets;
- the texts CLM embeds are written out literally (contrastive-lm 0.1.0 `clm/schema.py` `state_text`, `to_text`,
  `candidates`), and the answers equal a plain reference over them to 1e-5;
- span / set are refused before anything is sent; CLM down, its encoder down (CLM's own 502), a slow encoder and a
  malformed answer are 502 / 504 in this API's error shape, never a hang."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
import torch
from aiohttp import web
from aiohttp.test_utils import TestServer

from jev_common.checkpoint_files import ServingError
from jev_common.recipe import load_recipe
from jev_worker.serving import preflight

from ..clm_helpers import embedding, embeddings_app, make_tiny_clm_head, project, upstream_clm_server
from ..family_helpers import TOL, ask, assert_probs, served

STATE = "The kettle is whistling and steam comes out of its spout."
OBJECT_STATE = {"kettle": "whistling", "stove": {"on": True, "level": 3}, "notes": ["steam", "spout"]}
QUESTIONS = {
    "what": {
        "type": "choice",
        "instructions": "What is the kettle doing?",
        "criteria": {"boiling": "the water boils", "cooling": None, "broken": None},
    },
    "level": {"type": "score", "instructions": "How hot is it?", "criteria": ["cold", "warm", "hot"]},
    "hot": {
        "type": "noul",
        "instructions": "Is the water hot?",
        "criteria": {"true": "it is boiling", "false": "it is cold"},
    },
    "on": {"type": "noul", "instructions": "Is the stove on?"},
}
# What CLM embeds for QUESTIONS about STATE, copied out of contrastive-lm 0.1.0 `clm/schema.py`: `state_text` is
# `f"{state}\n\n{instructions}"`; `candidates` gives a choice option its description, else its key, a score level its
# text, a noul side `f"{key}: {description}"`, an undescribed side "Yes. This is true: " / "No. This is false: " and
# the instructions; `Engine.answer` (`clm/engine.py`) embeds the states first, then every candidate in order.
UPSTREAM_STATE_TEXTS = [
    "The kettle is whistling and steam comes out of its spout.\n\nWhat is the kettle doing?",
    "The kettle is whistling and steam comes out of its spout.\n\nHow hot is it?",
    "The kettle is whistling and steam comes out of its spout.\n\nIs the water hot?",
    "The kettle is whistling and steam comes out of its spout.\n\nIs the stove on?",
]
UPSTREAM_CANDIDATE_TEXTS = [
    "the water boils",
    "cooling",
    "broken",
    "cold",
    "warm",
    "hot",
    "false: it is cold",
    "true: it is boiling",
    "false: No. This is false: Is the stove on?",
    "true: Yes. This is true: Is the stove on?",
]
# `to_text` (clm/schema.py) writes an object state as `key: value` fields, nested ones indented, lists as `- item`:
UPSTREAM_OBJECT_STATE_TEXT = (
    "kettle: whistling\n\nstove:\n  on: true\n  level: 3\n\nnotes:\n  - steam\n  - spout\n\nIs the stove on?"
)


@pytest.fixture(scope="module")
def clm_head(tmp_path_factory) -> str:
    return make_tiny_clm_head(tmp_path_factory.mktemp("clm") / "CLM_v0.1-8B.pt", seed=11)


def clm_recipe(endpoint: str, **options):
    recipe = load_recipe("clm-v0.1-8b")
    serving = recipe.serving.model_copy(update={"options": {**recipe.serving.options, "endpoint": endpoint, **options}})
    return recipe.model_copy(update={"serving": serving})


@contextlib.asynccontextmanager
async def clm_stack(worker_settings, head: str, deadline_s: float = 30.0, **options):
    """(frontend, worker, control, embeddings server, CLM's server): the worker in front of CLM's own server,
    which embeds through the fake encoder; control["embedded"] holds the encoder's requests."""
    control: dict = {"embedded": []}
    async with TestServer(embeddings_app(control["embedded"], control)) as emb:
        async with upstream_clm_server(head, str(emb.make_url("/v1/embeddings"))) as clm:
            settings = worker_settings(recipe=clm_recipe(clm.url, **options), model_path=None, deadline_s=deadline_s)
            async with served(settings) as (front, worker, service):
                control["service"] = service
                yield front, worker, control, emb, clm


def reference(head: str, state_text: str, options: list[str], temperature: float = 1.0) -> list[float]:
    """softmax(exp(logit_scale) * cos(state_head(e(state_text)), action_head(e(option))) / T) in FP32."""
    ck = torch.load(head, weights_only=True)
    unit = lambda text: torch.nn.functional.normalize(embedding(text), dim=-1)  # noqa: E731
    z_state = project(ck["state_head"], unit(state_text)[None])[0]
    z_options = project(ck["action_head"], torch.stack([unit(o) for o in options]))
    return torch.softmax(ck["logit_scale"].exp() * (z_options @ z_state) / temperature, -1).tolist()


async def test_clm_answers_equal_clms_own_server_and_the_plain_reference(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head, temperature=0.7) as (front, worker, control, _, clm):
        body = await ask(front, STATE, QUESTIONS)
        ours = clm.calls[-1]
        assert [b["input"] for b in control["embedded"]] == [UPSTREAM_STATE_TEXTS, UPSTREAM_CANDIDATE_TEXTS]
        assert all(b["model"] == "qwen3-8b" and b["encoding_format"] == "base64" for b in control["embedded"])
        assert body["usage"] == {
            "input_tokens": sum(len(t.split()) for b in control["embedded"] for t in b["input"]),
            "output_tokens": 0,
        }

        from clm.client import Choice, CLMClient, Noul, Score

        def clients_request():
            with CLMClient(base_url=clm.url) as client:
                return client.system_one(
                    STATE,
                    {
                        "what": Choice(
                            instructions="What is the kettle doing?",
                            criteria={"boiling": "the water boils", "cooling": None, "broken": None},
                        ),
                        "level": Score(instructions="How hot is it?", criteria=["cold", "warm", "hot"]),
                        "hot": Noul(
                            instructions="Is the water hot?", criteria={"true": "it is boiling", "false": "it is cold"}
                        ),
                        "on": Noul(instructions="Is the stove on?"),
                    },
                    temperature=0.7,
                )

        theirs = await asyncio.get_running_loop().run_in_executor(None, clients_request)
        assert ours == clm.calls[-1]  # the same state, questions, model and temperature as CLM's own client sends
        assert ours["model"] == "clm-latest" and ours["temperature"] == 0.7

        answers, t = body["answers"], 0.7
        want = reference(clm_head, UPSTREAM_STATE_TEXTS[0], UPSTREAM_CANDIDATE_TEXTS[0:3], t)
        assert_probs(answers["what"]["probabilities"], want, ["boiling", "cooling", "broken"])
        assert_probs(
            answers["what"]["probabilities"],
            [theirs.answers["what"].probabilities[k] for k in ("boiling", "cooling", "broken")],
            ["boiling", "cooling", "broken"],
        )
        assert answers["what"]["choice"] == theirs.answers["what"].choice
        assert max(want) - min(want) > 1e-3  # the head tells the options apart, or this proves nothing
        assert abs(answers["what"]["confidence"] - (max(want) - 1 / 3) / (2 / 3)) <= TOL  # this API's formula
        want = reference(clm_head, UPSTREAM_STATE_TEXTS[1], UPSTREAM_CANDIDATE_TEXTS[3:6], t)
        assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2"])
        assert abs(answers["level"]["score"] - theirs.answers["level"].score) <= TOL
        assert answers["level"]["legend"] == theirs.answers["level"].legend == {"0": "cold", "1": "warm", "2": "hot"}
        want = reference(clm_head, UPSTREAM_STATE_TEXTS[2], UPSTREAM_CANDIDATE_TEXTS[6:8], t)
        assert abs(answers["hot"]["noul"] - want[1]) <= TOL
        assert abs(answers["hot"]["noul"] - theirs.answers["hot"].noul) <= TOL
        want = reference(clm_head, UPSTREAM_STATE_TEXTS[3], UPSTREAM_CANDIDATE_TEXTS[8:10], t)
        assert abs(answers["on"]["noul"] - want[1]) <= TOL
        assert body["model"] == "clm-v0.1-8b"

        body = await ask(front, OBJECT_STATE, {"on": QUESTIONS["on"]})
        assert clm.calls[-1]["state"] == OBJECT_STATE  # sent as the object it is; CLM writes it as text itself
        want = reference(clm_head, UPSTREAM_OBJECT_STATE_TEXT, UPSTREAM_CANDIDATE_TEXTS[8:10], t)
        assert control["embedded"][-1]["input"] == [UPSTREAM_OBJECT_STATE_TEXT]  # its candidates are cached
        assert abs(body["answers"]["on"]["noul"] - want[1]) <= TOL

        health = await (await worker.get("/health")).json()
        assert health["detail"]["serving"]["backend"] == "external-http"
        assert health["detail"]["serving"]["readout"] == "clm-cosine"
        assert health["detail"]["external"]["embedder"] is True


@pytest.mark.parametrize(
    "question",
    [
        {"type": "set", "criteria": {"hot": None, "cold": None}},
        {"type": "span", "criteria": ["its spout", "The kettle"]},
    ],
)
async def test_clm_refuses_span_and_set_before_sending(worker_settings, clm_head, question):
    async with clm_stack(worker_settings, clm_head) as (front, _, control, _, clm):
        body = await ask(front, STATE, {"q": question}, status=422)
        assert (
            body["detail"]["error_type"] == "unsupported_question_type" and "CLM answers" in body["detail"]["message"]
        )
        assert clm.calls == [] and control["embedded"] == []


async def test_clm_is_position_free_every_coherence_mode_answered_unchanged(worker_settings, clm_head):
    from jev_worker.questions.coherence import AnsweredElsewhere

    async with clm_stack(worker_settings, clm_head) as (front, worker, control, _, clm):
        off = await ask(front, STATE, QUESTIONS)
        sent = clm.calls[-1]
        for mode in ("cyclic", "prior"):
            body = await ask(front, STATE, QUESTIONS, x_coherence=mode)
            assert body["answers"] == off["answers"] and clm.calls[-1] == sent  # nothing of the mode reaches CLM
        model = (await (await worker.get("/v1/models")).json())["models"][0]
        assert model["x_coherence"] == ["cyclic", "off", "prior"]
        assert {t: e["position_free"] for t, e in model["x_coherence_types"].items()} == {"choice": True, "score": True}
        # an external readout whose choice depends on option order: the mode is refused before anything is sent
        control["service"].serving.readout.kinds = {"choice": AnsweredElsewhere("choice", position_free=False)}
        calls = len(clm.calls)
        body = await ask(front, STATE, QUESTIONS, status=422, x_coherence="cyclic")
        [error] = body["detail"]
        assert (
            error["loc"][-1] == "x_coherence"
            and "clm-cosine" in error["msg"]
            and "does not offer 'cyclic'" in error["msg"]
        )
        assert len(clm.calls) == calls


async def test_clm_server_down_is_502_and_health_503(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head) as (front, worker, _, _, clm):
        await clm.stop()
        started = time.perf_counter()
        body = await ask(front, STATE, {"on": QUESTIONS["on"]}, status=502)
        assert (
            body["detail"]["error_type"] == "backend_unavailable" and "cannot be reached" in body["detail"]["message"]
        )
        response = await worker.get("/health")
        health = await response.json()
        assert response.status == 503 and "external server" in health["detail"]["message"]
        assert time.perf_counter() - started < 10


async def test_embeddings_server_down_is_502_naming_it(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head) as (front, worker, _, emb, _):
        await emb.close()
        body = await ask(front, STATE, {"on": QUESTIONS["on"]}, status=502)
        # CLM's own 502 (clm/server.py: EmbedderError -> HTTPException(502); clm/embedder.py "embedder unreachable at")
        assert (
            body["detail"]["error_type"] == "backend_unavailable"
            and "embedder unreachable" in body["detail"]["message"]
        )
        response = await worker.get("/health")
        assert response.status == 503
        assert "embeddings server down" in (await response.json())["detail"]["message"]


async def test_slow_clm_server_is_504_at_the_deadline(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head, deadline_s=0.5) as (front, _, control, _, _):
        control["delay"] = 2.0  # the encoder under CLM, and so CLM, answers late
        started = time.perf_counter()
        body = await ask(front, STATE, {"on": QUESTIONS["on"]}, status=504)
        assert body["detail"]["error_type"] == "deadline_exceeded"
        assert time.perf_counter() - started < 1.9


async def test_a_wrong_answer_from_clm_is_502_naming_the_question(worker_settings):
    """A server that answers with the wrong options (a fault CLM itself does not make)."""

    async def wrong(_request: web.Request) -> web.Response:
        return web.json_response(
            {
                "model": "clm-latest",
                "usage": {"input_tokens": 0},
                "answers": {"what": {"type": "choice", "probabilities": {"nonsense": 1.0}}},
            }
        )

    app = web.Application()
    app.router.add_post("/v1/systemone", wrong)
    async with TestServer(app) as server:
        recipe = clm_recipe(str(server.make_url("")).rstrip("/"))
        async with served(worker_settings(recipe=recipe, model_path=None)) as (front, _, _):
            body = await ask(front, STATE, {"what": {"type": "choice", "criteria": {"a": None, "b": None}}}, status=502)
    assert body["detail"]["error_type"] == "backend_unavailable" and "'what'" in body["detail"]["message"]


def test_clm_without_an_endpoint_does_not_start():
    recipe = load_recipe("clm-v0.1-8b")
    preflight(recipe, None)  # the recipe as shipped names its endpoint
    serving = recipe.serving.model_copy(update={"options": {"native_model": "clm-latest"}})
    with pytest.raises(ServingError, match="serving.options.endpoint"):
        preflight(recipe.model_copy(update={"serving": serving}), None)
    serving = recipe.serving.model_copy(update={"options": {**recipe.serving.options, "temperature": 0}})
    with pytest.raises(ServingError, match="temperature"):
        preflight(recipe.model_copy(update={"serving": serving}), None)
