"""tools/chart.py: the chart rendered and validated offline as docs/kubernetes.md says, and every constraint of
values.schema.json refused in words that name the field and the rule, for the same values Helm refuses.

The refusals are not listed by hand: the test walks the schema and, for every constraint keyword it meets, breaks
exactly that constraint over the chart's defaults, then checks the message (and that Helm refuses it too)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

helm = pytest.importorskip("helm_python")
pytest.importorskip("kubernetes_validate")

from tools import chart  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = json.loads((chart.CHART / "values.schema.json").read_text())
WORDS_OF = {  # what a keyword's generic wording must say besides its limit
    "type": None,
    "enum": "one of",
    "minimum": "at least",
    "maximum": "at most",
    "exclusiveMinimum": "more than",
    "minLength": None,
    "maxLength": "at most",
    "minItems": "at least",
    "required": "is required",
    "additionalProperties": "is not a field",
}
UNWORDED = set(chart.WORDED_BY_SCHEMA) - {"then", "propertyNames"}  # need the schema's errorMessage


def resolve(node):
    while "$ref" in node:
        node = SCHEMA["definitions"][node["$ref"].rsplit("/", 1)[1]]
    return node


def defaults() -> dict:
    with helm.Chart.load(str(chart.CHART)) as loaded:
        return loaded.merge_values({})


def _not_a(types) -> object:
    kinds = {types} if isinstance(types, str) else set(types)
    for value, kind in (("text", "string"), (7, "integer"), (1.5, "number"), (True, "boolean"), ([], "array")):
        if kind not in kinds and not (kind == "integer" and "number" in kinds):
            return value
    return {}


def breaking(node: dict, keyword: str, current):
    """(a value that breaks `keyword` of `node` and nothing else there, what the message must say), or None."""
    limit = node[keyword]
    if keyword == "type":
        return _not_a(limit), None
    if keyword == "enum":
        return "surely-not-an-option", limit[0]
    if keyword == "const":
        return (not limit) if isinstance(limit, bool) else limit + 1, None
    if keyword == "minimum":
        return limit - 1, str(limit)
    if keyword == "maximum":
        return limit + 1, str(limit)
    if keyword == "exclusiveMinimum":
        return limit, str(limit)
    if keyword == "minLength":
        return "", None
    if keyword == "maxLength":
        return "a" * (limit + 1), str(limit)
    if keyword == "pattern":
        bad = next(v for v in ("Not Valid!", "x y", "/") if not re.search(limit, v))
        return bad, None
    if keyword == "not":
        return limit["enum"][0], None
    if keyword == "format":
        return "not an absolute url", None
    if keyword == "minItems":
        return [], str(limit)
    if keyword == "maxProperties":
        sources = {"persistentVolumeClaim": {"claimName": "a"}, "hostPath": {"path": "/b"}, "nfs": {"server": "c"}}
        return dict(list(sources.items())[: limit + 1]), None
    if keyword == "additionalProperties" and limit is False:
        return {**(current if isinstance(current, dict) else {}), "surelyNotAField": 1}, None
    return None


def cases():
    """(path, value, keyword, node, words, how) for every constraint of the schema reachable from its properties,
    breaking one at a time. how: `set` the field to value, `delete` it, or add the field (`name`) it names."""
    base = defaults()

    def walk(node, path, current):
        node = resolve(node)
        for keyword in sorted(node):
            found = breaking(node, keyword, current) if keyword in WORDS_OF or keyword in UNWORDED else None
            if found is not None and path:
                value, words = found
                if keyword == "additionalProperties":
                    yield path + ["surelyNotAField"], 1, keyword, node, words, "set"
                else:
                    yield path, value, keyword, node, words, "set"
        for name in node.get("required", ()):
            yield path + [name], None, "required", node, "is required", "delete"
        for name, child in (node.get("properties") or {}).items():
            here = current.get(name) if isinstance(current, dict) else None
            yield from walk(child, path + [name], here)
        if isinstance(node.get("additionalProperties"), dict):  # the values of a free-form mapping
            yield from walk(node["additionalProperties"], path + ["EXTRA_KEY"], None)
        if "items" in node:
            items = current if isinstance(current, list) and current else [{}]
            yield from walk(node["items"], path + [0], items[0])
        names = resolve(node.get("propertyNames") or {})
        for keyword in ("pattern", "not"):
            if keyword in names:
                bad = names[keyword]["enum"][0] if keyword == "not" else "lower_case"
                yield path + [bad], "x", keyword, names, None, "name"

    for path, value, keyword, node, words, how in walk(SCHEMA, [], base):
        yield pytest.param(path, value, keyword, node, words, how, id=f"{chart.field_name(path)}:{keyword}")


def override(path: list, value, how: str) -> dict:
    """Values that change `path` over the defaults. A deleted key the defaults have is set to null (Helm then drops
    it; left out, it would come back from the defaults); inside a list, which Helm replaces whole, it is left out."""
    values = defaults()
    target = values
    for key, following in zip(path[:-1], path[1:]):
        if isinstance(target, list):
            while len(target) <= key:
                target.append({})
        elif not isinstance(target.get(key), (dict, list)):
            target[key] = [] if isinstance(following, int) else {}
        target = target[key]
    last = path[-1]
    if isinstance(target, list):
        while len(target) <= last:
            target.append({})
    if how != "delete":
        target[last] = value
    elif any(isinstance(key, int) for key in path) or last not in target:
        target.pop(last, None)  # within a list, or a mapping the defaults do not have: simply absent
    else:
        target[last] = None
    return {path[0]: values[path[0]]}


@pytest.mark.parametrize("path, value, keyword, node, words, how", list(cases()))
def test_every_constraint_is_refused_in_words_naming_the_field_and_the_rule(path, value, keyword, node, words, how):
    values = override(path, value, how)
    lines = chart.schema_errors(values)
    field = chart.field_name(path)
    mine = [line for line in lines if line.startswith((f"{field} =", f"{field}:"))]
    assert mine, (field, lines)  # more than one where the value breaks another rule too (gpus -1 on the cpu image)
    rules = [line.split(": ", 1)[1] for line in mine]
    message = (node.get("errorMessage") or {}).get(keyword)
    if keyword in UNWORDED:
        assert message, f"{field}: `{keyword}` needs an errorMessage in the schema: its keyword is not words"
    if message:
        assert len(message.split()) >= 4 and any(message in rule for rule in rules), mine
    elif keyword == "type":
        kinds = [node["type"]] if isinstance(node["type"], str) else node["type"]
        assert any(all(chart._TYPE_WORDS[kind] in rule for kind in kinds) for rule in rules), mine
    else:
        said = [rule for rule in rules if WORDS_OF[keyword] is None or WORDS_OF[keyword] in rule]
        assert any(words is None or str(words) in rule for rule in said), mine
    assert not any("failed" in rule for rule in rules), mine  # not Helm's `'not' failed`
    with helm.Chart.load(str(chart.CHART)) as loaded, pytest.raises(helm.HelmValuesError):
        loaded.validate_schema(values)  # Helm refuses the same values: the words describe a real refusal


def test_the_walk_reaches_every_kind_of_constraint():
    kinds = {param.values[2] for param in cases()}
    assert kinds >= {"type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength"}
    assert kinds >= {"pattern", "not", "format", "minItems", "maxProperties", "additionalProperties", "required"}
    assert {param.values[2] for param in cases() if param.values[5] == "name"} == {"pattern", "not"}


def test_every_keyword_the_schema_uses_is_one_the_walk_breaks_or_a_structural_one():
    used: set[str] = set()

    def collect(node):
        if isinstance(node, dict):
            used.update(k for k in node if k not in ("properties", "definitions"))
            for key, value in node.items():
                if key in ("properties", "definitions"):
                    for child in value.values():
                        collect(child)
                elif key != "enum":
                    collect(value)
        elif isinstance(node, list):
            for child in node:
                collect(child)

    collect(SCHEMA)
    structural = {"$schema", "$ref", "title", "description", "errorMessage", "items", "if", "then", "propertyNames"}
    assert used - structural <= set(WORDS_OF) | UNWORDED, used - structural - set(WORDS_OF) - UNWORDED


@pytest.mark.parametrize(
    "values, field, words",
    [
        ({"image": {"cpu": {"repository": "jev-cpu", "tag": "latest"}}}, "image.cpu.tag", "not latest"),
        ({"redis": {"enabled": False}}, "redis.external.host", "is required when redis.enabled is false"),
        ({"redis": {"enabled": False, "external": None}}, "redis.external", "is required when redis.enabled is false"),
        ({"workerDefaults": {"gpus": 1}}, "workerDefaults.gpus", "must be 0 with image: cpu"),
        ({"frontend": {"extraEnv": {"JEV_API_KEYS": "k"}}}, "frontend.extraEnv.JEV_API_KEYS", "come from Secrets"),
    ],
)
def test_the_conditional_and_named_refusals_say_why(values, field, words):
    with pytest.raises(chart.ChartError) as info:
        chart.check_values(values)
    line = next(x for x in str(info.value).splitlines() if x.startswith(f"- {field}"))
    assert words in line, str(info.value)


def test_a_template_refusal_is_shown_without_helms_prefix():
    worker = {"name": "cpu", "recipe": "x", "image": "cpu", "gpus": 1}
    with pytest.raises(chart.ChartError, match=r"^worker cpu asks for 1 GPUs on the cpu image: set image: cuda$"):
        chart.render({"workers": [worker]})


def _cli(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tools.chart", *argv], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_documented_commands_render_and_validate(tmp_path):
    values = tmp_path / "my-values.yaml"
    values.write_text("frontend:\n  replicas: 3\n")
    done = _cli("render", "-f", str(values), "--set", "image.cpu.tag=0.2.0")
    assert done.returncode == 0, done.stderr
    docs = [doc for doc in chart.yaml.safe_load_all(done.stdout) if doc]
    frontend = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "jev-frontend")
    assert frontend["spec"]["replicas"] == 3
    assert any(
        c["image"].endswith(":0.2.0")
        for d in docs
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    )
    assert "# Source: jev/templates/" in done.stdout

    done = _cli("validate", "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^\d+ objects valid against Kubernetes 1\.33\.0's schemas", done.stdout, re.M), done.stdout

    done = _cli("render", "--out", str(tmp_path / "out"))
    assert done.returncode == 0 and (tmp_path / "out" / "jev" / "templates" / "frontend.yaml").is_file(), done.stderr


def test_refused_values_exit_1_with_the_words_and_no_traceback():
    done = _cli("validate", "--set", "image.cpu.tag=latest,frontend.replicas=0")
    assert done.returncode == 1
    assert '- image.cpu.tag = "latest": must be a pinned tag' in done.stderr, done.stderr
    assert "- frontend.replicas = 0: must be at least 1" in done.stderr
    assert "Traceback" not in done.stderr and "'not' failed" not in done.stderr


def _doc_block(tag: str) -> str:
    text = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    match = re.search(rf"^```[a-z]+ {tag}\n(.*?)^```", text, re.M | re.S)
    assert match, f"docs/kubernetes.md has no block tagged {tag}"
    return match.group(1)


def test_the_docs_offline_commands_run_as_written(tmp_path):
    """docs/kubernetes.md's block `chart-offline`, each line as written, in a folder holding a my-values.yaml (the
    checkout on PYTHONPATH, `python` the venv's): each exits 0 and writes what it says."""
    (tmp_path / "my-values.yaml").write_text("frontend:\n  replicas: 3\n")
    commands = [line.split("  #")[0].strip() for line in _doc_block("chart-offline").splitlines() if line.strip()]
    assert len(commands) == 4 and all(c.startswith("python -m tools.chart ") for c in commands), commands
    env = dict(os.environ, PYTHONPATH=str(ROOT), PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (command, done.stderr)
    assert "kind: Deployment" in (tmp_path / "manifests.yaml").read_text()
    assert (tmp_path / "manifests" / "jev" / "templates" / "workers.yaml").is_file()


def test_the_docs_refusal_is_what_the_tool_prints():
    block = _doc_block("chart-refused").splitlines()
    command, shown = block[0].removeprefix("$ "), block[1:]
    done = _cli(*command.split()[3:])
    assert done.returncode == 1
    assert done.stderr.splitlines() == shown, done.stderr
