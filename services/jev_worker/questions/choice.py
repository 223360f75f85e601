"""choice: one row listing the options under codes (A..Z, then two-letter codes); softmax over the codes.

Coherence `cyclic` (the request's x_coherence): the options put in one canonical order (by name, whatever order they
were sent in), then one row per cyclic shift of that order (every shift up to MAX_SHIFTS options, else MAX_SHIFTS
evenly spaced ones), each a softmax over its codes, each option's probability the mean over the rows of the
probability its code got where it stood. The rows depend only on the set of options, so any reordering of a
question's options (not only a shift) gets the same rows and the same answer, and each option still stands at each
position once (with every shift used), as PriDe's prior estimate needs. In probability space, not log space: the
mean of distributions is a distribution, and one shift that puts an option at a position the model shuns pulls its
mean down by at most 1/K, where a log-space mean would let that one row dominate. The rows follow the same state
prefix, so K shifts cost K rows after one prefill, not K passes (Zheng et al., ICLR 2024, "cyclic permutation")."""

from __future__ import annotations

from jev_common.schema import ChoiceAnswer, ChoiceQuestion, choice_answer

from ..prompt.builder import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities


def option_texts(
    names: list[str], descriptions: list[object | None], ctx: BuildContext, where: str
) -> list[tuple[str, str | None]]:
    """(name, description as checked user text, or None) of each option, checked once."""
    out = []
    for name, description in zip(names, descriptions):
        ctx.builder.check_user_text(name, f"{where}.criteria")
        out.append((name, None if description is None else ctx.user_text(description, f"{where}.criteria[{name!r}]")))
    return out


def listed(options: list[tuple[str, str | None]], codes: list[str], ctx: BuildContext) -> str:
    """The options under their codes, in the recipe's option lines."""
    prompt = ctx.prompt
    return "\n".join(
        prompt.option_line.format(code=code, name=name)
        if text is None
        else prompt.described_option_line.format(code=code, name=name, description=text)
        for code, (name, text) in zip(codes, options)
    )


MAX_SHIFTS = 8


def cyclic_shifts(n: int, most: int = MAX_SHIFTS) -> list[int]:
    """Every shift of n options up to `most`, else `most` evenly spaced ones."""
    return list(range(n)) if n <= most else sorted({round(j * n / most) % n for j in range(most)})


class Listings:
    """How one coded question lists its options under a coherence mode: the order its rows list them from (as
    sent; under `cyclic` by name) and the shifts of that order, a row each (under any other mode one row, as sent).
    Shared by every type that lists options under codes (choice, span)."""

    def __init__(self, names: list[str], coherence: str):
        self.n = len(names)
        self.order = list(range(self.n))
        self.shifts = [0]
        if coherence == "cyclic":
            self.order.sort(key=names.__getitem__)
            self.shifts = cyclic_shifts(self.n)

    def rows(self, items: list) -> list[list]:
        """`items` (one per option, in the order sent) as each row lists them."""
        ordered = [items[i] for i in self.order]
        return [ordered[shift:] + ordered[:shift] for shift in self.shifts]

    def mean(self, logits) -> list[float]:
        """Each option's probability (in the order sent): the mean over the rows of what its code got where it
        stood."""
        probs = [0.0] * self.n
        for shift, row in zip(self.shifts, logits):
            for position, p in enumerate(probabilities(row)):  # the code at `position` named order[shift+position]
                probs[self.order[(position + shift) % self.n]] += p / len(self.shifts)
        return probs


def coded_rows(
    question, names: list[str], options: list[tuple[str, str | None]], ctx: BuildContext, where: str
) -> list[RowSpec]:
    """A coded question's rows (choice, span): its question line, then its checked options under their codes, one
    row per listing of them (Listings)."""
    codes, ids = ctx.builder.coded(len(options))
    question_line = ctx.question_line(question, where)
    return [
        RowSpec(question_line + ctx.prompt.choice_instruction.format(options=listed(row, codes, ctx)), ids)
        for row in Listings(names, ctx.coherence).rows(options)
    ]


class Choice(QuestionKind):
    type = "choice"
    coherence_modes = frozenset({"cyclic"})
    coherence_note = (
        f"cyclic: the options by name, then every cyclic shift up to {MAX_SHIFTS} options, else "
        f"{MAX_SHIFTS} evenly spaced, averaged in probability space, one row each after one state "
        "prefill: any reordering of the options gets the same answer"
    )

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        names = list(question.criteria)
        return coded_rows(
            question, names, option_texts(names, list(question.criteria.values()), ctx, where), ctx, where
        )

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        names = list(question.criteria)
        return choice_answer(names, Listings(names, ctx.coherence).mean(logits))
