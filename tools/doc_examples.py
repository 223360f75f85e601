"""The request/response examples in README.md and docs/, found, run and checked, so docs cannot drift.

An example is two fenced blocks tagged with the same name in their info string:

    ```bash example=ticket          a curl command (one per block; `\\` continues a line)
    ```json example=ticket          the answer shown: a JSON body
    ```http example=ticket          or, for `curl -i`, a status line, headers, a blank line, a JSON body
    ```python example=sdk           a program on its own (an SDK example): it must exit 0 and print

`send(parse_curl(example.command), base_urls)` sends the request to a running stack (the URL's host:port replaced by the
stack's), and `check(shown, actual)` compares the answer with what the docs show: the status, the
headers shown (for `x-jev-cache`, the same cache levels), and the JSON body's shape: the same keys at
every level, the same types, lists of the same length, and the same string at `type`-like keys
(`SHAPE_EXACT`). Numbers and other strings may differ: a model's numbers are not the docs' business.
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs")
SHAPE_EXACT = {"type", "model", "kind", "error_type", "status", "object"}
_FENCE = re.compile(
    r"^```(?P<lang>[A-Za-z]+)[^\n]*?\bexample=(?P<name>[A-Za-z0-9_.-]+)[^\n]*\n(?P<body>.*?)^```\s*$", re.M | re.S
)


@dataclass
class Example:
    name: str
    source: str
    command: str = ""
    shown: str = ""
    shown_kind: str = ""  # json | http
    code: str = ""  # a python example


@dataclass
class Request:
    method: str
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | None = None
    include_headers: bool = False


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: object


def doc_files(root: Path = ROOT) -> list[Path]:
    files = []
    for entry in DOCS:
        path = root / entry
        files.extend(sorted(path.rglob("*.md")) if path.is_dir() else [path])
    return files


def find(text: str, source: str) -> list[Example]:
    """Every tagged example of one markdown text; an example missing its request or answer is an error."""
    examples: dict[str, Example] = {}
    for match in _FENCE.finditer(text):
        name, lang, body = match.group("name"), match.group("lang").lower(), match.group("body")
        example = examples.setdefault(name, Example(name, source))
        if lang in ("bash", "sh", "shell", "console"):
            example.command = body
        elif lang in ("json", "http"):
            example.shown, example.shown_kind = body, lang
        elif lang == "python":
            example.code = body
        else:
            raise ValueError(f"{source}: example {name!r} has a {lang!r} block; expected bash, json, http or python")
    for example in examples.values():
        if example.code and not (example.command or example.shown):
            continue
        if not example.command or not example.shown or example.code:
            raise ValueError(
                f"{source}: example {example.name!r} needs a bash block (the request) and a "
                f"json/http block (the answer)"
            )
    return list(examples.values())


def parse_curl(command: str, root: Path = ROOT) -> Request:
    words = shlex.split(command.replace("\\\n", " "), comments=True)
    if not words or words[0] != "curl":
        raise ValueError(f"not a curl command: {command[:80]!r}")
    method, url, headers, body, include = None, None, {}, None, False
    args = iter(words[1:])
    for word in args:
        if word in ("-X", "--request"):
            method = next(args)
        elif word in ("-H", "--header"):
            key, _, value = next(args).partition(":")
            headers[key.strip()] = value.strip()
        elif word in ("-d", "--data", "--data-binary", "--data-raw"):
            data = next(args)
            body = (root / data[1:]).read_bytes() if data.startswith("@") and word != "--data-raw" else data.encode()
        elif word in ("-i", "--include"):
            include = True
        elif word.startswith("-"):
            continue  # -s, --fail-with-body, ...: how curl talks, not what it sends
        else:
            url = word if "://" in word else "http://" + word
    if url is None:
        raise ValueError(f"no URL in {command[:80]!r}")
    return Request(method or ("POST" if body is not None else "GET"), url, headers, body, include)


def retarget(url: str, base_urls: dict[int, str]) -> str:
    """http://localhost:8080/x -> <the stack's URL for port 8080>/x."""
    match = re.match(r"^https?://[^/:]+(?::(?P<port>\d+))?(?P<rest>/.*)?$", url)
    if not match:
        raise ValueError(f"cannot read the URL {url!r}")
    port = int(match.group("port") or 80)
    if port not in base_urls:
        raise ValueError(f"the example talks to port {port}; the stack has {sorted(base_urls)}")
    return base_urls[port].rstrip("/") + (match.group("rest") or "")


