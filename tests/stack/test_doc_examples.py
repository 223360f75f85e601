"""Every request/response example in README.md and docs/ (fenced blocks tagged `example=NAME`) is
sent to the real cpu stack and its answer checked against what the docs show (tools/doc_examples.py)."""
from __future__ import annotations

import pytest

from tools import doc_examples
from tools.local_stack import start_profile

from ..fakes.net import free_port

pytestmark = pytest.mark.slow


def test_every_doc_example_answers_as_shown(tmp_path):
    examples = doc_examples.all_examples()
    assert any(e.source == "docs/frontend.md" for e in examples)
    overrides = {"worker-cpu": {"JEV_WORKER_PORT": str(free_port())},
                 "frontend-cpu": {"JEV_FRONTEND_PORT": str(free_port())}}
    with start_profile("cpu", overrides, state_dir=tmp_path, log=lambda *_: None) as urls:
        base = {8080: urls["frontend-cpu"], 8000: urls["worker-cpu"]}
        problems = {}
        for example in examples:
            request = doc_examples.parse_curl(example.command)
            answer = doc_examples.send(request, base)
            found = doc_examples.check(doc_examples.shown_answer(example), answer)
            if found:
                problems[f"{example.source} example={example.name}"] = found
    assert not problems, problems
