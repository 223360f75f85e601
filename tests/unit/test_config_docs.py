"""One config module per service owns every env name, alias, default and doc line; the upstream
JEV-VL names are honoured with the upstream defaults; the doc tables are rendered from the modules."""
from __future__ import annotations

import os

import pytest

from jev_common.config import EnvTable
from jev_frontend import settings as frontend_settings
from jev_preencoder import settings as preencoder_settings
from jev_worker import settings as worker_settings
from tools import env_tables

UPSTREAM_WORKER = ("JEV_VL_HOST", "JEV_VL_PORT", "JEV_VL_MODEL", "JEV_VL_IMGCACHE", "JEV_VL_CACHE", "JEV_VL_L1",
                   "JEV_VL_L2", "JEV_VL_L3", "JEV_VL_L1_MAX", "JEV_VL_L2_BYTES", "JEV_VL_L3_BYTES")


@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("JEV_", "OMNI_JEV_")) and key != "JEV_RECIPES_DIR":
            monkeypatch.delenv(key)
    return monkeypatch


class Recording(dict):
    """os.environ stand-in that remembers every name looked up."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read: set[str] = set()

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


def _env_names(names: set[str]) -> set[str]:
    return {n for n in names if n.startswith(("JEV_", "OMNI_JEV_"))}


@pytest.mark.parametrize("module, build", [
    (worker_settings, lambda: worker_settings.WorkerSettings.from_env()),
    (frontend_settings, lambda: frontend_settings.Settings.from_env()),
    (preencoder_settings, lambda: preencoder_settings.PreencoderSettings.from_env()),
])
def test_every_name_a_service_reads_is_in_its_table(clean_env, module, build):
    environ = Recording({k: v for k, v in os.environ.items()})
    clean_env.setattr(os, "environ", environ)
    build()
    table: EnvTable = module.ENV
    unknown = _env_names(environ.read) - table.names()
    assert not unknown, f"read but not documented in {table.service}.ENV: {sorted(unknown)}"
    # and every documented name (but the import-time ones) is actually read
    unread = table.names() - _env_names(environ.read) - {"JEV_LOG_LEVEL", "JEV_RECIPES_DIR"}
    assert not unread, f"documented but never read: {sorted(unread)}"


def test_docs_tables_are_rendered_from_the_settings_modules():
    assert env_tables.main(["--check"]) == 0
    readme = (env_tables.ROOT / "README.md").read_text()
    assert env_tables.blocks(readme) == ["worker", "frontend", "preencoder"]
    assert env_tables.blocks((env_tables.ROOT / "docs" / "frontend.md").read_text()) == ["frontend"]
    assert env_tables.blocks((env_tables.ROOT / "docs" / "images.md").read_text()) == ["preencoder"]
    for name in UPSTREAM_WORKER + ("OMNI_JEV_BIND", "OMNI_JEV_BACKEND_URL"):
        assert f"`{name}`" in readme, name


def test_render_replaces_only_between_markers():
    known = {"frontend": frontend_settings.ENV}
    text = "before\n<!-- env-table: frontend -->\n| stale |\n<!-- /env-table -->\nafter\n"
    out = env_tables.render(text, known)
    assert out.startswith("before\n<!-- env-table: frontend -->\n| env | default | meaning |")
    assert out.endswith("<!-- /env-table -->\nafter\n") and "| stale |" not in out
    with pytest.raises(KeyError, match="unknown service"):
        env_tables.render("<!-- env-table: nope -->\n<!-- /env-table -->", known)


def test_worker_defaults_without_upstream_names(clean_env):
    s = worker_settings.WorkerSettings.from_env()
    assert (s.recipe.name, s.host, s.port) == ("smollm2-135m-cpu", "0.0.0.0", 8000)
    assert s.max_wait_ms == s.recipe.batching.max_wait_ms == 2.0  # README once said 0


def test_worker_reads_the_upstream_names_with_upstream_defaults(clean_env, tmp_path):
    clean_env.setenv("JEV_VL_MODEL", str(tmp_path / "merged"))
    clean_env.setenv("JEV_VL_CACHE", "0")
    s = worker_settings.WorkerSettings.from_env()
    assert (s.recipe.name, s.host, s.port) == ("jev-27b-vl", "127.0.0.1", 8001)
    assert s.model_path == str(tmp_path / "merged")
    assert s.cache.enabled is False and not (s.cache.l1_on or s.cache.l2_on or s.cache.l3_on)
    assert s.worker_url.endswith("://127.0.0.1:8001")

    for key, value in {"JEV_VL_CACHE": "1", "JEV_VL_HOST": "127.0.0.2", "JEV_VL_PORT": "9001",
                       "JEV_VL_IMGCACHE": str(tmp_path / "assets"), "JEV_VL_L1_MAX": "7",
                       "JEV_VL_L2_BYTES": "1M", "JEV_VL_L3_BYTES": "3M", "JEV_VL_L2": "0"}.items():
        clean_env.setenv(key, value)
    s = worker_settings.WorkerSettings.from_env()
    assert (s.host, s.port, s.asset_dir) == ("127.0.0.2", 9001, str(tmp_path / "assets"))
    assert (s.cache.l1_max, s.cache.l2_bytes, s.cache.l3_bytes) == (7, 0, 3 << 20)  # L2 switched off
    clean_env.setenv("JEV_VL_L2", "1")
    clean_env.setenv("JEV_VL_L1", "0")
    clean_env.setenv("JEV_VL_L3", "false")
    s = worker_settings.WorkerSettings.from_env()
    assert (s.cache.l1_max, s.cache.l2_bytes, s.cache.l3_bytes) == (0, 1 << 20, 0)
    # our own names win over the aliases
    clean_env.setenv("JEV_WORKER_PORT", "8123")
    clean_env.setenv("JEV_RECIPE", "smollm2-135m-cpu")
    s = worker_settings.WorkerSettings.from_env()
    assert (s.port, s.recipe.name) == (8123, "smollm2-135m-cpu")
    clean_env.setenv("JEV_VL_L1_MAX", "many")
    with pytest.raises(ValueError, match="JEV_VL_L1_MAX"):  # the error names the variable that was set
        worker_settings.WorkerSettings.from_env()


def test_frontend_reads_the_upstream_names(clean_env):
    s = frontend_settings.Settings.from_env()
    assert (s.host, s.port, s.backend_url) == ("0.0.0.0", 8080, "http://127.0.0.1:8000")
    clean_env.setenv("OMNI_JEV_BACKEND_URL", "http://127.0.0.1:8001")
    s = frontend_settings.Settings.from_env()
    assert (s.host, s.port, s.backend_url) == ("127.0.0.1", 8080, "http://127.0.0.1:8001")  # upstream default
    clean_env.setenv("OMNI_JEV_BIND", "127.0.0.1:9090")
    s = frontend_settings.Settings.from_env()
    assert (s.host, s.port) == ("127.0.0.1", 9090)
    clean_env.setenv("OMNI_JEV_BIND", "[::1]:9091")
    assert (frontend_settings.Settings.from_env().host, frontend_settings.Settings.from_env().port) == ("::1", 9091)
    clean_env.setenv("JEV_FRONTEND_PORT", "9092")
    assert frontend_settings.Settings.from_env().port == 9092
    clean_env.setenv("OMNI_JEV_BIND", "localhost")
    with pytest.raises(ValueError, match="OMNI_JEV_BIND"):
        frontend_settings.Settings.from_env()


def test_preencoder_asset_dir_alias(clean_env, tmp_path):
    clean_env.setenv("JEV_VL_IMGCACHE", str(tmp_path))
    assert preencoder_settings.PreencoderSettings.from_env().asset_dir == str(tmp_path)
