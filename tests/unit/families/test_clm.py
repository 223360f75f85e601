"""CLM (clm-v0.1-8b) on the external-http backend + clm-cosine readout: the worker delegates to CLM's own
server (a loopback stand-in, clm_stubs.py, over a stub embeddings server) and translates to and from this
API. Answers through the real worker and frontend equal a plain reference (the texts CLM embeds written
out here, a CLM head in its checkpoint layout, scaled cosine, softmax) to 1e-5; span/set are refused before
anything is sent; a server that is down, slow or wrong answers 502/504 in the API's error shape, never a hang."""
from __future__ import annotations

import contextlib
import time

import pytest
import torch
from aiohttp.test_utils import TestServer

from jev_common.recipe import load_recipe
from jev_worker.readouts.base import ServingError
from jev_worker.serving import preflight

from ..clm_stubs import clm_app, embedding, embeddings_app, make_tiny_clm_head, project
from ..family_helpers import TOL, ask, assert_probs, served

STATE = "The kettle is whistling and steam comes out of its spout."


@pytest.fixture(scope="module")
def clm_head(tmp_path_factory) -> str:
    return make_tiny_clm_head(tmp_path_factory.mktemp("clm") / "CLM_v0.1-8B.pt", seed=11)


def clm_recipe(endpoint: str, **options):
    recipe = load_recipe("clm-v0.1-8b")
    serving = recipe.serving.model_copy(update={"options": {**recipe.serving.options, "endpoint": endpoint,
                                                            **options}})
    return recipe.model_copy(update={"serving": serving})


@contextlib.asynccontextmanager
async def clm_stack(worker_settings, head: str, deadline_s: float = 30.0, **options):
    """(frontend, worker, CLM control dict, embeddings server, CLM server), all on loopback."""
    control: dict = {"embedded": []}
    async with TestServer(embeddings_app(control["embedded"])) as emb:
        async with TestServer(clm_app(head, str(emb.make_url("")).rstrip("/"), control)) as clm:
            recipe = clm_recipe(str(clm.make_url("")).rstrip("/"), **options)
            settings = worker_settings(recipe=recipe, model_path=None, deadline_s=deadline_s)
            async with served(settings) as (front, worker, _):
                yield front, worker, control, emb, clm


def reference(head: str, state_text: str, options: list[str], temperature: float = 1.0) -> list[float]:
    """softmax(exp(logit_scale) * cos(state_head(e(state_text)), action_head(e(option))) / T) in FP32."""
    ck = torch.load(head, weights_only=True)
    unit = lambda text: torch.nn.functional.normalize(embedding(text), dim=-1)  # noqa: E731
    z_state = project(ck["state_head"], unit(state_text)[None])[0]
    z_options = project(ck["action_head"], torch.stack([unit(o) for o in options]))
    return torch.softmax(ck["logit_scale"].exp() * (z_options @ z_state) / temperature, -1).tolist()


async def test_clm_answers_equal_the_plain_reference(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head, temperature=0.7) as (front, worker, control, _, _):
        body = await ask(front, STATE, {
            "what": {"type": "choice", "instructions": "What is the kettle doing?",
                     "criteria": {"boiling": "the water boils", "cooling": None, "broken": None}},
            "level": {"type": "score", "instructions": "How hot is it?", "criteria": ["cold", "warm", "hot"]},
            "hot": {"type": "noul", "instructions": "Is the water hot?",
                    "criteria": {"true": "it is boiling", "false": "it is cold"}},
            "on": {"type": "noul", "instructions": "Is the stove on?"},
        })
        answers, t = body["answers"], 0.7
        want = reference(clm_head, f"{STATE}\n\nWhat is the kettle doing?", ["the water boils", "cooling", "broken"], t)
        assert_probs(answers["what"]["probabilities"], want, ["boiling", "cooling", "broken"])
        assert answers["what"]["choice"] == ["boiling", "cooling", "broken"][max(range(3), key=want.__getitem__)]
        assert abs(answers["what"]["confidence"] - (max(want) - 1 / 3) / (2 / 3)) <= TOL  # this API's formula
        want = reference(clm_head, f"{STATE}\n\nHow hot is it?", ["cold", "warm", "hot"], t)
        assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2"])
        assert abs(answers["level"]["score"] - (want[1] + 2 * want[2])) <= TOL
        assert answers["level"]["legend"] == {"0": "cold", "1": "warm", "2": "hot"}
        want = reference(clm_head, f"{STATE}\n\nIs the water hot?", ["false: it is cold", "true: it is boiling"], t)
        assert abs(answers["hot"]["noul"] - want[1]) <= TOL
        want = reference(clm_head, f"{STATE}\n\nIs the stove on?",
                         ["false: No. This is false: Is the stove on?", "true: Yes. This is true: Is the stove on?"], t)
        assert abs(answers["on"]["noul"] - want[1]) <= TOL
        sent = control["requests"][-1]
        assert sent["model"] == "clm-latest" and sent["temperature"] == 0.7 and sent["state"] == STATE
        assert body["model"] == "clm-v0.1-8b"
        assert body["usage"] == {"input_tokens": sum(len(t.split()) for b in control["embedded"] for t in b["input"]),
                                 "output_tokens": 0}
        health = await (await worker.get("/health")).json()
        assert health["detail"]["serving"]["backend"] == "external-http"
        assert health["detail"]["serving"]["readout"] == "clm-cosine"
        assert health["detail"]["external"]["embedder"] is True


@pytest.mark.parametrize("question", [{"type": "set", "criteria": {"hot": None, "cold": None}},
                                      {"type": "span", "criteria": ["its spout", "The kettle"]}])
async def test_clm_refuses_span_and_set_before_sending(worker_settings, clm_head, question):
    async with clm_stack(worker_settings, clm_head) as (front, _, control, _, _):
        body = await ask(front, STATE, {"q": question}, status=422)
        assert body["detail"]["error_type"] == "unsupported_question_type" and "CLM answers" in body["detail"]["message"]
        assert "requests" not in control


async def test_clm_server_down_is_502_and_health_503(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head) as (front, worker, _, _, clm):
        await clm.close()
        started = time.perf_counter()
        body = await ask(front, STATE, {"on": {"type": "noul", "instructions": "Is the stove on?"}}, status=502)
        assert body["detail"]["error_type"] == "backend_unavailable" and "cannot be reached" in body["detail"]["message"]
        response = await worker.get("/health")
        health = await response.json()
        assert response.status == 503 and "external server" in health["detail"]["message"]
        assert time.perf_counter() - started < 10


async def test_embeddings_server_down_is_502_naming_it(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head) as (front, worker, _, emb, _):
        await emb.close()
        body = await ask(front, STATE, {"on": {"type": "noul", "instructions": "Is the stove on?"}}, status=502)
        assert body["detail"]["error_type"] == "backend_unavailable" and "embedder unreachable" in body["detail"]["message"]
        response = await worker.get("/health")
        assert response.status == 503
        assert "embeddings server down" in (await response.json())["detail"]["message"]


async def test_slow_clm_server_is_504_at_the_deadline(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head, deadline_s=0.5) as (front, _, control, _, _):
        control["delay"] = 5.0
        started = time.perf_counter()
        body = await ask(front, STATE, {"on": {"type": "noul", "instructions": "Is the stove on?"}}, status=504)
        assert body["detail"]["error_type"] == "deadline_exceeded"
        assert time.perf_counter() - started < 4.0


async def test_a_wrong_answer_from_clm_is_502_naming_the_question(worker_settings, clm_head):
    async with clm_stack(worker_settings, clm_head) as (front, _, control, _, _):
        control["garble"] = True
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
