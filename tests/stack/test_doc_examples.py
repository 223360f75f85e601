"""Every example in README.md and docs/ (fenced blocks tagged `example=NAME`) runs against the real
cpu stack: a curl request's answer is checked against the answer shown (tools/doc_examples.py), a
python example must exit 0 and print. The `jev` command line runs against the same stack."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools import doc_examples
from tools.local_stack import start_profile

from ..fakes.net import free_port

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    overrides = {
        "worker-cpu": {"JEV_WORKER_PORT": str(free_port())},
        "frontend-cpu": {"JEV_FRONTEND_PORT": str(free_port())},
    }
    with start_profile("cpu", overrides, state_dir=tmp_path_factory.mktemp("stack"), log=lambda *_: None) as urls:
        yield {8080: urls["frontend-cpu"], 8000: urls["worker-cpu"]}


def test_every_doc_example_answers_as_shown(stack):
    examples = doc_examples.all_examples()
    assert {"docs/frontend.md", "README.md"} <= {e.source for e in examples}
    problems = {}
    for example in examples:
        where = f"{example.source} example={example.name}"
        if example.code:
            status, output = doc_examples.run_python(example, stack)
            if status != 0 or not output.strip():
                problems[where] = [f"exit {status}: {output[-600:]}"]
            continue
        answer = doc_examples.send(doc_examples.parse_curl(example.command), stack)
        found = doc_examples.check(doc_examples.shown_answer(example), answer)
        if found:
            problems[where] = found
    assert not problems, problems


@pytest.mark.parametrize(
    "argv, head",
    [
        (["It is raining and I am going out.", "What should I take?", "umbrella", "sunglasses"], "choice: "),
        (["--type", "noul", "The door is wide open.", "Is the door open?"], "noul: P(yes) = "),
        (["--type", "score", "The soup is lukewarm.", "How hot is the soup?", "cold", "warm", "hot"], "score: "),
    ],
)
def test_jev_cli_against_the_stack(stack, argv, head):
    env = dict(os.environ, JEV_URL=stack[8080], PYTHONPATH=str(ROOT / "services"), PYTHONIOENCODING="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "jev", "ask", *argv], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith(head), done.stdout
    rows = [line for line in lines[1:] if line[:1] in (">", " ") and line.rstrip()[-4:-3] == "."]
    expected = {"choice: ": 2, "noul: P(yes) = ": 2, "score: ": 3}[head]
    assert len(rows) == expected and sum(line.startswith(">") for line in rows) == 1, done.stdout
    assert abs(sum(float(line.split()[-1]) for line in rows) - 1.0) < 0.01, done.stdout
    assert "model smollm2-135m-cpu" in lines[-1]


def test_jev_batch_answers_every_line_of_each_input_form(stack, tmp_path):
    """docs/batch.md's three input forms against the real stack: every line answered, in the output shape."""
    questions = {"team": {"type": "choice", "instructions": "Which team?", "criteria": {"Billing": None, "Tech": None}}}

    def ask(state: str, question: str) -> dict:
        return {"model": "jev-latest", "state": state, "questions": {"q": {"type": "noul", "instructions": question}}}

    batch_lines = [
        {"custom_id": f"t{i}", "method": "POST", "url": "/v1/systemone", "body": ask(f"Ticket {i // 2}.", f"Q{i}?")}
        for i in range(4)
    ]
    (tmp_path / "batch.jsonl").write_text("".join(json.dumps(line) + "\n" for line in batch_lines))
    (tmp_path / "plain.jsonl").write_text(
        "".join(json.dumps(ask("The door is open.", f"Q{i}?")) + "\n" for i in (1, 2))
    )
    (tmp_path / "rows.csv").write_text("id,body\nr1,I was charged twice.\nr2,The app crashes.\n")
    (tmp_path / "questions.json").write_text(json.dumps(questions))
    env = dict(os.environ, JEV_URL=stack[8080], PYTHONPATH=str(ROOT / "services"), PYTHONIOENCODING="utf-8")
    forms = {
        "batch.jsonl": ([], {"t0", "t1", "t2", "t3"}),
        "plain.jsonl": ([], {"line-1", "line-2"}),
        "rows.csv": (["--questions", str(tmp_path / "questions.json"), "--id-column", "id"], {"r1", "r2"}),
    }
    for name, (extra, ids) in forms.items():
        out = tmp_path / f"{name}.out.jsonl"
        argv = ["-m", "jev", "batch", str(tmp_path / name), "-o", str(out), *extra]
        done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr
        lines = [json.loads(line) for line in out.read_text().splitlines()]
        assert {line["custom_id"] for line in lines} == ids and len(lines) == len(ids), name
        for line in lines:
            assert line["error"] is None and line["response"]["status_code"] == 200
            assert line["response"]["body"]["model"] == "smollm2-135m-cpu" and line["response"]["request_id"]
        assert "none failed" in done.stderr and "L3 hit" in done.stderr