def send(request: Request, base_urls: dict[int, str], timeout: float = 120.0) -> Answer:
    http = urllib.request.Request(
        retarget(request.url, base_urls), data=request.body, method=request.method, headers=request.headers
    )
    try:
        with urllib.request.urlopen(http, timeout=timeout) as response:  # noqa: S310 - loopback stack
            status, headers, raw = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, headers, raw = exc.code, dict(exc.headers), exc.read()
    try:
        body = json.loads(raw)
    except ValueError:
        body = raw.decode(errors="replace")
    return Answer(status, {k.lower(): v for k, v in headers.items()}, body)


def shown_answer(example: Example) -> Answer:
    if example.shown_kind == "json":
        return Answer(200, {}, json.loads(example.shown))
    head, _, body = example.shown.partition("\n\n")
    lines = head.strip().splitlines()
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return Answer(status, headers, json.loads(body) if body.strip() else None)


def _kind(value) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value) if value is None else "bool"
    if isinstance(value, (int, float)):
        return "number"
    return type(value).__name__


def shape_diff(shown, actual, where: str = "$") -> list[str]:
    """Where the actual JSON's shape differs from the shown one (empty: same shape)."""
    if _kind(shown) != _kind(actual):
        return [
            f"{where}: shown {_kind(shown)} {json.dumps(shown)[:60]}, got {_kind(actual)} {json.dumps(actual)[:60]}"
        ]
    problems: list[str] = []
    if isinstance(shown, dict):
        missing, extra = sorted(set(shown) - set(actual)), sorted(set(actual) - set(shown))
        if missing:
            problems.append(f"{where}: shown keys not in the answer: {missing}")
        if extra:
            problems.append(f"{where}: answer keys the docs do not show: {extra}")
        for key in shown.keys() & actual.keys():
            if key in SHAPE_EXACT and isinstance(shown[key], str) and shown[key] != actual[key]:
                problems.append(f"{where}.{key}: shown {shown[key]!r}, got {actual[key]!r}")
            else:
                problems.extend(shape_diff(shown[key], actual[key], f"{where}.{key}"))
    elif isinstance(shown, list):
        if len(shown) != len(actual):
            problems.append(f"{where}: shown {len(shown)} items, got {len(actual)}")
        for i, (a, b) in enumerate(zip(shown, actual)):
            problems.extend(shape_diff(a, b, f"{where}[{i}]"))
    elif isinstance(shown, int) and not isinstance(shown, bool) and isinstance(actual, float):
        problems.append(f"{where}: shown an integer, got {actual!r}")
    return problems


def _cache_levels(value: str) -> list[str]:
    return sorted(part.split("=")[0].strip() for part in value.split(",") if part.strip())


def check(shown: Answer, actual: Answer) -> list[str]:
    problems = []
    if shown.status != actual.status:
        problems.append(f"status: shown {shown.status}, got {actual.status}")
    for name, value in shown.headers.items():
        got = actual.headers.get(name)
        if got is None:
            problems.append(f"header {name}: shown, not sent")
        elif name == "x-jev-cache" and _cache_levels(value) != _cache_levels(got):
            problems.append(f"header x-jev-cache: shown levels {_cache_levels(value)}, sent {got!r}")
        elif name == "content-type" and value.split(";")[0] != got.split(";")[0]:
            problems.append(f"header content-type: shown {value!r}, sent {got!r}")
    if shown.body is not None:
        problems.extend(shape_diff(shown.body, actual.body))
    return problems


def run_python(example: Example, base_urls: dict[int, str], timeout: float = 120.0) -> tuple[int, str]:
    """Run a python example with its localhost URLs pointed at the stack: (exit status, output)."""
    import subprocess
    import sys

    code = re.sub(
        r"https?://(?:localhost|127\.0\.0\.1):(\d+)",
        lambda m: retarget(m.group(0) + "/", base_urls).rstrip("/"),
        example.code,
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def all_examples(root: Path = ROOT) -> list[Example]:
    found = []
    for path in doc_files(root):
        found.extend(find(path.read_text(encoding="utf-8"), str(path.relative_to(root))))
    return found
