"""One config module per service owns every env name, alias, default and doc line; the upstream
JEV-VL names are honoured with the upstream defaults; the doc tables are rendered from the modules;
each default is written once (the settings dataclasses and from_env take it from the EnvVar)."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from jev_common import config
from jev_common.config import COMPUTED, EnvTable, EnvVar
from jev_common.recipe import BatchingSpec, CacheSpec, ModelSpec
from jev_frontend import settings as frontend_settings
from jev_preencoder import settings as preencoder_settings
from jev_worker import settings as worker_settings
from tools import env_tables

UPSTREAM_WORKER = (
    "JEV_VL_HOST",
    "JEV_VL_PORT",
    "JEV_VL_MODEL",
    "JEV_VL_IMGCACHE",
    "JEV_VL_CACHE",
    "JEV_VL_L1",
    "JEV_VL_L2",
    "JEV_VL_L3",
    "JEV_VL_L1_MAX",
    "JEV_VL_L2_BYTES",
    "JEV_VL_L3_BYTES",
)


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


@pytest.mark.parametrize(
    "module, build",
    [
        (worker_settings, lambda: worker_settings.WorkerSettings.from_env()),
        (frontend_settings, lambda: frontend_settings.Settings.from_env()),
        (preencoder_settings, lambda: preencoder_settings.PreencoderSettings.from_env()),
    ],
)
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
    assert env_tables.blocks((env_tables.ROOT / "docs" / "CONTRACTS.md").read_text()) == ["map", "errors"]
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
    assert s.max_wait_ms == s.recipe.batching.max_wait_ms == 0.0  # no pause on an idle device (issue 42)


def test_worker_reads_the_upstream_names_with_upstream_defaults(clean_env, tmp_path):
    clean_env.setenv("JEV_VL_MODEL", str(tmp_path / "merged"))
    clean_env.setenv("JEV_VL_CACHE", "0")
    s = worker_settings.WorkerSettings.from_env()
    assert (s.recipe.name, s.host, s.port) == ("jev-27b-vl", "127.0.0.1", 8001)
    assert s.model_path == str(tmp_path / "merged")
    assert s.cache.enabled is False and not (s.cache.l1_on or s.cache.l2_on or s.cache.l3_on)
    assert s.worker_url.endswith("://127.0.0.1:8001")

    for key, value in {
        "JEV_VL_CACHE": "1",
        "JEV_VL_HOST": "127.0.0.2",
        "JEV_VL_PORT": "9001",
        "JEV_VL_IMGCACHE": str(tmp_path / "assets"),
        "JEV_VL_L1_MAX": "7",
        "JEV_VL_L2_BYTES": "1M",
        "JEV_VL_L3_BYTES": "3M",
        "JEV_VL_L2": "0",
    }.items():
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


# --- each default is written once ---------------------------------------------------------------------

SERVICES = {
    # service: (settings class, ENV, variables not bound to a field, fields whose default is not an ENV default)
    "worker": (
        worker_settings.WorkerSettings,
        worker_settings.ENV,
        {
            "JEV_RECIPE",
            "JEV_CACHE",
            "JEV_CACHE_L1",
            "JEV_CACHE_L2",
            "JEV_CACHE_L3",
            "JEV_CACHE_L1_MAX",
            "JEV_CACHE_L2_BYTES",
            "JEV_CACHE_L3_BYTES",
            "JEV_WORKER_ID",
            "JEV_WORKER_URL",
            "JEV_LOG_LEVEL",
            "JEV_RECIPES_DIR",
            "JEV_CODE_VERSION",
            "JEV_INTERNAL_TOKEN_FILE",
        },
        {"cache", "worker_id", "worker_url", "code_version"},
    ),  # cache: checked below; the others computed
    "frontend": (
        frontend_settings.Settings,
        frontend_settings.ENV,
        {"OMNI_JEV_BIND", "JEV_LOG_LEVEL", "JEV_INTERNAL_TOKEN_FILE"},
        set(),
    ),  # the file: read into tokens
    "preencoder": (
        preencoder_settings.PreencoderSettings,
        preencoder_settings.ENV,
        {"JEV_LOG_LEVEL", "JEV_RECIPES_DIR"},
        set(),
    ),
}
# defaults the docs show by a declared text, because they are not a constant (or, for "—" / "recipe",
# to keep the table as written); adding one here is a deliberate choice
SHOWN = {
    "worker": {
        "JEV_MODEL_PATH",
        "JEV_CACHE_L1_MAX",
        "JEV_CACHE_L2_BYTES",
        "JEV_CACHE_L3_BYTES",
        "JEV_WORKER_ID",
        "JEV_WORKER_URL",
        "JEV_RECIPES_DIR",
        "JEV_CODE_VERSION",
    },
    "frontend": {"OMNI_JEV_BIND", "JEV_DEFAULT_MODEL"},
    "preencoder": {"JEV_DTYPE", "JEV_LOG_LEVEL", "JEV_RECIPES_DIR"},
}


@pytest.mark.parametrize("service", SERVICES)
def test_settings_field_defaults_are_the_env_defaults(service):
    cls, table, unbound, own = SERVICES[service]
    bound = {}
    for f in dataclasses.fields(cls):
        if "env" in f.metadata:
            var = table[f.metadata["env"]]
            assert f.default == var.default and type(f.default) is type(var.default), (f.name, var.name)
            assert var.name not in bound, f"{var.name} is bound to {bound.get(var.name)} and {f.name}"
            bound[var.name] = f.name
        elif f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING:
            # a literal default restates (or contradicts) the table: take it from the EnvVar (`.field()`)
            assert f.name in own, f"{cls.__name__}.{f.name} has a default of its own; use ENV[...].field()"
    assert set(bound) == {var.name for var in table} - unbound, "every variable (but the declared ones) sets a field"


def test_worker_cache_default_is_the_env_defaults_and_the_recipe_schema():
    env = worker_settings.ENV
    default = next(f.default for f in dataclasses.fields(worker_settings.WorkerSettings) if f.name == "cache")
    assert default == worker_settings.CacheSettings(
        env["JEV_CACHE"].default,
        env["JEV_CACHE_L1_MAX"].default,
        env["JEV_CACHE_L2_BYTES"].default,
        env["JEV_CACHE_L3_BYTES"].default,
    )
    spec = CacheSpec()
    assert (default.l1_max, default.l2_bytes, default.l3_bytes) == (
        spec.l1_max,
        config.parse_bytes(str(spec.l2_bytes)),
        config.parse_bytes(str(spec.l3_bytes)),
    )
    # what the docs call "recipe (`x`)" is the recipe schema's default
    assert env["JEV_DTYPE"].default == ModelSpec.model_fields["dtype"].default
    assert (env["JEV_BATCHING"].default, env["JEV_MAX_BATCH_ROWS"].default, env["JEV_MAX_WAIT_MS"].default) == (
        BatchingSpec().enabled,
        BatchingSpec().max_batch_rows,
        BatchingSpec().max_wait_ms,
    )


@pytest.mark.parametrize("service", SERVICES)
def test_from_env_unset_gives_the_declared_defaults(clean_env, service):
    cls, table, _, own = SERVICES[service]
    settings = cls.from_env()
    recipe = getattr(settings, "recipe", None)
    for f in dataclasses.fields(cls):
        if "env" not in f.metadata:
            continue
        var = table[f.metadata["env"]]
        if var.from_recipe:  # the recipe's value, which for a recipe that does not set it is the default
            continue
        assert getattr(settings, f.name) == var.default, f.name
    if service == "worker":
        assert recipe.name == table["JEV_RECIPE"].default
        assert (settings.dtype, settings.batching, settings.max_batch_rows, settings.max_wait_ms) == (
            recipe.model.dtype,
            recipe.batching.enabled,
            recipe.batching.max_batch_rows,
            recipe.batching.max_wait_ms,
        )
        assert settings.cache == worker_settings.CacheSettings(
            table["JEV_CACHE"].default,
            recipe.cache.l1_max,
            config.parse_bytes(str(recipe.cache.l2_bytes)),
            config.parse_bytes(str(recipe.cache.l3_bytes)),
        )


def _readme_rows(service: str) -> dict[str, str]:
    """{variable: its default cell} of a README table, as written on disk."""
    readme = (env_tables.ROOT / "README.md").read_text()
    body = re.search(rf"<!-- env-table: {service} -->\n(.*?)<!-- /env-table -->", readme, re.S).group(1)
    rows = {}
    for line in body.splitlines()[2:]:
        name, default = (cell.strip() for cell in line.strip("|").split(" | ")[:2])
        rows[name.split("`")[1]] = default
    return rows


@pytest.mark.parametrize("service", SERVICES)
def test_docs_default_column_is_the_typed_default(service):
    """Every constant default in README reads back, through the variable's own parser, as its value (and
    the upstream default as its upstream value): the column is the value, not a second copy of it."""
    _, table, _, _ = SERVICES[service]
    rows = _readme_rows(service)
    assert {var.name for var in table if var.shown} == SHOWN[service]
    for var in table:
        cell = rows[var.name]
        if var.shown:
            assert cell == var.shown
            continue
        written = re.findall(r"`([^`]*)`", cell)
        if var.default in (None, (), ""):
            assert re.fullmatch(r"\((none|empty)(: [^)]+)?\)", cell), (var.name, cell)
            continue
        assert var.kind.parse(written[0], var.name) == var.default, (var.name, cell)
        assert cell.startswith("recipe (") == var.from_recipe, (var.name, cell)
        if var.has_upstream:
            assert "(upstream names: " in cell and var.kind.parse(written[1], var.name) == var.upstream


def test_env_var_renders_and_reads_by_its_type(monkeypatch):
    for name in ("X_N", "X_ALIAS"):
        monkeypatch.delenv(name, raising=False)
    cases = [
        (config.int_var("X_N", 64, "d"), "`64`", "7", 7, "must be an integer, got 'x'"),
        (config.float_var("X_N", 30.0, "d"), "`30`", "2.5", 2.5, "must be a number, got 'x'"),
        (config.float_var("X_N", 0.25, "d"), "`0.25`", "1", 1.0, "must be a number"),
        (config.bool_var("X_N", True, "d"), "`1`", "off", False, "must be 0/1/true/false, got 'x'"),
        (config.bool_var("X_N", False, "d"), "`0`", "Yes", True, "must be 0/1/true/false"),
        (config.bytes_var("X_N", 16 << 20, "d"), "`16M`", "1K", 1024, "must be a byte count like 512M, got 'x'"),
        (config.bytes_var("X_N", 1 << 30, "d"), "`1G`", "3", 3, "must be a byte count"),
        (config.str_var("X_N", "auto", "d"), "`auto`", " cpu", " cpu", None),
        (config.list_var("X_N", (), "d"), "(empty)", "a, ,b", ("a", "b"), None),
        (config.optional_var("X_N", "d"), "(none)", "", None, None),
    ]
    for var, shown, raw, value, error in cases:
        assert var.row() == f"| `X_N` | {shown} | d |"
        assert var.get() == var.default
        monkeypatch.setenv("X_N", raw)
        assert var.get() == value
        if error:
            monkeypatch.setenv("X_N", "x")
            with pytest.raises(ValueError, match=f"^X_N {error}"):
                var.get()
        monkeypatch.delenv("X_N")
    # an alias is read when the name is not set, and an error names the one that was set
    var = config.int_var("X_N", 1, "d", ("X_ALIAS",), upstream=2, note="n")
    assert var.row() == "| `X_N` (alias `X_ALIAS`) | `1` (upstream names: `2`) (n) | d |"
    assert (var.get(), var.get(upstream=True), var.get(5)) == (1, 2, 5)
    monkeypatch.setenv("X_ALIAS", "x")
    with pytest.raises(ValueError, match="^X_ALIAS must be an integer"):
        var.get()
    monkeypatch.setenv("X_N", "3")
    assert var.get(upstream=True) == 3
    assert config.list_var("X_N", (), "d", note="auth off").shown_default() == "(empty: auth off)"
    assert config.int_var("X_N", 0, "d", note="torch default").shown_default() == "`0` (torch default)"
    assert config.float_var("X_N", 2.0, "d", from_recipe=True).shown_default() == "recipe (`2`)"


def test_computed_default_is_shown_and_passed():
    with pytest.raises(ValueError, match="needs `shown`"):
        config.str_var("X_N", COMPUTED, "d")
    var: EnvVar = config.str_var("X_N", COMPUTED, "d", shown="`hostname:port`")
    assert var.row() == "| `X_N` | `hostname:port` | d |" and var.text() is None
    with pytest.raises(TypeError, match="computed"):
        var.get()
    with pytest.raises(TypeError, match="computed"):
        var.field()
    assert var.get("h:1") == "h:1"


def test_quick_map_is_rendered_from_the_tables():
    contracts = (env_tables.ROOT / "docs" / "CONTRACTS.md").read_text()
    quick = env_tables.quick_map(env_tables.tables())
    assert quick in contracts
    assert "| worker | 8000 | " in quick and "`JEV_MAX_QUEUE=64`" in quick and "| redis | 6379 | - |" in quick
    assert "`JEV_BATCHING`," in quick  # the recipe's: no constant default in the map
