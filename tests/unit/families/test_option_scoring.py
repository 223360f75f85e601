"""option-scoring (readouts/option_scoring.py) on the tiny Llama through the real worker and frontend: every answer
equal to a plain reference written out here (each option's text scored after its own whole prompt by one uncached
forward, minus the same text's score after the content-free state), the answer the same whatever the options'
order, the baseline rows computed once per question across states, the fitted scaling applied only where it was
fitted, and span and set answered."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from jev_common.checkpoint_files import ServingError

from ..family_helpers import ask, assert_probs, family_recipe, prompt_ids, served

STATE = "The kettle is whistling and steam comes out of its spout."
QUESTIONS = {
    "hot": {"type": "noul", "instructions": "Is the water hot?", "criteria": {"true": "boiling"}},
    "what": {
        "type": "choice",
        "instructions": "What is it doing?",
        "criteria": {"boiling": None, "cooling": "losing heat", "freezing": None},
    },
    "level": {"type": "score", "instructions": "How hot?", "criteria": ["cold", "warm", "hot"]},
}


class Reference:
    """Each answer text's summed log-probability after its whole prompt (one plain forward each)."""

    def __init__(self, folder: str, system: str):
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        self.system = system

    @torch.inference_mode()
    def score(self, state: str, content: str, answer: str) -> float:
        context = prompt_ids(self.tokenizer, self.system, f"State:\n{state}\n\n{content}")
        answer_ids = self.tokenizer.encode(answer, add_special_tokens=False)
        logits = self.model(input_ids=torch.tensor([context + answer_ids])).logits[0].float().log_softmax(-1)
        return sum(logits[len(context) - 1 + i, t].item() for i, t in enumerate(answer_ids))

    def probabilities(self, state: str, content: str, answers: list[str], baseline: bool = True) -> list[float]:
        scores = [self.score(state, content, a) - (self.score("N/A", content, a) if baseline else 0.0) for a in answers]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        return [w / sum(weights) for w in weights]


def recipe_of(tiny_recipe, **options):
    return family_recipe(tiny_recipe, "tiny-option-scoring", family="option-scoring", options=options)


async def test_answers_equal_the_plain_pmi_reference(worker_settings, tiny_recipe, tiny_text_dir):
    recipe = recipe_of(tiny_recipe)
    ref = Reference(tiny_text_dir, recipe.prompt.system)
    async with served(worker_settings(recipe=recipe)) as (front, _worker, _service):
        answers = (await ask(front, STATE, QUESTIONS))["answers"]
        models = (await (await front.get("/v1/models")).json())["models"]
    assert {m["x_readout"] for m in models} == {"option-scoring"}  # /v1/models says which readout answers
    noul = ref.probabilities(STATE, "Question: Is the water hot?\nYes means: boiling\n", ["Yes", "No"])
    assert abs(answers["hot"]["noul"] - noul[0]) <= 1e-5
    listing = "Question: What is it doing?\nOptions:\nboiling\ncooling: losing heat\nfreezing\n"
    want = ref.probabilities(STATE, listing, ["boiling", "cooling", "freezing"])
    assert_probs(answers["what"]["probabilities"], want, ["boiling", "cooling", "freezing"])
    assert answers["what"]["choice"] == ["boiling", "cooling", "freezing"][want.index(max(want))]
    want = ref.probabilities(STATE, "Question: How hot?\n", ["cold", "warm", "hot"])
    assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2"])
    assert abs(answers["level"]["score"] - sum(i * p for i, p in enumerate(want))) <= 1e-5


async def test_without_a_baseline_the_raw_scores_answer(worker_settings, tiny_recipe, tiny_text_dir):
    recipe = recipe_of(tiny_recipe, baseline="none")
    ref = Reference(tiny_text_dir, recipe.prompt.system)
    async with served(worker_settings(recipe=recipe)) as (front, _worker, service):
        answers = (await ask(front, STATE, QUESTIONS))["answers"]
        assert service.model.readout.baselines.computed == 0
    want = ref.probabilities(STATE, "Question: How hot?\n", ["cold", "warm", "hot"], baseline=False)
    assert_probs(answers["level"]["probabilities"], want, ["0", "1", "2"])


