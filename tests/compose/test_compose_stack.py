"""The `cpu` compose profile for real: build, up, health; the README's examples and the System One
conformance suite through the frontend; Prometheus scraping frontend and worker; Redis behind its
password; non-root services, only the frontend published; a worker restart (502 meanwhile, then back);
`down -v` leaving nothing behind.

Needs a Docker engine and the compose v2 plugin (`docker info` succeeds); skipped otherwise, with the
reason. On a build machine with no engine, tools/container_ci.sh provides one (podman) and runs them:
    bash tools/container_ci.sh run -- .venv/bin/python -m pytest -q tests/compose
The same services run without Docker through tools/local_stack.py (tests/stack covers that path).
"""

from __future__ import annotations

import json
import urllib.parse

import pytest

from tools import doc_examples

from .. import scenarios
from .engine import ROOT, Project, engine_reason, wait_for

pytestmark = [pytest.mark.compose, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    reason = engine_reason()
    if reason:
        pytest.skip(f"compose stack test skipped: {reason}")
    # generous deadlines: jevcompat's 255-option question takes tens of seconds on a loaded 2-core
    # machine; a 504 there would be a timing fact, not a finding
    project = Project(
        "cpu", tmp_path_factory.mktemp("compose-cpu"), env={"JEV_DEADLINE_S": "300", "JEV_FRONTEND_TIMEOUT_S": "300"}
    )
    try:
        project.up("--build")
        yield project
    finally:
        project.down()


def test_health_metrics_and_every_decision_through_the_frontend(stack):
    scenarios.check_health_and_metrics(stack.base_url)
    scenarios.check_systemone(stack.base_url)
    answers = scenarios.check_every_kind(stack.base_url)
    assert answers["choice"].model == "smollm2-135m-cpu"
    scenarios.check_errors(stack.base_url)


def test_readme_examples_through_the_frontend(stack):
    """README.md's curl examples (request + the answer shown) and SDK programs, sent to :8080's stand-in."""
    examples = doc_examples.find((ROOT / "README.md").read_text(), "README.md")
    curls = [e for e in examples if e.command]
    assert curls, "README.md has no tagged curl example"
    urls = {8080: stack.base_url}
    problems = {}
    for example in examples:
        if example.code:
            status, output = doc_examples.run_python(example, urls)
            if status != 0 or not output.strip():
                problems[example.name] = [f"exit {status}: {output[-600:]}"]
            continue
        answer = doc_examples.send(doc_examples.parse_curl(example.command), urls)
        found = doc_examples.check(doc_examples.shown_answer(example), answer)
        if found:
            problems[example.name] = found
    assert not problems, problems


def test_system_one_conformance_through_the_frontend(stack):
    from jevcompat import runner

    rep = runner.run(stack.base_url, key=None, timeout=300)
    failed = [f"{r.id}: {[str(f.message) for f in r.findings][:2]}" for r in rep.results if r.status == "fail"]
    assert not failed, failed
    summary = rep.summary()
    assert rep.verdict == "conformant", (rep.verdict, summary)
    assert summary["MUST"]["failed"] == 0 and summary["MUST"]["passed"] == 32, summary


def _prometheus(stack, query: str) -> list[dict]:
    status, _, raw = scenarios.http(
        "GET", f"{stack.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": query}), timeout=10
    )
    assert status == 200, raw
    payload = json.loads(raw)
    assert payload["status"] == "success", payload
    return payload["data"]["result"]


def test_prometheus_scrapes_frontend_and_worker(stack):
    scenarios.decide(stack.base_url, scenarios.REQUESTS["choice"])  # at least one request counted

    def scraped():
        up = {r["metric"]["instance"]: r["value"][1] for r in _prometheus(stack, "up")}
        requests = _prometheus(stack, 'sum(jev_frontend_http_requests_total{instance="frontend-cpu:8080"})')
        return (
            up.get("frontend-cpu:8080") == "1"
            and up.get("worker-cpu:8000") == "1"
            and requests
            and float(requests[0]["value"][1]) > 0
            and up
        )

    up = wait_for(scraped, 60, "Prometheus scraping frontend-cpu and worker-cpu")
    assert up.get("redis:6379") is None  # only the jev services are targets
    decisions = _prometheus(stack, 'jev_worker_decision_seconds_count{instance="worker-cpu:8000"}')
    assert decisions and float(decisions[0]["value"][1]) > 0, decisions


