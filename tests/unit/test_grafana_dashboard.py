"""deploy/grafana/jev-dashboard.json: what tools/grafana_dashboard.py renders, every panel's PromQL parses (promtool
has no single-expression check, so the queries, Grafana's variables substituted, become a rules file), every jev
series is selected by its job, and the chart ships this very file. That every metric it names is exported by a
running stack is tests/stack/test_observability.py's part (metric_names below finds them)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tools import grafana_dashboard

from .promtool_helpers import run_promtool
from .test_prometheus_rules import JOB_OF, SELECTOR

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "jev-dashboard.json"
# Grafana's variables, as a query of this dashboard may name them, and a value each that PromQL accepts
VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "${model}": ".*", "$model": ".*"}
KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS |= {"inf", "nan"}


def queries() -> list[tuple[str, str]]:
    """(panel title and refId, expr) of every target of every panel."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(f"{p['title']} {t['refId']}", t["expr"]) for p in panels for t in p.get("targets", [])]


def substituted(expr: str) -> str:
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    return expr


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects: identifiers outside label matchers, strings, ranges and
    grouping lists that are not functions (followed by a parenthesis) or keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if not call and name.lower() not in KEYWORDS:
            names.add(name)
    return names


def test_the_json_is_what_the_tool_renders():
    assert DASHBOARD.read_text() == grafana_dashboard.render(), "run python -m tools.grafana_dashboard --write"


def test_the_dashboard_is_well_formed():
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert "model" in variables["model"]["definition"]
    for panel in board["panels"]:
        assert panel["gridPos"]["x"] >= 0 and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] != "row":
            assert panel["targets"] and panel["datasource"]["uid"] == "${datasource}"
    titles = " ".join(p["title"] for p in board["panels"] if p["type"] == "row").lower()
    for topic in ("traffic", "latency", "errors", "queue", "caches", "batches", "device", "routing"):
        assert topic in titles, topic


def test_every_query_parses(tmp_path):
    rules = [{"record": f"dashboard:query_{i}", "expr": substituted(expr)} for i, (_, expr) in enumerate(queries())]
    assert rules and all("$" not in rule["expr"] for rule in rules), [r for r in rules if "$" in r["expr"]]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run_promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


def test_a_broken_query_does_not_parse(tmp_path):
    path = tmp_path / "broken.yml"
    broken = 'sum by (model) (rate(jev_worker_decisions_total{job="jev-worker"}[5m])'
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [{"record": "d:x", "expr": broken}]}]}))
    assert run_promtool("check", "rules", str(path)).returncode != 0


def test_every_jev_series_is_selected_by_its_job():
    for where, expr in queries():
        for name, labels in SELECTOR.findall(expr):
            job = next(job for prefix, job in JOB_OF.items() if name.startswith(prefix + "_"))
            assert f'job="{job}"' in labels, f"{where}: {name}{labels} names no job"


def test_metric_names_finds_the_selected_series_only():
    expr = (
        'histogram_quantile(0.99, sum by (model, le) (rate(jev_worker_decision_seconds_bucket{job="jev-worker",'
        'model=~".*"}[5m]))) / on (model) group_left max by (model) (jev_worker_queue_limit) or 0 * sum(up{job="x"})'
    )
    assert metric_names(expr) == {"jev_worker_decision_seconds_bucket", "jev_worker_queue_limit", "up"}
    names = set().union(*(metric_names(substituted(e)) for _, e in queries()))
    assert "jev_worker_decisions_total" in names and "model" not in names and "le" not in names


def test_the_chart_ships_the_same_dashboard():
    """A plain copy, not a link (helm prints a warning for each link it follows, into tools/chart.py's output)."""
    shipped = ROOT / "deploy" / "helm" / "jev" / "files" / DASHBOARD.name
    assert not shipped.is_symlink()
    assert shipped.read_bytes() == DASHBOARD.read_bytes(), (
        f"copy {DASHBOARD.relative_to(ROOT)} over {shipped.relative_to(ROOT)}"
    )
