"""Domain errors carry no HTTP: jev_common.errors maps each to its status and the API's error shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jev_common.errors import (
    DOMAIN_ERRORS,
    DeadlineExceeded,
    DomainError,
    ExternalServerFailed,
    ExternalServerTimeout,
    ForwardFailed,
    ImagesNotSupported,
    Overloaded,
    ShuttingDown,
    TooManyOptions,
    UnreadableInput,
    UnsupportedQuestionType,
    domain_api_error,
    domain_error_type,
    error_payload,
    markdown_table,
    spec_of,
)

SERVICES = Path(__file__).resolve().parents[2] / "services"
WORKER = SERVICES / "jev_worker"
CONTRACTS = SERVICES.parent / "docs" / "CONTRACTS.md"


@pytest.mark.parametrize(
    ("error", "status", "type_"),
    [
        (UnsupportedQuestionType, 422, "unsupported_question_type"),
        (TooManyOptions, 422, "validation_error"),
        (UnreadableInput, 422, "validation_error"),
        (ImagesNotSupported, 422, "image_not_supported"),
        (ExternalServerFailed, 502, "backend_unavailable"),
        (ExternalServerTimeout, 504, "deadline_exceeded"),
        (DeadlineExceeded, 504, "deadline_exceeded"),
        (Overloaded, 429, "overloaded"),
        (ShuttingDown, 503, "unavailable"),
        (ForwardFailed, 500, "model_error"),
    ],
)
def test_each_domain_error_has_one_status_and_shape(error, status, type_):
    api = domain_api_error(error("why", ("questions", "q1")))
    assert (api.status, api.type, api.message) == (status, type_, "why")
    assert domain_error_type(error("why")) == type_
    body = error_payload(api)
    if type_ == "validation_error":  # FastAPI's shape, located
        assert body == {"detail": [{"loc": ["body", "questions", "q1"], "msg": "why", "type": "value_error"}]}
    else:
        assert body == {"detail": {"error_type": type_, "message": "why"}}


def test_every_domain_error_is_mapped():
    def leaves(cls):
        return [c for sub in cls.__subclasses__() for c in (leaves(sub) or [sub])]

    for cls in leaves(DomainError):  # every raised error has an entry: its own, or a mapped base class's
        assert any(base in DOMAIN_ERRORS for base in cls.__mro__), cls
        spec_of(Exception.__new__(cls))
    declared = {cls for cls in leaves(DomainError) if cls.__module__ == "jev_common.errors"}
    assert declared <= set(DOMAIN_ERRORS)  # the catalogue names each of its own errors, so the docs list it


def test_retry_hints_are_headers():
    assert domain_api_error(Overloaded("full")).headers == {"Retry-After": "1"}
    assert domain_api_error(ShuttingDown("bye", retry_after=5)).headers == {"Retry-After": "5"}
    assert domain_api_error(DeadlineExceeded("late")).headers == {}


def test_no_service_decides_a_status_outside_the_error_table():
    """`ApiError(` (a status chosen by hand) is built in jev_common/errors.py only; everything else raises
    a domain error, which the table maps."""
    for path in sorted(SERVICES.rglob("*.py")):
        if path.name == "errors.py" and path.parent.name == "jev_common":
            continue
        assert not re.search(r"\bApiError\(", path.read_text()), f"{path.relative_to(SERVICES)} builds an ApiError"


def test_contracts_error_table_is_rendered_from_the_catalogue():
    text = CONTRACTS.read_text()
    begin, end = "<!-- error-table -->\n", "\n<!-- /error-table -->"
    assert begin in text and end in text, "docs/CONTRACTS.md has no error table markers"
    assert text.split(begin, 1)[1].split(end, 1)[0] == markdown_table(), (
        "docs/CONTRACTS.md's error table is stale: python -m tools.env_tables --write"
    )


def test_readouts_and_backends_raise_no_http():
    """What a readout or backend refuses is a domain error; only the service layer speaks HTTP."""
    for path in sorted(
        [
            *WORKER.glob("readouts/*.py"),
            *WORKER.glob("backends/*.py"),
            *WORKER.glob("families/**/*.py"),
            WORKER / "prompt" / "builder.py",
            WORKER.parent / "jev_common" / "control_tokens.py",
        ]
    ):
        assert not re.search(r"\bApiError\b", path.read_text()), f"{path.name} raises ApiError"


def test_the_readmes_error_list_names_every_error_type():
    """README.md, "Errors": a user reading it meets every error_type an answer can carry (issue 49: it left out
    invalid_encoding, a bad gzip body's 400)."""
    readme = (SERVICES.parent / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Errors") : readme.index("**Deadlines and stopping.**")]
    missing = sorted({spec.type for spec in DOMAIN_ERRORS.values()} - set(re.findall(r"`([a-z_]+)`", section)))
    assert not missing, f"README.md's error list leaves out {missing}"
