"""Shared fixtures: tiny random checkpoints (built once per session) and worker settings for them."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


@pytest.fixture(scope="session")
def tiny_text_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_text

    return str(make_tiny_text(tmp_path_factory.mktemp("tiny-text")))


@pytest.fixture(scope="session")
def tiny_tied_dir(tmp_path_factory) -> str:
    from tools.tiny_checkpoints import make_tiny_text

    return str(make_tiny_text(tmp_path_factory.mktemp("tiny-tied"), seed=1, tie_word_embeddings=True))


@pytest.fixture(scope="session")
def tiny_recipe():
    """The default recipe's prompt and verbalizer, pointed at a local tiny checkpoint (without the embedded model's
    position prior, which is that checkpoint's)."""
    from jev_common.recipe import ServingSpec, load_recipe

    recipe = load_recipe()
    model = recipe.model.model_copy(
        update={
            "hub_repo": "test/tiny-llama",
            "revision": "local",
            "source": "hub",
            "gguf_file": None,
            "dtype": "float32",
        }
    )
    return recipe.model_copy(update={"name": "tiny-llama", "model": model, "serving": ServingSpec()})


@pytest.fixture
def worker_settings(tiny_text_dir, tiny_recipe):
    """Factory: WorkerSettings for the tiny text model; keyword overrides as in dataclasses.replace."""
    from jev_worker.settings import CacheSettings, WorkerSettings

    def make(**overrides):
        cache = overrides.pop("cache", CacheSettings(True, 1024, 64 << 20, 64 << 20))
        base = dict(
            recipe=tiny_recipe,
            model_path=tiny_text_dir,
            device="cpu",
            dtype="float32",
            redis_url="redis://127.0.0.1:1/0",
            asset_dir="/nonexistent",
            worker_id="test",
        )
        base.update(overrides)
        return WorkerSettings(cache=cache, **base)

    return make
