"""The package gate: a checkpoint's own code is imported only at a pinned commit whose code files all
match the recipe's sha256 manifest, checked before any of it runs. The package here is the tiny Llama
with a `modeling_gated.py` its config names in `auto_map` (as a remote-code package does); importing it
leaves a mark, so a refused package is shown never to have run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from jev_common.checkpoint_files import ServingError
from jev_worker.loading.package_gate import manifest_of
from jev_worker.serving import preflight

from .family_helpers import ask, family_recipe, served

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODELING = """import os

from transformers import LlamaForCausalLM

with open(os.environ["JEV_TEST_REMOTE_CODE_MARK"], "a") as mark:
    mark.write("imported\\n")


class GatedForCausalLM(LlamaForCausalLM):
    pass
"""


@pytest.fixture
def package(tmp_path, tiny_text_dir) -> Path:
    folder = tmp_path / "package"
    shutil.copytree(tiny_text_dir, folder)
    (folder / "modeling_gated.py").write_text(MODELING, encoding="utf-8")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_gated.GatedForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.fixture
def mark(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "imported.mark"
    monkeypatch.setenv("JEV_TEST_REMOTE_CODE_MARK", str(path))
    return path


def gated(tiny_recipe, package: Path, revision: str = COMMIT, manifest: dict | None = None):
    recipe = family_recipe(tiny_recipe, "tiny-gated", family="label-tokens")
    model = recipe.model.model_copy(
        update={
            "trust_remote_code": True,
            "revision": revision,
            "remote_code_manifest": manifest_of(package) if manifest is None else manifest,
        }
    )
    return recipe.model_copy(update={"model": model})


def test_gate_passes_a_pinned_package_and_names_every_refusal(tiny_recipe, package):
    preflight(gated(tiny_recipe, package), str(package))
    with pytest.raises(ServingError, match="'unverified-pin-at-first-download' is not a 40-hex commit"):
        preflight(gated(tiny_recipe, package, revision="unverified-pin-at-first-download"), str(package))
    with pytest.raises(ServingError, match="no model.remote_code_manifest"):
        preflight(gated(tiny_recipe, package, manifest={}), str(package))
    with pytest.raises(ServingError, match="outside the checkpoint folder"):
        preflight(gated(tiny_recipe, package, manifest={"../x.py": "0" * 64}), str(package))
    recipe = gated(tiny_recipe, package)
    (package / "helpers.py").write_text("X = 1\n")
    with pytest.raises(ServingError, match="not in the manifest: helpers.py"):
        preflight(recipe, str(package))
    (package / "helpers.py").unlink()
    (package / "modeling_gated.py").unlink()
    with pytest.raises(ServingError, match="modeling_gated.py .in the manifest. is missing"):
        preflight(recipe, str(package))


async def test_a_tampered_file_is_refused_before_it_is_imported(worker_settings, tiny_recipe, package, mark):
    recipe = gated(tiny_recipe, package)
    with open(package / "modeling_gated.py", "a") as handle:
        handle.write("\nprint('tampered')\n")
    with pytest.raises(ServingError, match="modeling_gated.py has sha256 .*, the manifest pins"):
        preflight(recipe, str(package))
    from aiohttp.test_utils import TestClient, TestServer

    from jev_worker.app import SERVICE, create_app

    app = create_app(worker_settings(recipe=recipe, model_path=str(package)), wait_until_ready=True)
    async with TestClient(TestServer(app)) as client:
        assert app[SERVICE].state == "unavailable"
        health = await client.get("/health")
        assert health.status == 503 and "the manifest pins" in (await health.json())["detail"]["message"]
    assert not mark.exists()  # the package's code never ran


async def test_a_pinned_package_is_imported_and_served(worker_settings, tiny_recipe, package, mark):
    recipe = gated(tiny_recipe, package)
    async with served(worker_settings(recipe=recipe, model_path=str(package))) as (front, _, service):
        assert type(service.model.loaded.model).__name__ == "GatedForCausalLM"
        body = await ask(front, "The lamp is on.", {"on": {"type": "noul", "instructions": "Is the lamp on?"}})
        assert 0 <= body["answers"]["on"]["noul"] <= 1
    assert mark.read_text().startswith("imported")