async def test_the_answer_does_not_depend_on_the_options_order(worker_settings, tiny_recipe):
    criteria = {"kettle": None, "teapot": "for brewing", "oven": None, "fridge": "keeps food cold"}
    async with served(worker_settings(recipe=recipe_of(tiny_recipe))) as (front, _worker, _service):
        seen = []
        for order in itertools.islice(itertools.permutations(criteria), 0, 24, 5):
            question = {"type": "choice", "instructions": "What whistles?", "criteria": {k: criteria[k] for k in order}}
            seen.append((await ask(front, STATE, {"q": question}))["answers"]["q"])
    for answer in seen[1:]:
        assert answer["choice"] == seen[0]["choice"]
        for name in criteria:
            assert answer["probabilities"][name] == seen[0]["probabilities"][name]  # the same rows, bit for bit


async def test_each_baseline_row_is_computed_once_across_states(worker_settings, tiny_recipe):
    async with served(worker_settings(recipe=recipe_of(tiny_recipe))) as (front, _worker, service):
        baselines = service.model.readout.baselines
        warmed = baselines.computed  # the worker's own warm-up request's rows
        first = (await ask(front, STATE, QUESTIONS))["answers"]
        rows = 2 + 3 + 3  # yes/no, the choice's options, the levels
        assert baselines.computed == warmed + rows
        await ask(front, "The kettle is cold and the kitchen is dark.", QUESTIONS)
        again = (await ask(front, STATE + " ", QUESTIONS))["answers"]
        assert baselines.computed == warmed + rows  # the other states read the kept scores
        health = await (await front.get("/health")).json()
    assert abs(again["hot"]["noul"] - first["hot"]["noul"]) < 0.5  # answered, from the same baselines
    assert "option-scoring" in json.dumps(health)


async def test_span_and_set_are_answered(worker_settings, tiny_recipe):
    state = "Alice met Bob in Paris."
    async with served(worker_settings(recipe=recipe_of(tiny_recipe))) as (front, _worker, _service):
        answers = (
            await ask(
                front,
                state,
                {
                    "where": {"type": "span", "instructions": "Where did they meet?", "criteria": ["Alice", "Paris"]},
                    "facts": {"type": "set", "criteria": {"They met": None, "Bob is a city": "a place"}},
                },
            )
        )["answers"]
    span = answers["where"]
    assert span["span"]["text"] in ("Alice", "Paris")
    assert state[span["span"]["start"] : span["span"]["end"]] == span["span"]["text"]
    assert abs(sum(span["probabilities"].values()) - 1) <= 1e-6
    assert set(answers["facts"]["probabilities"]) == {"They met", "Bob is a city"}
    assert all(0 <= p <= 1 for p in answers["facts"]["probabilities"].values())


async def test_a_fitted_scaling_applies_only_to_the_checkpoint_and_layout_it_was_fitted_on(
    worker_settings, tiny_recipe, tmp_path
):
    from jev_worker.readouts.option_scoring import OptionScoring

    folder = tmp_path / "recipe"
    folder.mkdir()
    recipe = recipe_of(tiny_recipe, calibration_file="option_scoring.json")
    recipe._folder = folder
    settings = worker_settings(recipe=recipe)
    block = {"types": {"noul": {"weight": 0.5, "temperature": 2.0, "bias": 0.3}}, "checkpoint": "other"}
    (folder / "option_scoring.json").write_text(json.dumps({"option_scoring": block}))
    async with served(settings) as (_front, _worker, service):
        readout = service.model.readout
        assert readout.scaling("noul").temperature == 1.0 and "not applied" in readout.scaling_unused
        block.update(checkpoint=service.model.builder.identity, layout=readout.layout(service.model.builder))
    (folder / "option_scoring.json").write_text(json.dumps({"option_scoring": block}))
    async with served(settings) as (_front, _worker, service):
        readout = service.model.readout
        assert readout.scaling("noul").describe() == {"weight": 0.5, "temperature": 2.0, "bias": 0.3}
        assert readout.scaling("set").temperature == 2.0  # set takes noul's
        assert readout.scaling("choice").temperature == 1.0
    with pytest.raises(ServingError, match="baseline"):
        OptionScoring(options={"baseline": "sideways"})
