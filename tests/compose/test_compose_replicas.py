"""The `cpu-replicas` compose profile for real: one frontend routing over two replicas of the embedded
model through the Redis index. A state's later questions go back to the replica that holds its prefix
(an L3 hit), cold states spread over both replicas, and the frontend's per-backend metrics show it.

Needs a Docker engine (tools/container_ci.sh provides podman on the build machines); skipped otherwise.
"""

from __future__ import annotations

import re

import pytest

from .. import scenarios
from .engine import Project, engine_reason

pytestmark = [pytest.mark.compose, pytest.mark.slow]

STATES = [
    f"Ticket {i}: the customer writes about order #{1000 + i} and a {kind}."
    for i, kind in enumerate(
        ["late parcel", "double charge", "broken screen", "wrong size", "missing invoice", "password reset"]
    )
]


def _ask(base: str, state: str, instructions: str) -> tuple[int, dict, dict]:
    return scenarios.decide(
        base,
        {"model": "jev-latest", "state": state, "questions": {"q": {"type": "noul", "instructions": instructions}}},
    )


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    reason = engine_reason()
    if reason:
        pytest.skip(f"compose replicas test skipped: {reason}")
    project = Project("cpu-replicas", tmp_path_factory.mktemp("compose-replicas"))
    try:
        project.up("--build")
        yield project
    finally:
        project.down()


def test_states_return_to_the_replica_holding_their_prefix(replicas):
    base = replicas.base_url
    for state in STATES:
        status, _, payload = _ask(base, state, "Is the customer asking for money back?")
        assert status == 200, payload
    for state in STATES:
        status, headers, payload = _ask(base, state, "Is the customer angry?")
        assert status == 200, payload
        assert "l3=hit" in headers["x-jev-cache"], (state, headers)  # routed back to its warm replica
    status, _, raw = scenarios.http("GET", base + "/metrics")
    assert status == 200
    routed: dict[tuple[str, str], float] = {}
    for line in raw.decode().splitlines():
        match = re.match(r"jev_frontend_route_requests_total\{(.*)\} ([0-9.e+]+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
            key = (labels["backend"], labels["decision"])
            routed[key] = routed.get(key, 0) + float(match.group(2))
    backends = {backend for backend, _ in routed}
    assert backends == {"http://worker-cpu-a:8000", "http://worker-cpu-b:8000"}, routed
    for backend in backends:  # both replicas took states
        assert sum(v for (b, _), v in routed.items() if b == backend) > 0, routed
    warm = sum(v for (_, decision), v in routed.items() if decision in ("warm", "affinity"))
    assert warm >= len(STATES), routed
    status, _, raw = scenarios.http("GET", base + "/v1/models")
    assert status == 200 and b"smollm2-135m-cpu" in raw
