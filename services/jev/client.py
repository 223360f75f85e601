"""POST a System One envelope and read the answer (standard library only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


class ApiFailure(Exception):
    """The server answered with an error, or could not be reached; str() says which and why."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def envelope(state, question: str | None, options: list[str], kind: str, model: str, qid: str = "q") -> dict:
    """The request for one question: choice (options named, no descriptions), noul (P(yes)), or
    score (options are the levels' descriptions, lowest first)."""
    q: dict = {"type": kind}
    if question:
        q["instructions"] = question
    if kind == "choice":
        if len(options) < 2:
            raise ValueError("a choice needs at least two options")
        if len(set(options)) != len(options):
            raise ValueError("options must be distinct")
        q["criteria"] = {name: None for name in options}
    elif kind == "score":
        if len(options) < 2:
            raise ValueError("a score needs at least two levels (lowest first)")
        q["criteria"] = list(options)
    elif kind == "noul":
        if options:
            raise ValueError("a noul question takes no options: its answer is P(yes)")
        if not question:
            raise ValueError("a noul question needs the question")
    else:
        raise ValueError(f"unknown question type {kind!r}")
    return {"model": model, "state": state, "questions": {qid: q}}


def _error_text(status: int, raw: bytes) -> str:
    try:
        body = json.loads(raw)
    except ValueError:
        return f"HTTP {status}: {raw[:200].decode(errors='replace')}"
    detail = body.get("detail") if isinstance(body, dict) else None
    if isinstance(detail, list):  # validation: [{"loc", "msg", "type"}]
        parts = [
            f"{'.'.join(str(p) for p in d.get('loc', []))}: {d.get('msg')}" for d in detail[:5] if isinstance(d, dict)
        ]
        return f"HTTP {status} validation error: " + "; ".join(parts)
    if isinstance(detail, dict):
        return f"HTTP {status} {detail.get('error_type', 'error')}: {detail.get('message', '')}"
    if isinstance(body, dict) and isinstance(body.get("error"), dict):  # the older envelope
        return f"HTTP {status} {body['error'].get('type', 'error')}: {body['error'].get('message', '')}"
    return f"HTTP {status}: {json.dumps(body)[:200]}"


def post(url: str, body: dict, *, api_key: str | None = None, timeout: float = 60.0) -> dict:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - a URL the user gave
            raw = response.read()
    except urllib.error.HTTPError as exc:
        raise ApiFailure(_error_text(exc.code, exc.read()), exc.code) from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ApiFailure(f"cannot reach {url}: {reason} (is the stack up? `make up`)") from None
    try:
        return json.loads(raw)
    except ValueError:
        raise ApiFailure(f"{url} answered something that is not JSON: {raw[:200]!r}") from None
