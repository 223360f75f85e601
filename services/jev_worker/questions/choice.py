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


def option_lines(names: list[str], descriptions: list[object | None], codes: list[str], ctx: BuildContext,
                 where: str) -> str:
    prompt = ctx.prompt
    lines = []
    for code, name, description in zip(codes, names, descriptions):
        ctx.builder.check_user_text(name, f"{where}.criteria")
        if description is None:
            lines.append(prompt.option_line.format(code=code, name=name))
        else:
            text = ctx.user_text(description, f"{where}.criteria[{name!r}]")
            lines.append(prompt.described_option_line.format(code=code, name=name, description=text))
    return "\n".join(lines)


MAX_SHIFTS = 8


def cyclic_shifts(n: int, most: int = MAX_SHIFTS) -> list[int]:
    """Every shift of n options up to `most`, else `most` evenly spaced ones."""
    return list(range(n)) if n <= most else sorted({round(j * n / most) % n for j in range(most)})


class Choice(QuestionKind):
    type = "choice"
    coherence_modes = frozenset({"cyclic"})

    def _shifts(self, question: ChoiceQuestion, ctx: BuildContext) -> list[int]:
        return cyclic_shifts(len(question.criteria)) if ctx.coherence == "cyclic" else [0]

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        names, descriptions = list(question.criteria), list(question.criteria.values())
        codes, ids = ctx.builder.coded(len(names))
        rows = []
        for shift in self._shifts(question, ctx):
            listing = option_lines(names[shift:] + names[:shift], descriptions[shift:] + descriptions[:shift], codes,
                                   ctx, where)
            content = ctx.question_line(question, where) + ctx.prompt.choice_instruction.format(options=listing)
            rows.append(RowSpec(content, ids))
        return rows

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        names = list(question.criteria)
        n, shifts = len(names), self._shifts(question, ctx)
        probs = [0.0] * n
        for shift, row in zip(shifts, logits):
            for position, p in enumerate(probabilities(row)):
                probs[(position + shift) % n] += p / len(shifts)  # the code at `position` named option shift+position
        return choice_answer(names, probs)
