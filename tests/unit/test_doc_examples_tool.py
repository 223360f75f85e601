"""tools/doc_examples.py finds tagged examples, reads curl lines, and reports each kind of drift."""

from __future__ import annotations

import json

import pytest

from tools import doc_examples as d

DOC = """
text
```bash example=one
curl -s -i localhost:8080/v1/systemone -H 'content-type: application/json' \\
  -d '{"kind": "choice", "options": ["a", "b"]}'
```
more text
```http example=one
HTTP/1.1 200 OK
x-jev-cache: l1=miss,l3=hit
Content-Type: application/json

{"type": "choice", "probabilities": [0.5, 0.5], "usage": {"tokens": 3}, "choice": "a"}
```
```bash
not an example
```
"""


def test_find_and_parse():
    [example] = d.find(DOC, "doc.md")
    request = d.parse_curl(example.command)
    assert (request.method, request.url, request.include_headers) == (
        "POST",
        "http://localhost:8080/v1/systemone",
        True,
    )
    assert request.headers == {"content-type": "application/json"}
    assert json.loads(request.body) == {"kind": "choice", "options": ["a", "b"]}
    shown = d.shown_answer(example)
    assert shown.status == 200 and shown.headers["x-jev-cache"] == "l1=miss,l3=hit"
    assert d.retarget(request.url, {8080: "http://127.0.0.1:5555"}) == "http://127.0.0.1:5555/v1/systemone"
    with pytest.raises(ValueError, match="port 9"):
        d.retarget("http://localhost:9/x", {8080: "http://127.0.0.1:5555"})
    with pytest.raises(ValueError, match="needs a bash block"):
        d.find("```json example=lonely\n{}\n```\n", "doc.md")
    [program] = d.find("```python example=sdk\nprint(1)\n```\n", "doc.md")
    assert program.code == "print(1)\n" and not program.command


def test_python_examples_run_against_the_stack_urls():
    code = "import sys; print(sys.argv, 'http://localhost:8080/v1/x'); print('http://127.0.0.1:8000')\n"
    status, output = d.run_python(d.Example("p", "doc.md", code=code), {8080: "http://127.0.0.1:5", 8000: "http://h:6"})
    assert status == 0 and output == "['-c'] http://127.0.0.1:5/v1/x\nhttp://h:6\n"


def test_every_doc_parses():
    for example in d.all_examples():
        if example.code:
            compile(example.code, example.name, "exec")
            continue
        d.parse_curl(example.command)
        d.shown_answer(example)


def _answer(**change):
    body = {"type": "choice", "probabilities": [0.3, 0.7], "usage": {"tokens": 9}, "choice": "b"}
    body.update(change)
    return d.Answer(200, {"x-jev-cache": "l3=miss,l1=hit", "content-type": "application/json; charset=utf-8"}, body)


def test_check_accepts_other_numbers_and_strings_but_not_another_shape():
    shown = d.shown_answer(d.find(DOC, "doc.md")[0])
    assert d.check(shown, _answer()) == []
    assert any(
        "not in the answer: ['choice']" in p
        for p in d.check(
            shown,
            d.Answer(200, _answer().headers, {"type": "choice", "probabilities": [0.3, 0.7], "usage": {"tokens": 9}}),
        )
    )
    assert any("do not show: ['extra']" in p for p in d.check(shown, _answer(extra=1)))
    assert any("shown 2 items, got 3" in p for p in d.check(shown, _answer(probabilities=[0.1, 0.2, 0.7])))
    assert any("$.type: shown 'choice', got 'noul'" in p for p in d.check(shown, _answer(type="noul")))
    assert any("shown number" in p for p in d.check(shown, _answer(usage={"tokens": "9"})))
    assert any("shown an integer" in p for p in d.check(shown, _answer(usage={"tokens": 9.5})))
    drifted = d.Answer(200, {"x-jev-cache": "l1=hit,l3=miss"}, _answer().body)
    shown_l2 = d.Answer(200, {"x-jev-cache": "l1=miss,l2=miss,l3=hit"}, None)
    assert d.check(shown_l2, drifted) == ["header x-jev-cache: shown levels ['l1', 'l2', 'l3'], sent 'l1=hit,l3=miss'"]
    assert d.check(d.Answer(422, {}, None), _answer()) == ["status: shown 422, got 200"]
