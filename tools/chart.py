"""Render and validate the Helm chart (deploy/helm/jev) offline, with the project's own tools: Helm v4 embedded in
helm-python-sdk and Kubernetes' schemas from kubernetes-validate (both in requirements-dev.txt). No `helm` binary, no
cluster.

    python -m tools.chart render                                   # the manifests of the default values, as YAML
    python -m tools.chart render -f my-values.yaml --set image.cpu.tag=0.2.0 --out manifests/
    python -m tools.chart validate -f my-values.yaml               # schema, lint, every object against Kubernetes

`-f` and `--set` work as Helm's (later ones win; `--set` uses Helm's own parser). The values are checked against the
chart's values.schema.json first, and each refusal is said in words: the field, its value and the rule, e.g.

    image.cpu.tag = "latest": must be a pinned tag such as 0.1.0, not latest, stable or main: ...

where Helm itself prints `at '/image/cpu/tag': 'not' failed`. A constraint whose keyword does not say the rule in
words (`not`, `pattern`, `const`, `format`, `maxProperties`, `if`/`then`, `propertyNames`) carries it in the schema,
as an `errorMessage` beside the keyword (`{"not": "must be ..."}`, ajv-errors' form); the others (`type`, `enum`,
`minimum`, `required`, ...) are worded from the keyword's own value. Helm decides: where it refuses values this
check let pass, its own message is shown.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.parse
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART = REPO_ROOT / "deploy" / "helm" / "jev"
KUBERNETES = "1.33.0"  # the oldest Kubernetes the chart is validated against (Chart.yaml's kubeVersion admits 1.27+)
WORDED_BY_SCHEMA = ("not", "pattern", "const", "format", "maxProperties", "then", "propertyNames")
_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "object": "a mapping",
    "array": "a list",
    "null": "null",
}


class ChartError(RuntimeError):
    """The values do not fit the chart, or it did not render or validate; the message says why, in words."""


# ----- values ------------------------------------------------------------------------------------
def merge(base: dict, over: dict) -> dict:
    """Helm's merge of values sources: mappings merge key by key, anything else (lists too) is replaced."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _helm():
    """helm-python-sdk, its Go library's own log lines (`INFO funcMap fail ...`) off: its errors come as exceptions."""
    import helm_python as helm

    helm.disable_logging()
    return helm


def load_values(files: Sequence[str | Path] = (), sets: Sequence[str] = ()) -> dict:
    """The values `-f FILE ... --set KEY=VALUE ...` give, in Helm's order (files, then sets; later ones win)."""
    helm = _helm()
    values: dict = {}
    for name in files:
        loaded = yaml.safe_load(Path(name).read_text(encoding="utf-8")) or {}
        if not isinstance(loaded, dict):
            raise ChartError(f"{name}: a values file is a YAML mapping, not a {type(loaded).__name__}")
        values = merge(values, loaded)
    for expression in sets:
        try:
            values = merge(values, helm.parse_set_string(expression))
        except helm.HelmError as exc:
            raise ChartError(f"--set {expression}: {exc}") from None
    return values


# ----- the schema's refusals in words ------------------------------------------------------------
def field_name(path: Iterable[str | int]) -> str:
    """`workers[0].extraEnv.X` from a JSON path, as a values file or --set names it."""
    name = ""
    for part in path:
        name += f"[{part}]" if isinstance(part, int) else (f".{part}" if name else str(part))
    return name or "(the values)"