def test_prometheus_loads_the_rules_and_records_per_model(stack):
    """deploy/prometheus/jev-rules.yml, mounted: its groups loaded, no rule in error, and a recording rule per model
    evaluated from the worker's own series (its `model` label, the job `jev-worker`)."""

    def rule_groups() -> dict:
        status, _, raw = scenarios.http("GET", f"{stack.prometheus_url}/api/v1/rules", timeout=10)
        assert status == 200, raw
        return {g["name"]: g for g in json.loads(raw)["data"]["groups"]}

    assert {"jev-recording", "jev-alerts"} <= set(rule_groups())
    scenarios.decide(stack.base_url, scenarios.REQUESTS["choice"])

    def recorded():
        rules = [r for g in rule_groups().values() for r in g["rules"]]
        assert all(r.get("health") != "err" for r in rules), [r for r in rules if r.get("health") == "err"]
        return _prometheus(stack, 'model:jev_worker_decisions:rate5m{model="smollm2-135m-cpu"}')

    wait_for(recorded, 90, "the recording rule model:jev_worker_decisions:rate5m for smollm2-135m-cpu")


def test_security_defaults(stack):
    # Redis answers only with the password the services were given
    refused = stack.exec("redis", "sh", "-c", "unset REDISCLI_AUTH; redis-cli ping")
    assert "NOAUTH" in refused.stdout + refused.stderr, refused
    assert stack.exec("redis", "redis-cli", "ping").stdout.strip() == "PONG"
    worker_env = dict(item.split("=", 1) for item in stack.container("worker-cpu")["Config"]["Env"])
    assert stack.env["JEV_REDIS_PASSWORD"] in worker_env["JEV_REDIS_URL"]
    # the worker did reach the index with it
    status, _, raw = scenarios.http("GET", stack.base_url + "/health")
    assert status == 200, raw
    # non-root services; only the frontend published beyond the container network, on loopback here
    for service in ("worker-cpu", "frontend-cpu", "redis", "prometheus"):
        uid = stack.exec(service, "id", "-u").stdout.strip()
        assert uid and uid != "0", (service, uid)
        ports = stack.container(service)["HostConfig"].get("PortBindings") or {}
        bindings = [b for spec in ports.values() for b in (spec or [])]
        if service in ("worker-cpu", "redis"):
            assert not bindings, (service, bindings)
        for binding in bindings:
            assert binding["HostIp"] == "127.0.0.1", (service, binding)


def test_worker_restart_gives_502_then_recovers(stack):
    stack.run("stop", "--timeout", "10", "worker-cpu")
    status, _, payload = scenarios.decide(stack.base_url, scenarios.REQUESTS["choice"])
    assert status == 502, (status, payload)
    assert (payload.get("detail") or {}).get("error_type") == "backend_unavailable", payload
    stack.run("start", "worker-cpu")
    wait_for(
        lambda: scenarios.decide(stack.base_url, scenarios.REQUESTS["choice"])[0] == 200,
        300,
        "the frontend answering 200 after the worker restarted",
        every_s=2,
    )


def test_down_leaves_nothing_behind(stack):
    assert stack.leftovers()["containers"], "the project has no containers before down"
    done = stack.down()
    assert done.returncode == 0, done.stderr
    assert stack.leftovers() == {"containers": [], "volumes": [], "networks": []}
    assert not _listening(stack), "something still listens on the frontend's port"


def _listening(stack) -> bool:
    import socket

    with socket.socket() as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", stack.frontend_port)) == 0
