"""Question type name -> its implementation. A new type is one module plus one line here."""

from __future__ import annotations

from ..protocols import QuestionKind
from .choice import Choice
from .noul import Noul
from .score import Score
from .set import SetKind
from .span import SpanKind

QUESTION_KINDS: dict[str, QuestionKind] = {
    kind.type: kind for kind in (Noul(), Choice(), Score(), SpanKind(), SetKind())
}
