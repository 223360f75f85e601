"""deploy/prometheus/jev-rules.yml: valid (`promtool check rules`), every rule proven by its unit test
(`promtool test rules` on jev-rules.test.yml), every rule and alert exercised there, every jev series selected by its
job (the frontend re-exports its workers' series: without a job they would count twice), every alert explained in
docs/operations.md, and compose's Prometheus and the chart loading this very file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from .promtool_helpers import run_promtool

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "jev-rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "jev-rules.test.yml"
OPERATIONS = ROOT / "docs" / "operations.md"
JOB_OF = {"jev_frontend": "jev-frontend", "jev_worker": "jev-worker", "jev_preencoder": "jev-preencoder"}
SELECTOR = re.compile(r"(?<![\w:])(jev_(?:frontend|worker|preencoder)_[a-z0-9_]+)(\{[^}]*\})?")


def rules() -> list[dict]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_checks_the_rules():
    result = run_promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_promtool_unit_tests_pass():
    result = run_promtool("test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_every_rule_has_a_unit_test():
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    tested_exprs = {t["expr"] for case in tests["tests"] for t in case.get("promql_expr_test", [])}
    firing = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    quiet = {
        t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", []) if not t.get("exp_alerts")
    }
    for rule in rules():
        if "record" in rule:
            assert rule["record"] in tested_exprs, f"recording rule {rule['record']} has no promql_expr_test"
        else:
            assert rule["alert"] in firing, f"alert {rule['alert']} is never shown firing"
            assert rule["alert"] in quiet, f"alert {rule['alert']} is never shown quiet (before `for:` or below)"


def test_every_jev_series_is_selected_by_its_job():
    for rule in rules():
        expr = rule["expr"]
        found = SELECTOR.findall(expr)
        for name, labels in found:
            job = next(job for prefix, job in JOB_OF.items() if name.startswith(prefix + "_"))
            assert f'job="{job}"' in labels, f"{rule.get('record') or rule.get('alert')}: {name}{labels} names no job"
        for labels in re.findall(r"(?<![\w:])up(\{[^}]*\})?", expr):
            assert re.match(r'\{job="jev-[a-z]+"', labels), expr


def test_the_selector_check_sees_a_series_without_its_job():
    assert SELECTOR.findall('sum(rate(jev_worker_decisions_total[5m])) / jev_worker_queue_limit{job="jev-worker"}') == [
        ("jev_worker_decisions_total", ""),
        ("jev_worker_queue_limit", '{job="jev-worker"}'),
    ]
    assert not SELECTOR.findall("model:jev_worker_decisions:rate5m")  # a recorded series, already per job


def test_every_alert_is_explained_in_the_operations_guide():
    text = OPERATIONS.read_text()
    headings = {re.sub(r"[^a-z0-9]", "", line.lstrip("#").strip().lower()) for line in text.splitlines()}
    for rule in rules():
        if "alert" in rule:
            anchor = rule["alert"].lower()
            assert anchor in headings, f"docs/operations.md has no section for {rule['alert']}"
            assert rule["annotations"]["runbook"] == f"docs/operations.md#{anchor}"
            assert rule["labels"]["severity"] in ("warning", "critical")


@pytest.mark.parametrize("path", ["images/prometheus.yml"])
def test_compose_prometheus_loads_the_rules(path):
    config = yaml.safe_load((ROOT / path).read_text())
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]
    mounted = {m.split(":")[1]: m.split(":")[0] for m in mounts if m.startswith("./")}
    for pattern in config["rule_files"]:
        folder, name = pattern.rsplit("/", 1)
        assert (ROOT / mounted[folder]).resolve() == RULES.parent and (RULES.parent / name).resolve() == RULES
    jobs = {job["job_name"] for job in config["scrape_configs"]}
    assert {"jev-frontend", "jev-worker", "jev-preencoder"} <= jobs  # the jobs the rules select


def test_promtool_checks_the_compose_config_with_the_rules(tmp_path):
    config = yaml.safe_load((ROOT / "images" / "prometheus.yml").read_text())
    config["rule_files"] = [str(RULES)]  # where compose mounts the folder, here
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    result = run_promtool("check", "config", str(tmp_path / "prometheus.yml"))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


def test_the_chart_ships_the_same_rules():
    """A plain copy, not a link (helm prints a warning for each link it follows, into tools/chart.py's output)."""
    shipped = ROOT / "deploy" / "helm" / "jev" / "files" / RULES.name
    assert not shipped.is_symlink()
    assert shipped.read_bytes() == RULES.read_bytes(), (
        f"copy {RULES.relative_to(ROOT)} over {shipped.relative_to(ROOT)}"
    )
