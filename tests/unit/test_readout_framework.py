"""Families from the registry: a recipe naming an unknown one, or a checkpoint without what its readout
needs, stops the worker (exit status 2) with a message naming what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from jev_common.checkpoint_files import ServingError
from jev_common.recipe import REPO_ROOT, all_recipes
from jev_worker.backends.registry import BACKENDS
from jev_worker.families.registry import FAMILIES, build_readout, family_class
from jev_worker.loading.checkpoint import load_exactly
from jev_worker.readouts.calibration import Calibration
from jev_worker.serving import build_serving, preflight

from .family_helpers import copy_without, family_recipe, run_worker


@pytest.fixture(scope="module")
def code_dir(tmp_path_factory) -> Path:
    from tools.tiny_checkpoints import make_tiny_code_readout

    return make_tiny_code_readout(tmp_path_factory.mktemp("code"), seed=7, codes=30)


@pytest.fixture(scope="module")
def open_jev_dir(tmp_path_factory) -> Path:
    from tools.tiny_open_jev_checkpoint import make_tiny_open_jev

    return make_tiny_open_jev(tmp_path_factory.mktemp("open-jev"), seed=8)  # the export of a tiny release


def test_worker_exits_naming_an_unknown_family(tmp_path, tiny_recipe, tiny_text_dir):
    done = run_worker(tmp_path, family_recipe(tiny_recipe, "bad", family="no-such-family"), Path(tiny_text_dir))
    assert done.returncode == 2, done.stderr
    assert "unknown family 'no-such-family'" in done.stderr and "label-tokens" in done.stderr


def test_worker_exits_naming_a_missing_checkpoint_file(tmp_path, tiny_recipe, code_dir):
    recipe = family_recipe(tiny_recipe, "tiny-d3", family="code-readout")
    done = run_worker(tmp_path, recipe, copy_without(code_dir, tmp_path, "readout.safetensors"))
    assert done.returncode == 2, done.stderr
    assert "needs readout.safetensors" in done.stderr


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: (d / "decision_config.json").write_text(
                json.dumps(
                    {
                        k: v
                        for k, v in json.loads((d / "decision_config.json").read_text()).items()
                        if k != "temperature"
                    }
                )
            ),
            "decision_config.json has no 'temperature'",
        ),
        (
            lambda d: __import__("safetensors.torch").torch.save_file(
                {"readout": torch.zeros(30, 32)}, str(d / "readout.safetensors")
            ),
            "readout.safetensors has no 'weight'",
        ),
    ],
)
def test_preflight_names_a_missing_key(tmp_path, tiny_recipe, code_dir, mutate, message):
    folder = copy_without(code_dir, tmp_path)
    mutate(folder)
    with pytest.raises(ServingError, match=message):
        preflight(family_recipe(tiny_recipe, "tiny-d3", family="code-readout"), str(folder))


def test_a_noncausal_checkpoint_is_served_by_the_noncausal_backend(tmp_path, tiny_recipe, code_dir):
    """code-readout chooses its backend by the checkpoint's attention_mode (after checking it)."""
    recipe = family_recipe(tiny_recipe, "tiny-pplx", family="code-readout")
    assert build_serving(recipe, str(code_dir)).backend.name == "causal-lm"
    folder = copy_without(code_dir, tmp_path)
    config = json.loads((folder / "decision_config.json").read_text())
    (folder / "decision_config.json").write_text(json.dumps(dict(config, attention_mode="noncausal_full_attention")))
    assert build_serving(recipe, str(folder)).backend.name == "noncausal-lm"
    (folder / "decision_config.json").write_text(json.dumps(dict(config, attention_mode="sliding")))
    with pytest.raises(ServingError, match="attention_mode 'sliding' is not one of"):
        preflight(recipe, str(folder))
    with pytest.raises(ServingError, match="check the checkpoint first"):
        build_readout("code-readout", {}).make_backend()


def test_unknown_family_and_option_are_named(tiny_recipe, tiny_text_dir):
    with pytest.raises(ServingError, match="unknown family 'no-such-family'"):
        preflight(family_recipe(tiny_recipe, "x", family="no-such-family"), tiny_text_dir)
    with pytest.raises(ServingError, match="no option.*head_fil"):
        build_readout("open-jev", {"head_fil": "x.pt"})


def test_scalar_head_requires_its_files_and_refuses_pickled_code(tmp_path, tiny_recipe, open_jev_dir):
    recipe = family_recipe(tiny_recipe, "tiny-open-jev", family="open-jev")
    with pytest.raises(ServingError, match="needs temperature.json"):
        preflight(recipe, str(copy_without(open_jev_dir, tmp_path, "temperature.json")))
    folder = tmp_path / "checkpoint"
    torch.save({"weight": torch.zeros(1, 64), "bias": Calibration()}, folder / "head.pt")  # an object, not tensors
    with pytest.raises(ServingError, match="weights_only=True"):
        preflight(recipe, str(folder))


