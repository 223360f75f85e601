"""Every recipe folder: recipe.yaml validates, example-request.json validates, README and profile exist."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jev_common.recipe import RECIPES_DIR, Recipe, load_recipe
from jev_common.schema import SystemOneRequest
from jev_worker.families.registry import FAMILIES as SERVED_FAMILIES, family_class

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = sorted(p.parent for p in RECIPES_DIR.glob("*/recipe.yaml"))
UNVERIFIED = "unverified-pin-at-first-download"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
COMPOSE_PROFILES = {
    p
    for svc in yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"].values()
    for p in svc.get("profiles") or []
}
FAMILIES = [
    "JEV",
    "Laya",
    "Cua-S1",
    "Valen",
    "Decider",
    "Open-Jev",
    "StartLux",
    "JEMM",
    "OmniJev",
    "CLM",
    "pplx-decider",
    "D3",
    "Vela",
    "Clef",
    "LFM2.5",
    "SmolLM2",
]


def test_there_are_recipes_for_every_family():
    families = {load_recipe(str(f)).family for f in FOLDERS}
    assert set(FAMILIES) <= families, sorted(set(FAMILIES) - families)
    assert len(FOLDERS) >= 20


def test_recipe_names_are_unique_and_match_their_folder():
    names = [load_recipe(str(f)).name for f in FOLDERS]
    assert len(names) == len(set(names))
    for folder, name in zip(FOLDERS, names):
        assert folder.name == name
        assert re.fullmatch(r"[a-z0-9]+([.-][a-z0-9]+)*", name), f"{name} is not lowercase-kebab"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_recipe_validates_and_pins_honestly(folder):
    raw = yaml.safe_load((folder / "recipe.yaml").read_text())
    recipe = Recipe.model_validate(raw)
    assert recipe.compose_profile in COMPOSE_PROFILES, f"profile {recipe.compose_profile} not in docker-compose.yml"
    revision = recipe.model.revision
    if recipe.model.source == "hub":
        assert COMMIT.match(revision) or revision == UNVERIFIED, f"{revision!r} is neither a commit nor unverified"
    else:
        assert recipe.model.source.startswith("pypi:") and "==" in revision
    assert recipe.check.strip()
    assert len(set(recipe.verbalizer.labels)) == len(recipe.verbalizer.labels)
    if recipe.model.trust_remote_code:  # else the package gate refuses it at every start
        assert COMMIT.match(revision) and recipe.model.remote_code_manifest, (
            "trust_remote_code needs a pinned commit and a remote_code_manifest"
        )


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_example_request_validates(folder):
    """The example is a request the recipe's readout answers: its question types, and an image where it reads them."""
    payload = json.loads((folder / "example-request.json").read_text())
    request = SystemOneRequest.model_validate(payload)  # the System One envelope
    recipe = load_recipe(str(folder))
    readout = (
        family_class(recipe.serving.family) if recipe.serving.family in SERVED_FAMILIES else None
    )  # not served: README says so
    if readout is not None:
        assert {q.type for q in request.questions.values()} <= readout.question_types
    if recipe.model.modality == "vision-language":
        assert request.assets, "a vision-language recipe's example carries an image"
        assert all(ref in json.dumps(request.state) for ref in request.assets), "every image is placed in the state"
    else:
        assert not request.assets
    for question in request.questions.values():
        if question.type in ("choice", "span", "set"):
            assert len(question.criteria) <= recipe.verbalizer.max_codes


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: p.name)
def test_readme_documents_setup_launch_request_and_comparison(folder):
    text = (folder / "README.md").read_text()
    recipe = load_recipe(str(folder))
    for heading in (
        "## Setup",
        "## Launch",
        "## Example request",
        "## What to compare against",
        "## Revision",
        "## Verified on a tiny checkpoint",
    ):
        assert heading in text, f"{folder.name}: README lacks {heading}"
    verified = text.split("## Verified on a tiny checkpoint", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"tests/unit/(families/)?test_\w+\.py", verified), f"{folder.name}: which test verifies it?"
    assert re.search(r"Needs the real", verified), f"{folder.name}: what needs the real weights?"
    assert recipe.model.hub_repo in text and recipe.model.revision in text
    assert f"--profile {recipe.compose_profile}" in text
    if recipe.model.revision == UNVERIFIED:
        assert re.search(r"UNVERIFIED|NOT FOUND", text), "an unverified pin must say so in the README"


@pytest.mark.parametrize("wrapper", sorted(RECIPES_DIR.glob("*/export.py")), ids=lambda p: p.parent.name)
def test_export_wrappers_run(wrapper):
    result = subprocess.run([sys.executable, str(wrapper), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "--base" in result.stdout and "--out" in result.stdout
    assert wrapper.parent.name in result.stdout


def test_deploy_doc_profile_table_matches_the_recipes():
    """docs/deploy.md's profile table gives each recipe's profile and pinned revision as recipe.yaml has them."""
    rows = re.findall(
        r"^\| `([^`]+)` \| `([^`]+)` \|[^|]*\|[^|]*\| `([^`]+)`[^|]*\|",
        (ROOT / "docs/deploy.md").read_text(),
        re.MULTILINE,
    )
    names = {folder.name for folder in FOLDERS}
    rows = [row for row in rows if row[1] in names]  # the file's other tables (build args) have this shape too
    assert {row[1] for row in rows} == names
    for profile, name, revision in rows:
        recipe = load_recipe(str(RECIPES_DIR / name))
        assert recipe.compose_profile == profile, name
        pinned = recipe.model.revision
        assert revision == (pinned[:12] + "…" if COMMIT.match(pinned) else pinned), name
