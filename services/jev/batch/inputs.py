"""The three input forms of `jev batch`, read as a stream of `Line`s (one request each), never whole.

- JSONL of OpenAI batch lines: `{"custom_id", "method": "POST", "url": "/v1/systemone", "body": {request}}`;
- JSONL of plain System One requests: the id is `line-N`, N the line's number in the file (blank lines count);
- CSV with a questions file: every row one request, its state the `--state-column`s (one column: its text; several:
  an object of them), its questions the file's, its id the `--id-column` or `row-N` (N from 1, the header apart).

The JSONL form is the first non-blank line's: a file that starts with a batch line is read as batch lines, and a
later line that is not one is an invalid line (written to the errors file), never sent as something else.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

SYSTEM_ONE_PATH = "/v1/systemone"


class InputError(Exception):
    """The input as a whole cannot be read (a missing file, a questions file that is not one); str() says why."""


@dataclass
class Line:
    number: int  # the line's (JSONL) or data row's (CSV) number in the input, from 1
    custom_id: str
    body: dict | None  # the request to send; None when the line is invalid
    error: str | None = None  # why the line cannot be sent

    @property
    def group(self) -> str:
        """The state the request asks about (with its model and assets): requests of one group share a prefix."""
        if self.body is None:
            return ""
        key = json.dumps([self.body.get("model"), self.body.get("state"), self.body.get("assets")], sort_keys=False)
        return hashlib.blake2b(key.encode(), digest_size=16).hexdigest()


def open_text(path: str) -> IO[str]:
    """The input as text (`-`: standard input)."""
    if path == "-":
        return io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="")
    try:
        return open(path, encoding="utf-8", newline="")  # noqa: SIM115 - the caller closes it
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror or exc}") from None


def count_lines(path: str, csv_rows: bool) -> int | None:
    """How many requests the input holds (for the progress bar's ETA); None for standard input. JSONL: non-blank
    lines; CSV: data rows (a quoted cell may span lines, so the rows are parsed)."""
    if path == "-":
        return None
    if csv_rows:
        with open_text(path) as handle:
            return max(0, sum(1 for _ in csv.reader(handle)) - 1)
    total = 0
    with open(path, "rb") as handle:
        for raw in handle:
            total += bool(raw.strip())
    return total


def read_jsonl(handle: IO[str], model: str) -> Iterator[Line]:
    """Batch lines or plain requests, as the first non-blank line is; `model` fills a request that names none."""
    batch_form: bool | None = None
    for number, raw in enumerate(handle, start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            value = json.loads(text)
        except ValueError as exc:
            yield Line(number, f"line-{number}", None, f"line {number} is not JSON: {exc}")
            continue
        if batch_form is None:
            batch_form = isinstance(value, dict) and "custom_id" in value
        if batch_form:
            yield _batch_line(number, value, model)
        elif not isinstance(value, dict):
            yield Line(number, f"line-{number}", None, f"line {number} is not a JSON object (a request)")
        else:
            yield Line(number, f"line-{number}", _with_model(value, model))


def _batch_line(number: int, value, model: str) -> Line:
    fallback = f"line-{number}"
    if not isinstance(value, dict):
        return Line(number, fallback, None, f"line {number} is not a JSON object (a batch line)")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return Line(number, fallback, None, f"line {number} has no custom_id (a non-empty string)")
    method, url, body = value.get("method", "POST"), value.get("url", SYSTEM_ONE_PATH), value.get("body")
    if method != "POST":
        return Line(number, custom_id, None, f"line {number}: method {method!r}; only POST is sent")
    if url != SYSTEM_ONE_PATH:
        return Line(number, custom_id, None, f"line {number}: url {url!r}; only {SYSTEM_ONE_PATH} is sent")
    if not isinstance(body, dict):
        return Line(number, custom_id, None, f"line {number}: body is not a JSON object (a System One request)")
    return Line(number, custom_id, _with_model(body, model))


def _with_model(body: dict, model: str) -> dict:
    return body if "model" in body else {**body, "model": model}


@dataclass(frozen=True)
class CsvSpec:
    """How CSV rows become requests: the questions, the state's columns (empty: every column but the id's), the
    id column (None: `row-N`) and the model."""

    questions: dict
    state_columns: tuple[str, ...] = ()
    id_column: str | None = None
    model: str = "jev-latest"

    @classmethod
    def load(cls, questions_file: str, state_columns, id_column: str | None, model: str) -> CsvSpec:
        try:
            questions = json.loads(Path(questions_file).read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"cannot read the questions file {questions_file}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise InputError(f"the questions file {questions_file} is not JSON: {exc}") from None
        if isinstance(questions, dict) and isinstance(questions.get("questions"), dict):
            questions = questions["questions"]  # a request-shaped file: its questions
        if not isinstance(questions, dict) or not questions:
            raise InputError(
                f"the questions file {questions_file} must hold the request's questions: "
                '{"id": {"type": "noul", "instructions": "..."}, ...}'
            )
        return cls(questions, tuple(state_columns or ()), id_column, model)


def read_csv(handle: IO[str], spec: CsvSpec) -> Iterator[Line]:
    reader = csv.DictReader(handle)
    header = reader.fieldnames or []
    wanted = [*spec.state_columns, *([spec.id_column] if spec.id_column else [])]
    missing = [name for name in wanted if name not in header]
    if missing:
        raise InputError(f"the CSV has no column {', '.join(map(repr, missing))} (its columns: {', '.join(header)})")
    columns = list(spec.state_columns) or [name for name in header if name != spec.id_column]
    if not columns:
        raise InputError("the CSV has no column left for the state")
    for number, row in enumerate(reader, start=1):
        custom_id = (row.get(spec.id_column) or "").strip() if spec.id_column else f"row-{number}"
        if not custom_id:
            yield Line(number, f"row-{number}", None, f"row {number} has an empty {spec.id_column!r}")
            continue
        if None in row:  # more cells than the header names
            yield Line(number, custom_id, None, f"row {number} has more cells than the header has columns")
            continue
        state = (row[columns[0]] or "") if len(columns) == 1 else {name: row[name] for name in columns}
        yield Line(number, custom_id, {"model": spec.model, "state": state, "questions": spec.questions})
