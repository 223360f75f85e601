"""The System One envelope on the worker: questions -> rows after one shared state prefix -> answers.

The state (with its images) is the prefix, computed once per request and kept in L3; every question
is its own row(s) after it, and all rows of a request run in one batched forward. A question's row
never sees the other questions, its id or its position, so its answer does not depend on them.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass

import torch

from jev_common.assets import DEFAULT_MAX_IMAGE_BYTES, bytes_key
from jev_common.errors import ApiError, UnsupportedQuestionType, validation_error
from jev_common.schema import SystemOneRequest

from .prompt import PreparedRequest, RowSpec
from .protocols import PromptBuilder
from .questions.base import BuildContext, render_content
from .questions.registry import QUESTION_KINDS


@dataclass(frozen=True)
class QuestionPlan:
    qid: str
    question: object
    first_row: int
    n_rows: int


@dataclass(frozen=True)
class EnvelopePlan:
    questions: tuple[QuestionPlan, ...]
    state: object


def question_rows(request: SystemOneRequest, builder: PromptBuilder, kinds: dict | None = None,
                  served_by: str = "label-tokens") -> tuple[list[RowSpec], EnvelopePlan]:
    """Rows of every question, by the served readout's question types (`kinds`)."""
    kinds = QUESTION_KINDS if kinds is None else kinds
    ctx = BuildContext(builder, request.state)
    rows: list[RowSpec] = []
    plans = []
    for qid, question in request.questions.items():
        kind = kinds.get(question.type)
        if kind is None:
            raise UnsupportedQuestionType(
                f"questions[{qid!r}]: question type {question.type!r} is not answered by this model's readout "
                f"({served_by}); it answers {', '.join(sorted(kinds))}")
        built = kind.rows(question, ctx, f"questions[{qid!r}]")
        plans.append(QuestionPlan(qid, question, len(rows), len(built)))
        rows.extend(built)
    return rows, EnvelopePlan(tuple(plans), request.state)


def answers(plan: EnvelopePlan, row_logits: list[torch.Tensor], builder: PromptBuilder,
            kinds: dict | None = None) -> dict:
    kinds = QUESTION_KINDS if kinds is None else kinds
    ctx = BuildContext(builder, plan.state, plan)
    out = {}
    for q in plan.questions:
        kind = kinds[q.question.type]
        out[q.qid] = kind.answer(q.question, row_logits[q.first_row : q.first_row + q.n_rows], ctx)
    return out


def l1_key(request: SystemOneRequest, image_keys: tuple[str, ...]) -> str:
    payload = request.model_dump_json(include={"state", "questions", "assets"})
    return hashlib.sha256(("envelope|" + payload + "|" + ",".join(image_keys)).encode()).hexdigest()


# ----- images -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageRef:
    reference: str  # the placeholder string the request uses in its state
    key: str        # sha256 of the image bytes: the preencoder's asset name


def image_refs(request: SystemOneRequest, parts: dict[str, bytes]) -> list[ImageRef]:
    """The request's assets, each resolved to its key; every multipart part must be claimed once."""
    refs = []
    claimed = set()
    for reference, asset in (request.assets or {}).items():
        if asset.part is not None:
            if asset.part not in parts:
                raise validation_error(f"asset {reference!r} names multipart part {asset.part!r}, which is not in "
                                       "the request", ("assets", reference, "part"), "missing")
            if asset.part in claimed:
                raise validation_error(f"multipart part {asset.part!r} is claimed by two assets",
                                       ("assets", reference, "part"))
            claimed.add(asset.part)
            data = parts[asset.part]
        else:
            try:
                data = base64.b64decode(re.sub(r"\s+", "", asset.data_base64 or ""), validate=True)
            except (binascii.Error, ValueError):
                raise validation_error(f"asset {reference!r}: data_base64 is not valid base64",
                                       ("assets", reference, "data_base64")) from None
        if not data:
            raise validation_error(f"asset {reference!r} is empty", ("assets", reference))
        if len(data) > DEFAULT_MAX_IMAGE_BYTES:
            raise ApiError(413, "body_too_large", f"asset {reference!r} is {len(data)} bytes; the limit is "
                                                  f"{DEFAULT_MAX_IMAGE_BYTES}")
        refs.append(ImageRef(reference, bytes_key(data)))
    unclaimed = sorted(set(parts) - claimed)
    if unclaimed:
        raise validation_error(f"multipart part(s) {', '.join(map(repr, unclaimed))} are not named by any asset",
                               ("assets",))
    return refs


def _forms(reference: str) -> tuple[str, ...]:
    """How a reference reads in the rendered state: as sent in a text state, JSON-escaped inside an
    object or array state (a reference with quotes or backslashes differs there)."""
    escaped = json.dumps(reference, ensure_ascii=False)[1:-1]
    return (reference,) if escaped == reference else (reference, escaped)


def state_occurrences(state_text: str, refs: list[ImageRef]) -> list[tuple[int, int, ImageRef]]:
    """(start, end, ref) of every image reference in the rendered state, in order."""
    if not refs:
        return []
    by_form = {form: r for r in refs for form in _forms(r.reference)}
    pattern = re.compile("|".join(re.escape(f) for f in sorted(by_form, key=len, reverse=True)))
    return [(m.start(), m.end(), by_form[m.group(0)]) for m in pattern.finditer(state_text)]


def refuse_images_in_questions(request: SystemOneRequest, refs: list[ImageRef], state: str) -> None:
    """Images are placed in the state only (`state`: the rendered state); an asset the state never
    names is a caller's mistake (it would be answered without the image), so both are refused."""
    if not refs:
        return
    questions = json.dumps(request.model_dump(mode="json", include={"questions"}), ensure_ascii=False)
    for ref in refs:
        forms = _forms(ref.reference)
        if any(json.dumps(f, ensure_ascii=False)[1:-1] in questions for f in forms):
            raise validation_error(f"image {ref.reference!r} is used in a question; images are served in the "
                                   "state only (questions are rows after the state)", ("questions",))
        if not any(f in state for f in forms):
            raise validation_error(f"asset {ref.reference!r} is not placed in the state: put its reference "
                                   "where the image belongs in the state", ("assets", ref.reference))


def render_state(request: SystemOneRequest) -> str:
    return render_content(request.state)
