"""Which coherence modes (the request's x_coherence) a readout's question types offer, and the refusals.

A mode changes how the types with an option order (choice, score, span: each lists its options under codes in the
label-token layouts) lay out and read their rows; the other types (noul, set) are answered as
always. A model offers `off`, and every mode one of its ordered types answers its own way (questions/choice.py and
questions/span.py: cyclic; questions/prior_choice.py: prior; questions/score.py: cyclic); under a
mode the model offers that a type does not list, that type answers single pass, as `off`. A type whose head scores
each option apart from where it is listed (`position_free`) answers every mode unchanged, and a readout whose
ordered types are all position-free offers every mode. A mode the model does not offer, or a question the mode
cannot answer (a prior for an option count it does not cover), is a 422 before any forward, never a 5xx.
"""

from __future__ import annotations

from dataclasses import dataclass

from jev_common.errors import validation_error
from jev_common.schema import COHERENCE_MODES, CoherenceEntry

ORDERED_TYPES = ("choice", "score", "span")


@dataclass(frozen=True)
class AnsweredElsewhere:
    """An ordered question type that a server of the family's own answers (an external backend): no rows here, only
    what its head does with option order, for /v1/models and the refusals."""

    type: str
    position_free: bool
    coherence_note: str | None = None
    coherence_modes: frozenset = frozenset()

    def refuses(self, question, mode: str) -> str | None:
        return None


def offered(kinds: dict) -> list[str]:
    """The x_coherence modes a request may send to a readout with these question types (type -> kind)."""
    ordered = [kinds[t] for t in ORDERED_TYPES if t in kinds]
    if ordered and all(kind.position_free for kind in ordered):
        return sorted(COHERENCE_MODES)
    return sorted({"off"}.union(*(kind.coherence_modes for kind in ordered)))


def entries(kinds: dict) -> dict[str, CoherenceEntry]:
    """GET /v1/models: per ordered type, the modes it answers its own way, whether it is position-free, and why."""
    return {
        t: CoherenceEntry(
            modes=sorted({"off", *kinds[t].coherence_modes}),
            position_free=kinds[t].position_free,
            note=kinds[t].coherence_note,
        )
        for t in ORDERED_TYPES
        if t in kinds
    }


def check(questions: dict, kinds: dict, mode: str, served_by: str) -> None:
    """Refuse (422) a mode the readout does not offer, or a question it cannot answer under `mode`."""
    if mode == "off":
        return
    modes = offered(kinds)
    if mode not in modes:
        notes = "; ".join(
            f"{t}: {kinds[t].coherence_note}"
            for t in ORDERED_TYPES  # why a type offers none
            if t in kinds and kinds[t].coherence_note and not kinds[t].coherence_modes
        )
        raise validation_error(
            f"x_coherence: this model's readout ({served_by}) does not offer {mode!r} "
            f"(it offers: {', '.join(modes)}; GET /v1/models lists them){f'. {notes}' if notes else ''}",
            ("x_coherence",),
        )
    for qid, question in questions.items():
        kind = kinds.get(question.type)
        reason = kind.refuses(question, mode) if kind is not None and question.type in ORDERED_TYPES else None
        if reason is not None:
            raise validation_error(
                f"x_coherence {mode!r}: questions[{qid!r}]: this model's readout ({served_by}) {reason}",
                ("questions", qid, "criteria"),
            )
