"""Callers named without their keys (jev_common/identity.py): an HMAC of the key under a per-deployment secret
derived from the internal token, shared by every frontend and backend of the deployment."""

from __future__ import annotations

import hashlib

from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from jev_common.identity import CallerIdentity

KEY = "k-secret-caller-key"


def request(authorization: str | None = None) -> web.Request:
    headers = {"Authorization": authorization} if authorization is not None else {}
    return make_mocked_request("POST", "/v1/systemone", headers=headers)


def test_a_key_is_named_alike_within_a_deployment_and_unlike_across_them():
    one, same = CallerIdentity.for_tokens(("t-1",)), CallerIdentity.for_tokens(("t-1", "t-old"))
    other = CallerIdentity.for_tokens(("t-2",))
    name = one.of_key(KEY)
    assert name.startswith("key:") and len(name) == 4 + 16
    assert same.of_key(KEY) == name  # every frontend of the deployment: one bucket, one fairness key
    assert other.of_key(KEY) != name and one.of_key(KEY + "x") != name
    assert KEY not in name and hashlib.sha256(KEY.encode()).hexdigest()[:16] not in name  # not the plain digest
    assert CallerIdentity.for_tokens(()).of_key(KEY) != hashlib.sha256(KEY.encode()).hexdigest()[:16]


def test_a_request_is_named_by_its_bearer_key_else_its_address():
    identity = CallerIdentity.for_tokens(("t-1",))
    assert identity.of(request(f"Bearer  {KEY} ")) == identity.of_key(KEY)
    for header in (None, "", "Bearer", "Basic abc"):
        assert identity.of(request(header)).startswith("addr:")


def test_with_keys_off_a_caller_cannot_pick_its_name_with_a_bearer():
    identity = CallerIdentity.for_tokens(("t-1",), by_key=False)
    assert identity.of(request(f"Bearer {KEY}")) == identity.of(request()) == "addr:unknown"  # no peer in a mock
