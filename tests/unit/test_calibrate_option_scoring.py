"""tools/calibrate_option_scoring.py: the committed labelled set, the grid fit, and the tool through a tiny worker
whose file the option-scoring readout then applies."""

from __future__ import annotations

import json
from collections import Counter

import yaml

from tools.calibrate_option_scoring import DEFAULT_SET, fit, gold_index, read_set


def test_the_calibration_set_is_labelled_balanced_and_apart_from_the_benchmark_s():
    cases, digest = read_set(DEFAULT_SET)
    assert len(cases) == 40 and len(digest) == 64
    types, noul = Counter(), Counter()
    for case in cases:
        for qid, gold in case["gold"].items():
            question = case["questions"][qid]
            types[question["type"]] += 1
            noul.update([gold] if question["type"] == "noul" else [])
            assert 0 <= gold_index(question, gold) < (2 if question["type"] == "noul" else len(question["criteria"]))
    assert types == {"noul": 40, "choice": 40, "score": 40} and noul == {True: 20, False: 20}
    everyday = (DEFAULT_SET.parents[2] / "benchmarks" / "data" / "everyday-210.jsonl").read_text()
    assert not {c["state"] for c in cases} & {json.loads(line)["state"] for line in everyday.splitlines()}


def test_the_fit_takes_the_baseline_away_when_it_is_what_misleads():
    # the gold option (0) scores lower raw, because its text is unlikely whatever the state; its baseline says so
    samples = [([[-5.0, -6.0], [-4.0, -2.0]], 0)] * 10
    assert fit(samples, yes_no=False, calibrated=True)["scaling"]["weight"] == 1.0
    assert fit(samples, yes_no=False, calibrated=False)["scaling"]["weight"] == 0.0
    yes_biased = [([[-1.0], [-1.0]], 1)] * 10  # no side always right: the bias moves the yes side down
    assert fit(yes_biased, yes_no=True, calibrated=False)["scaling"]["bias"] < 0


async def test_the_fitted_scaling_is_applied_by_the_worker_it_was_fitted_on(worker_settings, tiny_recipe, tmp_path):
    from jev_common.recipe import load_recipe
    from tests.unit.family_helpers import family_recipe, served
    from tools.calibrate_option_scoring import calibrate

    recipe = family_recipe(tiny_recipe, "tiny-scores", family="option-scoring", options={"calibration_file": "s.json"})
    folder = tmp_path / "recipe"
    folder.mkdir()
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")))
    (tmp_path / "set.jsonl").write_text("\n".join(DEFAULT_SET.read_text().splitlines()[:4]) + "\n")
    settings = worker_settings(recipe=load_recipe(str(folder)))
    result = await calibrate(settings, tmp_path / "set.jsonl")
    block = result["block"]
    assert set(block["types"]) == {"noul", "choice", "score"} and block["calibration_set"]["questions"] == 12
    (folder / "s.json").write_text(json.dumps({"option_scoring": block}))
    async with served(settings) as (_front, _worker, service):
        readout = service.model.readout
        assert readout.scaling_source == "recipes/recipe/s.json" and readout.scaling_unused is None
        assert readout.scaling("noul").describe() == {"bias": 0.0, **block["types"]["noul"]}
