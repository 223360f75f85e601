"""Question types answered by option scoring (readouts/option_scoring.py): every option is its own row after the
shared state prefix, the question then the option's text as the model's answer, and its score is the summed
log-probability of that text's tokens (engine/continuation_head.py). No option is named by a label token, so no
option is bound to a position or a letter: the rows depend on the set of options, never on their order
(`position_free`).

Each row's result is [score] or, calibrated, [score, baseline]: the baseline is the same text's log-probability
after a content-free state (engine/baseline_rows.py, computed once per question). The calibrated score is
`(score - weight * baseline) / temperature` (weight 1: domain-conditional PMI, Holtzman et al., EMNLP 2021), plus
`bias` on the yes side of a yes/no; probabilities are the softmax of the calibrated scores (Scaling, per type,
fitted by tools/calibrate_option_scoring.py).

- choice: a row per option, its name the answer, the rows in name order (so any reordering of the options runs the
  same rows); options with a description are listed (by name too) under the question in every row;
- noul: the answers "Yes" and "No" (ScoredLayout's texts), P(yes);
- score: a row per level, the level's text the answer; score = sum(i * p_i) as the API defines it;
- span: a row per candidate (in name order), its text the answer; located in the state as the label-token span is;
- set: each statement its own yes/no pair of rows, P(yes) each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jev_common.schema import (
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    SetAnswer,
    SetQuestion,
    SpanAnswer,
    SpanQuestion,
    choice_answer,
    score_answer,
)

from ..prompt.scored_rows import ScoredRow
from ..protocols import QuestionKind
from ..values.datatypes import RowSpec
from .base import BuildContext
from .span import span_answer

POSITION_FREE_NOTE = "option scoring: each option is its own row, scored by its text, so no order to correct"


@dataclass(frozen=True)
class Scaling:
    """How a type's row scores become probabilities."""

    weight: float = 1.0  # share of the baseline subtracted (1: PMI; 0: raw log-probabilities)
    temperature: float = 1.0
    bias: float = 0.0  # added to the yes side's calibrated score (noul, set)

    def scores(self, rows) -> list[float]:
        return [(float(r[0]) - (self.weight * float(r[1]) if len(r) > 1 else 0.0)) / self.temperature for r in rows]

    def probabilities(self, rows) -> list[float]:
        return softmax(self.scores(rows))

    def yes(self, rows) -> float:
        """P(yes) from a (yes, no) pair of rows."""
        yes, no = self.scores(rows)
        return softmax([yes + self.bias / self.temperature, no])[0]

    def describe(self) -> dict:
        return {"weight": self.weight, "temperature": self.temperature, "bias": self.bias}


@dataclass(frozen=True)
class ScoredLayout:
    """The option-scoring text around a question's rows (the recipe's question_block and noul criteria lines come
    first): what is scored for yes and no, how described options are listed, how a set's statement is asked."""

    yes: str = "Yes"
    no: str = "No"
    choice_listing: str = "Options:\n{options}\n"
    statement_line: str = "Statement: {statement}\nIs the statement true?\n"


def softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = math.fsum(weights)
    return [w / total for w in weights]


def by_name(names: list[str]) -> list[int]:
    """The options' indices in name order: the rows a choice or span asks, whatever order it was sent in, so any
    reordering runs the very same batch (and gets bit-identical scores)."""
    return sorted(range(len(names)), key=names.__getitem__)


def as_sent(names: list[str], logits: list) -> list:
    """Rows asked in name order (by_name), back in the order the options were sent."""
    out = [None] * len(names)
    for row, index in zip(logits, by_name(names)):
        out[index] = row
    return out


class _Scored(QuestionKind):
    position_free = True
    coherence_note = POSITION_FREE_NOTE

    def __init__(self, scaling: Scaling, layout: ScoredLayout = ScoredLayout()):
        self.scaling = scaling
        self.layout = layout

    def yes_no_rows(self, content: str) -> list[RowSpec]:
        return [ScoredRow(content, (), answer=text) for text in (self.layout.yes, self.layout.no)]


class ScoredChoice(_Scored):
    type = "choice"
    min_options = 1

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        content = ctx.question_line(question, where)
        options = ctx.criteria(question, where)
        if any(text is not None for _, text in options):
            content += self.layout.choice_listing.format(
                options="\n".join(
                    name if text is None else f"{name}: {text}" for name, text in sorted(options, key=lambda o: o[0])
                )
            )
        return [ScoredRow(content, (), answer=options[i][0]) for i in by_name(list(question.criteria))]

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        names = list(question.criteria)
        return choice_answer(names, self.scaling.probabilities(as_sent(names, logits)))


class ScoredNoul(_Scored):
    type = "noul"

    def rows(self, question: NoulQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        prompt = ctx.prompt
        content = ctx.question_line(question, where)
        if question.criteria is not None:
            if question.criteria.true is not None:
                content += prompt.noul_true.format(
                    description=ctx.user_text(question.criteria.true, f"{where}.criteria.true")
                )
            if question.criteria.false is not None:
                content += prompt.noul_false.format(
                    description=ctx.user_text(question.criteria.false, f"{where}.criteria.false")
                )
        return self.yes_no_rows(content)

    def answer(self, question: NoulQuestion, logits, ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=self.scaling.yes(logits))


class ScoredScore(_Scored):
    type = "score"

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        content = ctx.question_line(question, where)
        return [
            ScoredRow(content, (), answer=ctx.user_text(level, f"{where}.criteria[{i}]"))
            for i, level in enumerate(question.criteria)
        ]

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        return score_answer(question.criteria, self.scaling.probabilities(logits))


class ScoredSpan(_Scored):
    type = "span"

    def rows(self, question: SpanQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        content = ctx.question_line(question, where)
        for candidate in question.criteria:
            ctx.builder.check_user_text(candidate, f"{where}.criteria")
        return [ScoredRow(content, (), answer=question.criteria[i]) for i in by_name(question.criteria)]

    def answer(self, question: SpanQuestion, logits, ctx: BuildContext) -> SpanAnswer:
        return span_answer(question.criteria, self.scaling.probabilities(as_sent(question.criteria, logits)), ctx.state)


class ScoredSet(_Scored):
    type = "set"

    def rows(self, question: SetQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        head = ctx.question_line(question, where)
        rows = []
        for name, text in ctx.criteria(question, where):
            statement = name if text is None else f"{name}: {text}"
            rows += self.yes_no_rows(head + self.layout.statement_line.format(statement=statement))
        return rows

    def answer(self, question: SetQuestion, logits, ctx: BuildContext) -> SetAnswer:
        yes = {name: self.scaling.yes(logits[2 * i : 2 * i + 2]) for i, name in enumerate(question.criteria)}
        return SetAnswer(selected=[name for name, p in yes.items() if p >= 0.5], probabilities=yes)
