"""The System One envelope as a Job (pipeline.py): the state (with its images) is the prefix, computed once
per request and kept in L3; every question is its own row(s) after it, and all rows of a request run in one
batched forward. A question's row never sees the other questions, its id or its position, so its answer does
not depend on them.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from jev_common.assets import asset_bytes, bytes_key
from jev_common.errors import validation_error
from jev_common.schema import SystemOneRequest

from ..questions.base import render_content
from .job import ImageSlot, Job


def l1_key(request: SystemOneRequest, image_keys: tuple[str, ...]) -> str:
    """What identifies the prompt: the state, questions and assets as sent (a field sent as null differs from one
    left out: some families' upstreams write them differently, e.g. JEMM's `None` for null instructions)."""
    payload = request.model_dump_json(include={"state", "questions", "assets", "x_coherence"}, exclude_unset=True)
    return hashlib.sha256(("envelope|" + payload + "|" + ",".join(image_keys)).encode()).hexdigest()


def job(
    request: SystemOneRequest, parts: dict[str, bytes], render: Callable[[SystemOneRequest], str] | None = None
) -> Job:
    """`render`: the state as the served family's prompt writes it (Readout.envelope_state; by default
    render_state), asset references still in place; the route key always hashes render_state's text."""
    refs = image_refs(request, parts)
    state_text = (render or render_state)(request)
    refuse_images_in_questions(request, refs, state_text)
    pieces: list = []
    at = 0
    for start, end, ref in state_occurrences(state_text, refs):
        pieces += [state_text[at:start], ImageSlot(ref.key)]
        at = end
    pieces.append(state_text[at:])
    keys = tuple(p.key for p in pieces if isinstance(p, ImageSlot))
    return Job(
        questions=dict(request.questions),
        state=request.state,
        pieces=tuple(pieces),
        where="state",
        route_text=render_state(request),
        route_images=tuple(r.key for r in refs),
        l1_key=l1_key(request, keys),
        request=request,
        has_images=bool(refs),
        coherence=request.x_coherence,
    )


# ----- images -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ImageRef:
    reference: str  # the placeholder string the request uses in its state
    key: str  # sha256 of the image bytes: the preencoder's asset name


def image_refs(request: SystemOneRequest, parts: dict[str, bytes]) -> list[ImageRef]:
    """The request's assets, each resolved to its key; every multipart part must be claimed once."""
    refs = []
    claimed = set()
    for reference, asset in (request.assets or {}).items():
        if asset.part is not None:
            if asset.part in claimed:
                raise validation_error(
                    f"multipart part {asset.part!r} is claimed by two assets", ("assets", reference, "part")
                )
            claimed.add(asset.part)
        refs.append(ImageRef(reference, bytes_key(asset_bytes(reference, asset, parts))))
    unclaimed = sorted(set(parts) - claimed)
    if unclaimed:
        raise validation_error(
            f"multipart part(s) {', '.join(map(repr, unclaimed))} are not named by any asset", ("assets",)
        )
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
            raise validation_error(
                f"image {ref.reference!r} is used in a question; images are served in the "
                "state only (questions are rows after the state)",
                ("questions",),
            )
        if not any(f in state for f in forms):
            raise validation_error(
                f"asset {ref.reference!r} is not placed in the state: put its reference "
                "where the image belongs in the state",
                ("assets", ref.reference),
            )


def render_state(request: SystemOneRequest) -> str:
    return render_content(request.state)
