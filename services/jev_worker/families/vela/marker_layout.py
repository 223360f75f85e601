"""Vela 2.0 0.3B (`vela2-unified`) input layout: a request's questions and state as marker sequences.

Sources (reference only): vLLM-SR's reimplementation of the packages' engine (vllm-project/semantic-router,
`src/model-runtime/vllm_srun/families/vela2/`: `request.py` reads a System One state into typed parts and
questions, `layout.py` groups the questions into rows, `encoder_layout.py` assembles a row) and a Swift port
of the packages' `schema_lib.assemble`. One sequence per row:

    [bos] ([Q] question ([O] option)* [ABS]?)* ([E] label)* [SEP_SCHEMA] ([SEG_role] part)* [eos]

Markers are placed by id (the worker's tokenizer has none of them, so text never makes one); every piece of
text is tokenised on its own, without special tokens; an option or label reads `name`, or `name: description`.
The first row holds every choice, noul, score and set question and the first span question; each further span
question has a row of its own. A question reads every part (the packages' default without `over`): its pool
runs from the first part's [SEG_role] marker to the last part's end. A span question adds only its [E] labels
and is read at the first sub-word of every word of the user part.

The state is read into typed parts as both members read it (layout.state_parts).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from jev_common.errors import UnreadableInput

from ...prompt.builder import PreparedRequest, ids_key
from ...protocols import PromptBuilder
from .layout import SPAN_ROLE, state_parts, words_of

MARKERS = ("[Q]", "[O]", "[ABS]", "[SEP_SCHEMA]", "[SEG_user]", "[SEG_answer]", "[E]", "[SEG_context]")


def option_text(name: str, description: str) -> str:
    return f"{name}: {description}" if description else name


@dataclass(frozen=True)
class MarkerRow:
    """One question as the encoder reads it: its text and options, or (span) its [E] labels only."""

    text: str
    options: tuple[tuple[str, str], ...]
    abstain: bool = False
    span: bool = False


@dataclass(frozen=True)
class SequenceReadout:
    """Where a sequence is read (positions in it): each question's [Q], pool [start, end) and [O] / [ABS]
    markers, and the span question's [E] labels and word starts. As row labels: (questions,
    *(query, pool start, pool end, markers, *markers) per question, labels, *labels, words, *words)."""

    questions: tuple[tuple[int, int, int, tuple[int, ...]], ...]
    labels: tuple[int, ...] = ()
    words: tuple[int, ...] = ()

    def to_labels(self) -> tuple[int, ...]:
        out = [len(self.questions)]
        for query, start, end, markers in self.questions:
            out += [query, start, end, len(markers), *markers]
        return (*out, len(self.labels), *self.labels, len(self.words), *self.words)

    @classmethod
    def from_labels(cls, labels: tuple[int, ...]) -> SequenceReadout:
        values = iter(labels)

        def take(n: int) -> tuple[int, ...]:
            return tuple(next(values) for _ in range(n))

        questions = []
        for _ in range(next(values)):
            query, start, end, count = take(4)
            questions.append((query, start, end, take(count)))
        marked = take(next(values))
        return cls(tuple(questions), marked, take(next(values)))


class MarkerSequenceBuilder(PromptBuilder):
    """The readout's sequence builder (it stands where the prompt builder stands for decoder recipes)."""

    def __init__(self, tokenizer, recipe, identity: str, config: dict):
        super().__init__(tokenizer, recipe, identity)
        self.text = tokenizer.backend_tokenizer  # the package tokenizer without its marker tokens
        self.markers = {name: int(config["marker_ids"][name]) for name in MARKERS}
        self.bos, self.eos = int(config["bos_token_id"]), int(config["eos_token_id"])
        self.max_length = int(config["max_length"])

    def ids(self, text: str) -> list[int]:
        return self.text.encode(text, add_special_tokens=False).ids

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        encoding = self.text.encode(text, add_special_tokens=False)
        return encoding.ids, [tuple(o) for o in encoding.offsets]

    def sequence(
        self, rows: list[MarkerRow], parts: list[tuple[str, list[int], tuple[int, ...]]]
    ) -> tuple[list[int], SequenceReadout]:
        """One row's sequence over the tokenised parts (role, ids, first token of each word); its readout
        lists the option questions in `rows` order, then the span question."""
        m = self.markers
        ids, questions = [self.bos], []
        for row in rows:
            if row.span:
                continue
            query = len(ids)
            ids += [m["[Q]"], *self.ids(row.text)]
            markers = []
            for name, description in row.options:
                markers.append(len(ids))
                ids += [m["[O]"], *self.ids(option_text(name, description))]
            if row.abstain:
                markers.append(len(ids))
                ids.append(m["[ABS]"])
            questions.append((query, tuple(markers)))
        span = next((row for row in rows if row.span), None)
        labels = []
        for name, description in span.options if span is not None else ():
            labels.append(len(ids))
            ids += [m["[E]"], *self.ids(option_text(name, description))]
        ids.append(m["[SEP_SCHEMA]"])
        pool_start, words = len(ids), ()
        for role, part, firsts in parts:
            if span is not None and role == SPAN_ROLE:
                words = tuple(len(ids) + 1 + first for first in firsts)
            ids += [m[f"[SEG_{role}]"], *part]
        pool = (pool_start, len(ids))
        ids.append(self.eos)
        readout = SequenceReadout(tuple((query, *pool, markers) for query, markers in questions), tuple(labels), words)
        return ids, readout

    def prepare(self, state_text: str, rows: list[MarkerRow], image_keys=(), plan=None) -> PreparedRequest:
        spans = [i for i, row in enumerate(rows) if row.span]
        parts = []  # each part tokenised once; its words only where a span question reads it
        for role, text in state_parts(plan.state if plan is not None else state_text):
            ids, offsets = self.encode_offsets(text)
            parts.append((role, ids, words_of(text, offsets).first if spans and role == SPAN_ROLE else ()))
        groups = [[i for i, row in enumerate(rows) if not row.span] + spans[:1]] + [[i] for i in spans[1:]]
        sequences, labels, order = [], [], []
        for group in filter(None, groups):
            ids, readout = self.sequence([rows[i] for i in group], parts)
            if len(ids) > self.max_length:
                raise UnreadableInput(
                    f"the questions and the state need {len(ids)} tokens in one sequence; this "
                    f"model reads at most {self.max_length} (cutting or windowing the state is not "
                    "served here)"
                )
            sequences.append(tuple(ids))
            labels.append(readout.to_labels())
            order += group  # the head answers a sequence's questions in group order (the span last)
        if plan is not None:  # each question's logits arrive where its sequence's head puts them
            at = {row: index for index, row in enumerate(order)}
            plan = dataclasses.replace(
                plan, questions=tuple(dataclasses.replace(q, first_row=at[q.first_row]) for q in plan.questions)
            )
        return PreparedRequest(
            prefix_ids=(),
            rows=tuple(sequences),
            row_labels=tuple(labels),
            image_keys=(),
            prefix_key=ids_key(f"{self.identity}|vela-marker|", (i for ids in sequences for i in ids)),
            plan=plan,
        )
