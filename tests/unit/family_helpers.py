"""Serving a family's tiny checkpoint through the real worker and frontend, and plain references.

References never use the worker's prompt builder: the prompt text is written out in the test, rendered
with the tokenizer's own chat template and tokenised in one pass, and the network is a plain forward.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
import yaml
from aiohttp.test_utils import TestClient, TestServer

from jev_common.recipe import REPO_ROOT
from jev_frontend.app import create_app as create_frontend
from jev_frontend.settings import Settings as FrontendSettings

from .worker_helpers import worker_client

TOL = 1e-5


def family_recipe(base, name: str, *, family: str, options: dict | None = None, **prompt):
    """`base` (a Recipe) renamed, served as `family` (its readout chooses the backend), with prompt fields
    replaced."""
    serving = base.serving.model_copy(update={"family": family, "options": options or {}})
    return base.model_copy(update={"name": name, "serving": serving, "prompt": base.prompt.model_copy(update=prompt)})


def copy_without(folder: Path, tmp_path: Path, *missing: str) -> Path:
    """A copy of the checkpoint `folder` without the files named `missing`."""
    out = tmp_path / "checkpoint"
    shutil.copytree(folder, out, ignore=shutil.ignore_patterns(*missing))
    return out


def run_worker(tmp_path: Path, recipe, model_path: Path) -> subprocess.CompletedProcess:
    """`python -m jev_worker` on `recipe` (written to a recipe folder) and `model_path`, until it exits."""
    folder = tmp_path / "recipe"
    folder.mkdir(exist_ok=True)
    (folder / "recipe.yaml").write_text(yaml.safe_dump(recipe.model_dump(mode="json")), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": f"{REPO_ROOT / 'services'}{os.pathsep}{REPO_ROOT}",
        "JEV_RECIPE": str(folder),
        "JEV_MODEL_PATH": str(model_path),
        "JEV_WORKER_PORT": "0",
        "JEV_DEVICE": "cpu",
    }
    return subprocess.run([sys.executable, "-m", "jev_worker"], env=env, capture_output=True, text=True, timeout=120)


@contextlib.asynccontextmanager
async def served(settings):
    """(frontend client, worker client, worker service) for a worker on `settings` behind a real frontend."""
    async with worker_client(settings) as (worker, service):
        url = str(worker.make_url("")).rstrip("/")
        async with TestClient(TestServer(create_frontend(FrontendSettings(backend_url=url, timeout_s=30)))) as front:
            yield front, worker, service


async def ask(client, state, questions: dict, status: int = 200, **extra) -> dict:
    """POST a System One request (`extra`: more top-level fields, e.g. x_coherence); its body, checked for `status`."""
    response = await client.post(
        "/v1/systemone", json={"model": "jev-latest", "state": state, "questions": questions, **extra}
    )
    body = await response.json()
    assert response.status == status, body
    return body


def prompt_ids(tokenizer, system: str | None, content: str) -> list[int]:
    """One-pass ids of `content` as the user turn of the tokenizer's own chat template."""
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.inference_mode()
def last_hidden(backbone, ids: list[int]) -> torch.Tensor:
    """The final hidden state at the last position of a plain forward, in FP32."""
    return backbone(input_ids=torch.tensor([ids])).last_hidden_state[0, -1].float()


def assert_probs(served: dict[str, float], expected: list[float], names: list[str]) -> None:
    assert list(served) == names
    for name, p in zip(names, expected):
        assert abs(served[name] - p) <= TOL, (name, served[name], p)


def prepared_request(builder, kinds: dict, state, questions: dict):
    """(rows, PreparedRequest) `builder` makes of a System One request (state, questions) with the question `kinds`."""
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    request = SystemOneRequest.model_validate({"model": "m", "state": state, "questions": questions})
    rows, plan = rows_for(request.questions, request.state, builder, kinds)
    return rows, builder.prepare("", rows, (), plan)


def upstream_annotate_indices(x, min_len: int = 8):
    """`annotate_indices` as Mapika/decider `systemone.py` and StartLux-Decision `jevfmt.py` both write it (the same
    function in both upstreams), written out here for family references, independent of jev_common.state_text."""
    if isinstance(x, list):
        if len(x) >= min_len:
            return [
                {"_index": i, **upstream_annotate_indices(v, min_len)}
                if isinstance(v, dict)
                else {"_index": i, "value": upstream_annotate_indices(v, min_len)}
                for i, v in enumerate(x)
            ]
        return [upstream_annotate_indices(v, min_len) for v in x]
    if isinstance(x, dict):
        return {k: upstream_annotate_indices(v, min_len) for k, v in x.items()}
    return x


def tiny_recipe_of(name: str, **prompt):
    """Recipe `name` pointed at a local tiny checkpoint (FP32), its prompt fields replaced by `prompt` if given."""
    from jev_common.recipe import load_recipe

    recipe = load_recipe(name)
    model = recipe.model.model_copy(update={"hub_repo": f"test/tiny-{name}", "revision": "local", "dtype": "float32"})
    update = {"name": f"tiny-{name}", "model": model}
    if prompt:
        update["prompt"] = recipe.prompt.model_copy(update=prompt)
    return recipe.model_copy(update=update)


def served_ids(service, state, questions: dict) -> list[list[int]]:
    """The token ids the served worker runs for each row of `questions` about `state` (its own builder and
    question types), whole (prefix + row)."""
    from jev_common.schema import SystemOneRequest
    from jev_worker.questions.plan import rows_for

    request = SystemOneRequest.model_validate({"model": "jev-latest", "state": state, "questions": questions})
    rows, plan = rows_for(request.questions, request.state, service.model.builder, service.model.readout.kinds)
    prepared = service.model.builder.prepare("", rows, (), plan)
    return [list(prepared.full_ids(i)) for i in range(len(rows))]


async def ask_twice(client, state, questions: dict) -> list[dict]:
    """The same request twice, both answered; the second one's state prefix comes from L3."""
    bodies = []
    for attempt in range(2):
        response = await client.post(
            "/v1/systemone", json={"model": "jev-latest", "state": state, "questions": questions}
        )
        body = await response.json()
        assert response.status == 200, body
        if attempt:
            assert "l3=hit" in response.headers["x-jev-cache"]
        bodies.append(body)
    return bodies
