"""Domain errors carry no HTTP: jev_common.errors maps each to its status and the API's error shape."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from jev_common.errors import (
    DOMAIN_ERRORS, DomainError, ExternalServerFailed, ExternalServerTimeout, ImagesNotSupported, TooManyOptions,
    UnreadableInput, UnsupportedQuestionType, domain_api_error, domain_error_type, error_payload,
)

WORKER = Path(__file__).resolve().parents[2] / "services" / "jev_worker"


@pytest.mark.parametrize(("error", "status", "type_"), [
    (UnsupportedQuestionType, 422, "unsupported_question_type"),
    (TooManyOptions, 422, "validation_error"),
    (UnreadableInput, 422, "validation_error"),
    (ImagesNotSupported, 422, "image_not_supported"),
    (ExternalServerFailed, 502, "backend_unavailable"),
    (ExternalServerTimeout, 504, "deadline_exceeded"),
])
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

    assert set(leaves(DomainError)) <= set(DOMAIN_ERRORS)


def test_readouts_and_backends_raise_no_http():
    """What a readout or backend refuses is a domain error; only the service layer speaks HTTP."""
    for path in sorted([*WORKER.glob("readouts/*.py"), *WORKER.glob("backends/*.py"), *WORKER.glob("families/**/*.py"),
                        WORKER / "prompt.py", WORKER / "control_tokens.py"]):
        assert not re.search(r"\bApiError\b", path.read_text()), f"{path.name} raises ApiError"