def _shown(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


def _resolve(schema: dict, node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        pointer = node["$ref"]
        if not pointer.startswith("#/"):
            raise ChartError(f"values.schema.json: only local $refs are read, not {pointer}")
        node = schema
        for part in pointer[2:].split("/"):
            node = node[part]
    return node


def _schema_nodes(schema: dict, schema_path: Sequence) -> list[tuple[dict, Any]]:
    """(node, the key taken from it) along an error's schema path, from the root down; $refs followed."""
    steps: list[tuple[dict, Any]] = []
    node: Any = schema
    for key in schema_path:
        if key == "$ref":
            continue
        node = _resolve(schema, node)
        steps.append((node, key))
        node = node[key] if isinstance(node, dict) or isinstance(key, int) else node
    return steps


def _schema_message(schema: dict, error) -> str | None:
    """The schema's own words for this refusal: the nearest errorMessage, innermost first, for the keyword taken
    at that node (`not` at a tag, `then` at redis, `pattern` inside extraEnv's propertyNames)."""
    for node, key in reversed(_schema_nodes(schema, list(error.schema_path))):
        message = node.get("errorMessage") if isinstance(node, dict) else None
        if isinstance(message, str):
            return message
        if isinstance(message, dict) and isinstance(key, str) and key in message:
            return message[key]
    return None


def _generic_rule(error) -> str:
    """The rule of a keyword that says it by its own value, in words."""
    keyword, limit, node = error.validator, error.validator_value, error.schema
    if keyword == "type":
        kinds = [limit] if isinstance(limit, str) else list(limit)
        return "must be " + " or ".join(_TYPE_WORDS.get(kind, kind) for kind in kinds)
    if keyword == "enum":
        return "must be one of: " + ", ".join(str(option) for option in limit)
    if keyword == "minimum":
        return f"must be at least {limit}"
    if keyword == "maximum":
        return f"must be at most {limit}"
    if keyword == "exclusiveMinimum":
        return f"must be more than {limit}"
    if keyword == "exclusiveMaximum":
        return f"must be less than {limit}"
    if keyword == "minLength":
        return "must not be empty" if limit == 1 else f"must be at least {limit} characters long"
    if keyword == "maxLength":
        return f"must be at most {limit} characters long"
    if keyword == "minItems":
        return f"must list at least {limit} {'entry' if limit == 1 else 'entries'}"
    if keyword == "maxItems":
        return f"must list at most {limit} entries"
    if keyword == "minProperties":
        return f"must have at least {limit} keys"
    if keyword == "maxProperties":
        return f"must have at most {limit} keys"
    if keyword == "const":
        return f"must be {_shown(limit)}"
    if keyword == "pattern":
        return f"must match the pattern {limit}"
    if keyword == "format":
        return f"must be a valid {limit}"
    if keyword == "required":
        return "is required"
    if keyword == "additionalProperties":
        fields = ", ".join(sorted(node.get("properties") or {}))
        if not error.absolute_path:
            return f"is not a top-level field; the fields are: {fields}"
        return f"is not a field of {field_name(error.absolute_path)}; its fields are: {fields}"
    return error.message


def explain(schema: dict, error) -> list[str]:
    """One line per refused field: `field = value: rule`, the rule the schema's errorMessage or the keyword's own
    value in words."""
    path = list(error.absolute_path)
    in_names = "propertyNames" in error.schema_path
    if error.validator == "required" and not in_names:
        missing = [name for name in error.validator_value if name not in (error.instance or {})]
        rule = _schema_message(schema, error) or "is required"
        return [f"{field_name(path + [name])}: {rule}" for name in missing]
    if error.validator == "additionalProperties" and error.validator_value is False:
        known = set(error.schema.get("properties") or {})
        extra = sorted(name for name in (error.instance or {}) if name not in known)
        rule = _schema_message(schema, error) or _generic_rule(error)
        return [f"{field_name(path + [name])}: {rule}" for name in extra]
    rule = _schema_message(schema, error) or _generic_rule(error)
    if in_names:  # the instance is the key itself: name the field it makes
        return [f"{field_name(path + [error.instance])}: the name {rule}"]
    return [f"{field_name(path)} = {_shown(error.instance)}: {rule}"]


def _format_checker():
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())  # only what the chart's schema uses, checked as Helm checks it

    @checker.checks("uri", raises=ValueError)
    def absolute_uri(value) -> bool:  # what Helm's validator asks of `format: uri`: an absolute URL
        if not isinstance(value, str):
            return True
        parts = urllib.parse.urlsplit(value)
        return bool(re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", parts.scheme)) and " " not in value

    return checker


def schema_errors(values: dict, chart: Path = CHART) -> list[str]:
    """The schema's refusals of `values` (over the chart's defaults, as Helm composes them), one line each, in words."""
    helm = _helm()
    from jsonschema import Draft7Validator

    with helm.Chart.load(str(chart)) as loaded:
        merged = loaded.merge_values(values)
        schema = loaded.schema
    if not schema:
        return []
    validator = Draft7Validator(schema, format_checker=_format_checker())
    lines: list[str] = []
    for error in sorted(validator.iter_errors(merged), key=lambda e: [str(p) for p in e.absolute_path]):
        lines.extend(line for line in explain(schema, error) if line not in lines)
    return lines


def check_values(values: dict, chart: Path = CHART) -> None:
    """Raise ChartError naming every field the schema refuses, in words (Helm's message if only Helm refuses)."""
    helm = _helm()
    lines = schema_errors(values, chart)
    if not lines:
        with helm.Chart.load(str(chart)) as loaded:
            try:
                loaded.validate_schema(values)
            except helm.HelmValuesError as exc:
                lines = [f"Helm refuses the values: {str(exc).strip()}"]
    if lines:
        where = (chart / "values.schema.json").relative_to(REPO_ROOT) if chart.is_relative_to(REPO_ROOT) else chart
        raise ChartError(f"the values do not fit the chart's schema ({where}):\n" + "\n".join(f"- {x}" for x in lines))


# ----- rendering ---------------------------------------------------------------------------------
class UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a mapping with the same key twice (Kubernetes would keep only one)."""


def _no_duplicates(loader, node, deep=False):
    keys = [loader.construct_object(key, deep=deep) for key, _ in node.value]
    duplicated = {key for key in keys if keys.count(key) > 1}
    if duplicated:
        raise yaml.constructor.ConstructorError(
            None, None, f"duplicate keys {sorted(map(str, duplicated))}", node.start_mark
        )
    return loader.construct_mapping(node, deep)


UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def render(values: dict | None = None, *, name: str = "jev", namespace: str = "jev", chart: Path = CHART) -> dict:
    """{template path: manifest text} for these values (checked first), as `helm template` renders them."""
    helm = _helm()
    values = values or {}
    check_values(values, chart)
    with helm.Chart.load(str(chart)) as loaded:
        try:
            return loaded.render(values, name=name, namespace=namespace)
        except helm.HelmRenderError as exc:  # a template's own `fail` says why in words; drop Helm's prefix
            raise ChartError(re.sub(r"^.*?execution error at \([^)]*\): ", "", str(exc).strip())) from None


def documents(manifests: dict) -> list[dict]:
    """Every object of the rendered manifests (NOTES.txt and empty documents left out); duplicate keys refused."""
    return [
        doc
        for path, text in sorted(manifests.items())
        if path.endswith((".yaml", ".yml"))
        for doc in yaml.load_all(text, Loader=UniqueKeyLoader)
        if doc
    ]


def as_yaml_stream(manifests: dict) -> str:
    """The manifests as one YAML stream, each under a `# Source:` line, as `helm template` prints them."""
    parts = []
    for path, text in sorted(manifests.items()):
        if path.endswith((".yaml", ".yml")) and text.strip():
            parts.append(f"---\n# Source: {path}\n{text.strip()}\n")
    return "".join(parts)


# ----- validation --------------------------------------------------------------------------------
def is_core(doc: dict) -> bool:
    """An object of Kubernetes' own API groups (the core group, apps, policy, *.k8s.io): kubernetes-validate ships
    their schemas; a custom resource's (KEDA's ScaledObject, the ServiceMonitor) come with its CRD, not here."""
    group = str(doc.get("apiVersion", "")).rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


@dataclass
class Report:
    kubernetes: str
    valid: list[str] = field(default_factory=list)  # "Kind name" of every object valid against the schemas
    not_checked: list[str] = field(default_factory=list)  # custom resources: no schema ships for them
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        out = [f"- {p}" for p in self.problems]
        out.append(
            f"{len(self.valid)} objects valid against Kubernetes {self.kubernetes}'s schemas (strict: no unknown "
            f"fields)"
            + (
                f"; not checked (custom resources, their schemas ship with their CRDs): {', '.join(self.not_checked)}"
                if self.not_checked
                else ""
            )
        )
        return out


def validate(values: dict | None = None, *, kubernetes: str = KUBERNETES, chart: Path = CHART) -> Report:
    """Schema (in words), Helm's lint, the render, and every core object strictly against Kubernetes' schemas."""
    helm = _helm()
    import kubernetes_validate

    values = values or {}
    report = Report(kubernetes)
    lint = helm.lint(str(chart), values)
    report.problems.extend(
        f"lint: {m.get('path', '')}: {m.get('error')}" for m in lint.get("messages", []) if m.get("severity", 0) > 1
    )
    report.problems.extend(f"lint: {e}" for e in lint.get("errors") or [])
    for doc in documents(render(values, chart=chart)):
        what = f"{doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        if not is_core(doc):
            report.not_checked.append(what)
            continue
        try:
            kubernetes_validate.validate(doc, kubernetes, strict=True)
        except kubernetes_validate.ValidationError as exc:
            report.problems.append(f"{what}: {field_name(exc.absolute_path)}: {exc.message}")
        except kubernetes_validate.SchemaNotFoundError:
            report.problems.append(f"{what}: Kubernetes {kubernetes} has no {doc.get('apiVersion')} {doc.get('kind')}")
        else:
            report.valid.append(what)
    return report


# ----- command line ------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.chart", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("render", "validate"), help="render: print the manifests; validate: check")
    parser.add_argument(
        "-f", "--values", action="append", default=[], metavar="FILE", help="a values file (repeatable)"
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="as helm's --set (repeatable)")
    parser.add_argument("--name", default="jev", help="release name (default jev)")
    parser.add_argument("--namespace", "-n", default="jev", help="namespace (default jev)")
    parser.add_argument("--out", metavar="DIR", help="render: write each template's manifest under DIR")
    parser.add_argument(
        "--kubernetes", default=KUBERNETES, help=f"validate: the Kubernetes version (default {KUBERNETES})"
    )
    parser.add_argument("--chart", default=str(CHART), help="the chart folder (default deploy/helm/jev)")
    args = parser.parse_args(argv)
    chart = Path(args.chart).resolve()
    try:
        values = load_values(args.values, args.set)
        if args.command == "render":
            manifests = render(values, name=args.name, namespace=args.namespace, chart=chart)
            if args.out:
                for path, text in sorted(manifests.items()):
                    target = Path(args.out) / path
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(text)
                print(f"chart: {len(manifests)} templates rendered under {args.out}", file=sys.stderr)
            else:
                sys.stdout.write(as_yaml_stream(manifests))
            return 0
        report = validate(values, kubernetes=args.kubernetes, chart=chart)
    except (ChartError, OSError, yaml.YAMLError) as exc:
        print(f"chart: {exc}", file=sys.stderr)
        return 1
    print("\n".join(report.lines()))
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
