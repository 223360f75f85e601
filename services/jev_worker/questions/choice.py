"""choice: one row listing the options under codes (A..Z, then two-letter codes); softmax over the codes.

Coherence `cyclic` (the request's x_coherence): one row per cyclic shift of the options (every shift up to
MAX_SHIFTS options, else MAX_SHIFTS evenly spaced ones), each a softmax over its codes, each option's probability
the mean over the rows of the probability its code got where it stood. In probability space, not log space: the
mean of distributions is a distribution, and one shift that puts an option at a position the model shuns pulls its
mean down by at most 1/K, where a log-space mean would let that one row dominate. The rows follow the same state
prefix, so K shifts cost K rows after one prefill, not K passes (Zheng et al., ICLR 2024, "cyclic permutation")."""
from __future__ import annotations

from jev_common.schema import ChoiceAnswer, ChoiceQuestion, choice_answer

from ..prompt import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities


def option_texts(names: list[str], descriptions: list[object | None], ctx: BuildContext,
                 where: str) -> list[tuple[str, str | None]]:
    """(name, description as checked user text, or None) of each option, checked once."""
    out = []
    for name, description in zip(names, descriptions):
        ctx.builder.check_user_text(name, f"{where}.criteria")
        out.append((name, None if description is None else ctx.user_text(description, f"{where}.criteria[{name!r}]")))
    return out


def listed(options: list[tuple[str, str | None]], codes: list[str], ctx: BuildContext) -> str:
    """The options under their codes, in the recipe's option lines."""
    prompt = ctx.prompt
    return "\n".join(prompt.option_line.format(code=code, name=name) if text is None else
                     prompt.described_option_line.format(code=code, name=name, description=text)
                     for code, (name, text) in zip(codes, options))


def option_lines(names: list[str], descriptions: list[object | None], codes: list[str], ctx: BuildContext,
                 where: str) -> str:
    return listed(option_texts(names, descriptions, ctx, where), codes, ctx)


MAX_SHIFTS = 8


def cyclic_shifts(n: int, most: int = MAX_SHIFTS) -> list[int]:
    """Every shift of n options up to `most`, else `most` evenly spaced ones."""
    return list(range(n)) if n <= most else sorted({round(j * n / most) % n for j in range(most)})


class Choice(QuestionKind):
    type = "choice"
    coherence_modes = frozenset({"cyclic"})
    coherence_note = (f"cyclic: every cyclic shift up to {MAX_SHIFTS} options, else {MAX_SHIFTS} evenly spaced, "
                      "averaged in probability space, one row each after one state prefill")

    def _shifts(self, question: ChoiceQuestion, ctx: BuildContext) -> list[int]:
        return cyclic_shifts(len(question.criteria)) if ctx.coherence == "cyclic" else [0]

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        options = option_texts(list(question.criteria), list(question.criteria.values()), ctx, where)
        codes, ids = ctx.builder.coded(len(options))
        question_line = ctx.question_line(question, where)
        rows = []
        for shift in self._shifts(question, ctx):  # the same checked texts, listed from each shift
            listing = listed(options[shift:] + options[:shift], codes, ctx)
            rows.append(RowSpec(question_line + ctx.prompt.choice_instruction.format(options=listing), ids))
        return rows

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        names = list(question.criteria)
        n, shifts = len(names), self._shifts(question, ctx)
        probs = [0.0] * n
        for shift, row in zip(shifts, logits):
            for position, p in enumerate(probabilities(row)):
                probs[(position + shift) % n] += p / len(shifts)  # the code at `position` named option shift+position
        return choice_answer(names, probs)
