"""score: one row listing the levels 0..n-1, read from the digit tokens (codes when digits are not one
token each); score = sum(i * p_i).

Coherence `cyclic` (the request's x_coherence): a second row lists the levels in reverse order, the legend unchanged
(digit i still names level i, wherever its line stands), and each level's probability is the mean of the two rows'
(in probability space, as choice's shifts: questions/choice.py). The rows follow the same state prefix and share
their question line, so the reversed order costs one more row, not a prefill. Under `prior` a score is answered
single pass: PriDe's prior is over option codes that name different options in different orders, and a score's
digit always names the same level, so there is no code prior to estimate apart from the levels' meaning."""

from __future__ import annotations

from jev_common.schema import ScoreAnswer, ScoreQuestion, score_answer

from ..prompt.builder import RowSpec
from ..protocols import QuestionKind
from .base import BuildContext, probabilities


class Score(QuestionKind):
    type = "score"
    coherence_modes = frozenset({"cyclic"})
    coherence_note = (
        "cyclic: the levels also listed in reverse order, digit i still level i, the two rows averaged; "
        "prior: single pass (a digit always names its level: no option-code prior to remove)"
    )

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        n = len(question.criteria)
        digits = ctx.builder.digit_ids
        codes, ids = ([str(i) for i in range(n)], digits[:n]) if digits else ctx.builder.coded(n)
        lines = [
            ctx.prompt.option_line.format(code=code, name=ctx.user_text(level, f"{where}.criteria[{i}]"))
            for i, (code, level) in enumerate(zip(codes, question.criteria))
        ]
        question_line = ctx.question_line(question, where)
        orders = [lines, lines[::-1]] if ctx.coherence == "cyclic" and n > 1 else [lines]
        rows = []
        for listed in orders:  # the same labels (level order) in each row: only where each line stands changes
            listing = "\n".join(listed)
            instruction = (
                ctx.prompt.levels_instruction.format(levels=listing)
                if digits
                else ctx.prompt.choice_instruction.format(options=listing)
            )
            rows.append(RowSpec(question_line + instruction, tuple(ids)))
        return rows

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        rows = [probabilities(row) for row in logits]
        probs = [sum(row[i] for row in rows) / len(rows) for i in range(len(rows[0]))]
        return score_answer(question.criteria, probs)
