"""jev-vl: JEV-27B-VL's System 1 as upstream serves it (contract.py), on the causal-lm backend.

Probabilities, as `s1_pass` computes them: `softmax((logit + bias) / T_kind)` over the kind's tokens, the
logits from the merged FP32 label rows (head.py); noul reads `verbalizer_ids[0:2]` with `bias[0:2]`
(false, true), score `verbalizer_ids[2:8]` with `bias[2:8]` (0..5), choice the first n option labels with
the slot biases `bias[8:24]` on the first 16 and 0.0 past them; T from `calibration.json["per_kind"]`.

Upstream answers one question per request (`/v1/decide`: `kind`, `state`, `question`, `options`): that is
this family's single-question form (`JevVlForm`). The System One envelope is our mapping (recipe README):
- noul -> kind noul, the instructions as the question; P(yes) = P(true). Outcome descriptions
  (criteria.true/false) have no place in the prompt: 422.
- choice -> kind choice, each option shown by its description, or its name when it has none.
- score -> kind score only with exactly 6 levels (the prompt's 0..5; the level texts are not shown):
  other level counts are 422; score = sum(i * p_i) as for every family.
Instructions are the question (text as sent, objects and arrays as JSON); null instructions are an empty
question, as an upstream request may send. span and set are not upstream's kinds: 422.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable

from jev_common.checkpoint_files import ServingError
from jev_common.errors import UnsupportedQuestionType, validation_error
from jev_common.recipe import PromptSpec, VerbalizerSpec
from jev_common.schema import (
    ChoiceAnswer,
    ChoiceQuestion,
    DecisionRequest,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    State,
    choice_answer,
    score_answer,
)
from jev_common.state_text import render_state

from ...loading.checkpoint import Requirement
from ...protocols import QuestionKind, SingleQuestionForm
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout
from ...request.job import ImageSlot, Job
from ...request.legacy import QID
from .contract import (
    HEAD_CONFIG,
    MAX_LENGTH,
    NOUL_OPTIONS,
    SCORE_OPTIONS,
    BadPart,
    DecisionFiles,
    choice_lines,
    state_parts,
    tail_text,
)
from .head import LabelHead
from .layout import JevRow, JevVlBuilder


def softmax(values: list[float]) -> list[float]:
    """serve_decide.py's `_softmax`, in FP64."""
    top = max(values)
    exps = [math.exp(v - top) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


class _JevKind(QuestionKind):
    """One upstream kind: its option lines, the tokens read and their slot biases."""

    def __init__(self, readout: JevVlReadout):
        self.readout = readout

    def lines(self, question, ctx: BuildContext, where: str) -> tuple[list[str], tuple[int, ...]]:
        files = self.readout.files
        lo, hi = files.slots(self.type)
        options = NOUL_OPTIONS if self.type == "noul" else SCORE_OPTIONS
        return list(options), files.verbalizer_ids[lo:hi]

    def bias(self, n: int) -> list[float]:
        lo, hi = self.readout.files.slots(self.type)
        return list(self.readout.files.bias[lo:hi])

    def rows(self, question, ctx: BuildContext, where: str) -> list[JevRow]:
        asked = "" if question.instructions is None else ctx.user_text(question.instructions, f"{where}.instructions")
        lines, ids = self.lines(question, ctx, where)
        return [JevRow(self.type, tail_text(asked, lines), tuple(ids))]

    def probabilities(self, logits) -> list[float]:
        row = logits[0].tolist()
        temperature = self.readout.files.temperatures[self.type]
        return softmax([(logit + b) / temperature for logit, b in zip(row, self.bias(len(row)))])


class JevNoul(_JevKind):
    type = "noul"

    def lines(self, question: NoulQuestion, ctx: BuildContext, where: str):
        criteria = question.criteria
        if criteria is not None and (criteria.true is not None or criteria.false is not None):
            raise validation_error(
                f"{where}: JEV-VL's noul prompt lists only false and true; it has no place for "
                "criteria.true/false descriptions: say them in the instructions",
                ("questions",),
            )
        return super().lines(question, ctx, where)

    def answer(self, question, logits, ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=self.probabilities(logits)[1])  # [P(false), P(true)]


class JevScore(_JevKind):
    type = "score"

    def lines(self, question: ScoreQuestion, ctx: BuildContext, where: str):
        if len(question.criteria) != len(SCORE_OPTIONS):
            raise validation_error(
                f"{where}: JEV-VL scores on its trained levels 0-5 only: send exactly "
                f"{len(SCORE_OPTIONS)} levels (got {len(question.criteria)})",
                ("questions",),
            )
        return super().lines(question, ctx, where)

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        return score_answer(question.criteria, self.probabilities(logits))


class JevChoice(_JevKind):
    type = "choice"

    def lines(self, question: ChoiceQuestion, ctx: BuildContext, where: str):
        options = [name if description is None else description for name, description in ctx.criteria(question, where)]
        labels, ids = ctx.builder.coded(len(options))
        return choice_lines(options, labels), ids

    def bias(self, n: int) -> list[float]:
        return self.readout.files.choice_bias(n)

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        return choice_answer(list(question.criteria), self.probabilities(logits))


class JevVlForm(SingleQuestionForm):
    """Upstream's own request (`/v1/decide`'s body). noul: probabilities over [false, true]; score: over
    0..5 (`score` = sum(i * p_i) besides); choice: over the options. choice_index/choice are the argmax
    (the first on ties); `noul` is absent (the generic form's P(none of these)). `options` sent with noul or
    score are ignored, as upstream ignores them. The state: text, `{"image": ...}`, a list of parts (text,
    `{"image": data URI}`, `{"type": "image_url", "image_url": {"url": ...}}`, `{"type": "text", "text": ...}`,
    any other item as JSON) or a JSON object; `{text, image}` together is refused (its order is not
    upstream's to say: send the list form)."""

    def question(self, request: DecisionRequest):
        if request.kind == "noul":
            return NoulQuestion.model_construct(type="noul", instructions=request.question, criteria=None)
        if request.kind == "score":
            return ScoreQuestion.model_construct(
                type="score", instructions=request.question, criteria=list(SCORE_OPTIONS)
            )
        if request.kind == "choice":
            return ChoiceQuestion.model_construct(
                type="choice", instructions=request.question, criteria=dict.fromkeys(request.options)
            )
        raise UnsupportedQuestionType(f"kind {request.kind!r} is not one of JEV-VL's kinds (noul, score, choice)")

    def parts(self, state) -> list[tuple[str, object]]:
        if isinstance(state, State):
            if state.text and state.image is not None:
                raise validation_error(
                    "JEV-VL reads an image where the state places it: send the state as a list "
                    'of parts, e.g. ["text", {"image": "data:image/png;base64,..."}]',
                    ("state",),
                )
            return [("image", state.image)] if state.image is not None else [("text", state.text or "")]
        try:
            return state_parts(state)
        except BadPart as exc:
            raise validation_error(str(exc), ("state", exc.index)) from None

    def job(self, request: DecisionRequest, image_key: Callable[[str], str] | None) -> Job:
        question = self.question(request)
        parts = self.parts(request.state)
        pieces: list = []
        for kind, value in parts:
            if kind == "text":
                pieces.append(value)
            elif image_key is not None:  # else the pipeline refuses the image (a text-only model)
                if not (isinstance(value, str) and value.startswith("data:image/")):
                    raise validation_error(
                        "an image part must be a base64 image data URI "
                        "(data:image/png;base64,...); URLs are not fetched",
                        ("state",),
                    )
                pieces.append(ImageSlot(image_key(value)))
        keys = tuple(p.key for p in pieces if isinstance(p, ImageSlot))
        text, _ = request.route_state()
        shown = request.options if request.kind == "choice" else None  # upstream ignores noul/score options
        canonical = json.dumps(
            [request.kind, request.question, shown, [p if isinstance(p, str) else {"image": p.key} for p in pieces]],
            ensure_ascii=False,
        )
        return Job(
            questions={QID: question},
            state=request.state,
            pieces=tuple(pieces),
            where="state",
            route_text=text,
            route_images=keys,
            has_images=any(kind == "image" for kind, _ in parts),
            l1_key=hashlib.sha256(("jev-vl|" + canonical).encode("utf-8", "surrogatepass")).hexdigest(),
        )

    def fields(self, request: DecisionRequest, answer) -> dict:
        if request.kind == "noul":
            probabilities, options = [1.0 - answer.noul, answer.noul], list(NOUL_OPTIONS)
        else:
            probabilities = list(answer.probabilities.values())
            options = list(SCORE_OPTIONS) if request.kind == "score" else list(request.options)
        best = max(range(len(probabilities)), key=probabilities.__getitem__)
        out = {"probabilities": probabilities, "choice_index": best, "choice": options[best]}
        if request.kind == "score":
            out["score"] = answer.score
        return out


class JevVlReadout(StandardReadout):
    """On the causal-lm backend (the protocol's default), with the readout's own prompt layout."""

    name = "jev-vl"
    question_types = frozenset({"noul", "choice", "score"})
    needs_lm_head = True
    single_question_form = True
    files: DecisionFiles | None = None

    def known_options(self) -> dict:
        return {"max_length": MAX_LENGTH}  # the export's max_length: longer prompts are refused

    def requirements(self) -> list[Requirement]:
        return [Requirement(HEAD_CONFIG, ("verbalizer_ids", "bias", "slots"))]

    def prompt_builder(self, tokenizer, recipe, identity: str) -> JevVlBuilder:
        if recipe.prompt != PromptSpec() or recipe.verbalizer != VerbalizerSpec():
            raise ServingError(
                f"recipe {recipe.name}: family jev-vl serves upstream's own prompt and labels "
                "(families/jev_vl/); remove the recipe's prompt and verbalizer settings"
            )
        return JevVlBuilder(tokenizer, recipe, identity, max_length=int(self.option("max_length")))

    def load(self, loaded, builder: JevVlBuilder) -> None:
        files = DecisionFiles.read(loaded.folder)
        lo, hi = files.slots("choice")
        if builder.label_ids[: hi - lo] != list(files.verbalizer_ids[lo:hi]):
            raise ServingError(
                f"{HEAD_CONFIG}: the tokenizer's first option labels {builder.labels[: hi - lo]} are "
                f"not the trained choice head (verbalizer_ids[{lo}:{hi}]); wrong tokenizer?"
            )
        self.files = files
        self.head = LabelHead(loaded.model, loaded.folder, list(files.verbalizer_ids) + builder.label_ids)
        self.kinds = {kind.type: kind for kind in (JevNoul(self), JevScore(self), JevChoice(self))}

    def single_question(self, recipe) -> JevVlForm:
        return JevVlForm()

    def envelope_state(self, request) -> str:
        """The state as `_parts` writes it; an image part must name one of the request's assets (the envelope
        places an image by its reference)."""
        if not isinstance(request.state, list):
            return render_state(request.state)
        references = set(request.assets or {})
        try:
            parts = state_parts(request.state)
        except BadPart as exc:
            raise validation_error(str(exc), ("state", exc.index)) from None
        out = []
        for i, (kind, value) in enumerate(parts):
            if kind == "image" and value not in references:
                raise validation_error(
                    f"state[{i}] is an image part; in the System One envelope an image is an "
                    "asset: name it in `assets` and put its reference here",
                    ("state", i),
                )
            out.append(value)
        return "".join(out)

    def warmup_request(self, request):
        """The worker's warmup, its score asked on JEV-VL's six levels."""
        out = super().warmup_request(request)
        questions = {
            qid: ScoreQuestion(type="score", instructions=q.instructions, criteria=list(SCORE_OPTIONS))
            if q.type == "score"
            else q
            for qid, q in out.questions.items()
        }
        return out.model_copy(update={"questions": questions})

    def describe(self) -> dict:
        out = {"readout": self.name, "question_types": sorted(self.question_types), "calibration": None}
        if self.files is not None:
            out.update(
                calibration=self.files.describe(), head=self.head.source, max_length=int(self.option("max_length"))
            )
        return out