async def test_in_process_worker_reports_the_missing_file_in_health(tmp_path, worker_settings, tiny_recipe, code_dir):
    from aiohttp.test_utils import TestClient, TestServer

    from jev_worker.app import create_app

    settings = worker_settings(
        recipe=family_recipe(tiny_recipe, "tiny-d3", family="code-readout"),
        model_path=str(copy_without(code_dir, tmp_path, "decision_config.json")),
    )
    async with TestClient(TestServer(create_app(settings, wait_until_ready=True))) as client:
        response = await client.get("/health")
        assert response.status == 503
        assert "needs decision_config.json" in (await response.json())["detail"]["error"]


def test_calibration_values_are_checked():
    with pytest.raises(ServingError, match="temperatures.choice must be a positive finite number"):
        Calibration.from_config({"temperatures": {"choice": 0}}, "decision_config.json")
    with pytest.raises(ServingError, match="unknown question type"):
        Calibration.from_config({"temperatures": {"vote": 1.2}}, "decision_config.json")
    calibration = Calibration.from_config({"temperature": 2.0, "biases": {"noul": 1.0}}, "c.json")
    assert torch.allclose(calibration.apply("set", torch.tensor([1.0, 3.0])), torch.tensor([1.0, 1.5]))
    assert torch.allclose(calibration.apply("choice", torch.tensor([1.0, 3.0])), torch.tensor([0.5, 1.5]))
    by_type = Calibration.from_config(
        {"temperature_by_type": {"choice": 1.3872, "noul": 2.0}, "letter_token_ids": [32]}, "decision_config.json"
    )  # StartLux's file: a missing type keeps T = 1
    assert by_type.temperatures == {"choice": 1.3872, "noul": 2.0}
    assert torch.allclose(by_type.apply("noul", torch.tensor([1.0, 3.0])), torch.tensor([0.5, 1.5]))
    assert torch.equal(by_type.apply("score", torch.tensor([1.0, 3.0])), torch.tensor([1.0, 3.0]))
    with pytest.raises(ServingError, match="temperature_by_type.score must be a positive finite number"):
        Calibration.from_config({"temperature_by_type": {"score": "1.4"}}, "decision_config.json")


def test_readme_served_by_column_matches_every_recipe():
    """README's recipe table names each recipe's family first in its 'served by' cell, with the family's
    readout; unregistered ones say 'not served'."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| [`")}
    for recipe in all_recipes():
        row = next(line for name, line in rows.items() if f"`{recipe.name}`" in name)
        served_by = row.split("|")[4].strip()
        family = recipe.serving.family
        if family not in FAMILIES:
            assert "not served" in served_by, (recipe.name, row)
            continue
        assert served_by.startswith(f"`{family}` ("), (recipe.name, served_by)
        assert f"`{family_class(family).name}`" in served_by, (recipe.name, served_by)


def test_readme_describes_every_backend_and_family():
    """Each generic backend has its row in README's backend table, each family its row (with its readout) in
    the family table."""
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| `")}
    for name in BACKENDS:
        assert f"`{name}`" in rows, f"README has no table row for backend {name!r}"
    for name in FAMILIES:
        assert f"`{name}`" in rows, f"README has no table row for family {name!r}"
        assert f"`{family_class(name).name}` on " in rows[f"`{name}`"], f"README's row for {name!r} names no readout"


def test_load_exactly_names_a_missing_or_extra_tensor():
    layer = torch.nn.Linear(2, 3)
    with pytest.raises(ServingError, match=r"heads.safetensors: the tensors do not fit the head .*missing \['bias'\]"):
        load_exactly(layer, {"weight": torch.ones(3, 2)}, source="heads.safetensors", fits="the head")
    with pytest.raises(ServingError, match=r"unexpected \['scale'\]"):
        load_exactly(
            layer,
            {"weight": torch.ones(3, 2), "bias": torch.zeros(3), "scale": torch.ones(1)},
            source="heads.safetensors",
            fits="the head",
        )
    load_exactly(layer, {"weight": torch.ones(3, 2), "bias": torch.zeros(3)}, source="h", fits="the head")
    assert torch.equal(layer.weight, torch.ones(3, 2))


async def test_a_one_option_choice_is_refused_by_a_family_that_needs_two(worker_settings):
    """The API allows a choice of one option; the label-token readout's upstream layout needs two: 422 too_short
    naming the readout, before any forward (families whose upstream answers one declare min_options = 1)."""
    from .worker_helpers import worker_client

    async with worker_client(worker_settings()) as (client, _):
        response = await client.post(
            "/v1/systemone",
            json={
                "model": "jev-latest",
                "state": "s",
                "questions": {"q": {"type": "choice", "criteria": {"only": None}}},
            },
        )
        body = await response.json()
        assert response.status == 422 and body["detail"][0]["type"] == "too_short"
        assert "at least 2 options" in body["detail"][0]["msg"] and body["detail"][0]["loc"][-1] == "criteria"
