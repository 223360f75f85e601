"""The one typed schema of the /v1/systemone API, used by every service and test.

Two request forms share the route, told apart by shape (`is_envelope`):
- the System One envelope (TypeSafe's public API, what typesafe-sdk and jevcompat speak):
  `{"model", "state", "questions": {id: question}}` -> `{"model", "answers": {id: answer}, "usage"}`;
- the older single-question form of the flagship's worker contract: `{"kind", "state", "question", "options"}`.
  Its `state` is text, `{text, image}`, or the flagship contract's own forms (a list of text and image parts, a JSON
  object); which forms and kinds a served model answers is its family's (jev_worker.request.legacy).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, RootModel, Tag, field_validator, model_validator
from pydantic.config import JsonDict

Kind = Literal["choice", "noul", "score", "span", "set"]
KINDS: tuple[str, ...] = ("choice", "noul", "score", "span", "set")

MAX_OPTIONS = 255  # options of a choice, candidates of a span, options of the single-question form
MAX_TEXT_CHARS = 64_000
MAX_OPTION_CHARS = 2_000
PROBABILITY_SUM_TOLERANCE = 1e-3
DATA_URI_RE = re.compile(r"^data:image/(png|jpeg|jpg|webp|gif);base64,[A-Za-z0-9+/=\s]+$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class State(_Strict):
    """What the question is about: text, an image (as a base64 data URI), or both."""

    text: str | None = Field(default=None, max_length=MAX_TEXT_CHARS)
    image: str | None = Field(default=None, description="data:image/png;base64,... (exact URI is the asset key)")

    @field_validator("image")
    @classmethod
    def _image_is_data_uri(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("data:image/"):
            raise ValueError("state.image must be a base64 data URI (data:image/png;base64,...); URLs are not fetched")
        return value

    @model_validator(mode="after")
    def _not_empty(self) -> State:
        if not (self.text and self.text.strip()) and self.image is None:
            raise ValueError("state needs non-empty text or an image")
        return self


STATE_KEYS = frozenset({"text", "image"})


def _state_form(value: object) -> str:
    """Which state form a single-question `state` is: `{text, image}` (a string is its text), a list of
    parts, or any other JSON object."""
    if isinstance(value, dict):
        return "state" if set(value) <= STATE_KEYS else "object"
    return "parts" if isinstance(value, list) else "state"


StateForm = Annotated[
    Annotated[State, Tag("state")] | Annotated[list[Any], Tag("parts")] | Annotated[dict[str, Any], Tag("object")],
    Discriminator(_state_form),
]
NEEDS_OPTIONS = ("choice", "span", "set")  # the kinds whose options are the question


def _state_form_json_schema(schema: dict[str, Any]) -> None:
    """The JSON Schema of a single-question `state` as it is read: a string too (its text), and any of the forms
    (`{text, image}` is also a JSON object, so the generated oneOf would refuse it)."""
    schema["anyOf"] = [{"type": "string"}, *schema.pop("oneOf", schema.pop("anyOf", []))]


class DecisionRequest(_Strict):
    kind: Kind
    model: str | None = Field(
        default=None,
        description="accepted as upstream examples send it; the worker serves its own recipe whatever it names",
    )
    state: StateForm = Field(
        description="text, {text, image}, or the flagship contract's forms: a list of text and image "
        'parts ({"image": data URI}) in prompt order, or a JSON object',
        json_schema_extra=_state_form_json_schema,
    )
    question: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    options: list[str] | None = Field(
        default=None,
        min_length=2,
        max_length=MAX_OPTIONS,
        description="required for choice, span and set; a family may ask noul "
        "and score without them (the flagship contract)",
    )
    request_id: str | None = Field(default=None, max_length=200)
    deadline_s: float | None = Field(default=None, gt=0, le=600)

    @field_validator("state", mode="before")
    @classmethod
    def _text_shorthand(cls, value: object) -> object:
        if isinstance(value, str):
            return {"text": value}
        return _shallow(value, "state") if isinstance(value, (list, dict)) else value

    @field_validator("question")
    @classmethod
    def _question_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("question must not be blank")
        return value

    @field_validator("options")
    @classmethod
    def _options_valid(cls, options: list[str] | None) -> list[str] | None:
        for i, option in enumerate(options or ()):
            if not option.strip():
                raise ValueError(f"option {i} is empty")
            if len(option) > MAX_OPTION_CHARS:
                raise ValueError(f"option {i} is longer than {MAX_OPTION_CHARS} characters")
        if options is not None and len(set(options)) != len(options):
            raise ValueError("options must be unique")
        return options

    @model_validator(mode="after")
    def _kind_specific(self) -> DecisionRequest:
        if self.options is None:
            if self.kind in NEEDS_OPTIONS:
                raise ValueError(f"kind {self.kind!r} needs options (2 to {MAX_OPTIONS})")
            return self
        if self.kind == "score":
            for option in self.options:
                try:
                    number = float(option)
                except ValueError:
                    raise ValueError(f"kind 'score' needs numeric options, got {option!r}") from None
                if not math.isfinite(number):
                    raise ValueError(f"kind 'score' needs finite numeric options, got {option!r}")
        if self.kind == "span":
            text = (self.state.text or "") if isinstance(self.state, State) else ""
            missing = [o for o in self.options if o not in text]
            if missing:
                raise ValueError(f"kind 'span' options must be substrings of state.text; not found: {missing[:3]!r}")
        return self

    def route_state(self) -> tuple[str, list[str]]:
        """What the route key hashes (jev_common.route_key): the state's text and its image data URIs, in
        order (`{text, image}`: the text as sent; a list or object: its JSON text and the parts' images)."""
        if isinstance(self.state, State):
            return self.state.text or "", [self.state.image] if self.state.image else []
        from .state_text import render_state

        return render_state(self.state), [
            url
            for url in map(image_part_url, self.state if isinstance(self.state, list) else [])
            if isinstance(url, str)
        ]


def image_part_url(part: object) -> object:
    """The image of a state part in the flagship contract's list form (`{"image": url}` or an OpenAI-style
    `{"type": "image_url", "image_url": {"url": url}}`; `image` wins when both), else None."""
    if not isinstance(part, dict):
        return None
    if "image" in part:
        return part["image"]
    if part.get("type") == "image_url":
        inner = part.get("image_url")
        return inner.get("url") if isinstance(inner, dict) else None
    return None


class Usage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)


class Span(BaseModel):
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    text: str


class DecisionResponse(BaseModel):
    """probabilities[i] belongs to options[i] (as the served family fills them: jev_worker.request.legacy; the
    flagship family's noul is over [false, true] and its score over 0..5, without `noul`, recipes/jev-27b-vl/README.md).

    kind noul: `noul` is P(none of these); probabilities + noul sum to 1, and when none wins
    choice_index and choice are null. kind set: `yes_probabilities` are independent P(yes) per
    option, `probabilities` is that yes-mass normalised over the options, `selected` the options
    with P(yes) >= 0.5. kind score: `score` is the expected value of the numeric options.
    kind span: `span` locates the chosen option in state.text.
    """

    request_id: str | None = None
    kind: Kind
    model: str
    probabilities: list[float]
    choice_index: int | None
    choice: str | None
    noul: float | None = None
    score: float | None = None
    span: Span | None = None
    yes_probabilities: list[float] | None = None
    selected: list[int] | None = None
    usage: Usage
    elapsed_seconds: float = Field(ge=0)

    @model_validator(mode="after")
    def _probabilities_valid(self) -> DecisionResponse:
        values = list(self.probabilities) + ([self.noul] if self.noul is not None else [])
        values += list(self.yes_probabilities or [])
        if not all(math.isfinite(p) and -1e-6 <= p <= 1 + 1e-6 for p in values):
            raise ValueError("probabilities must be finite and within [0, 1]")
        total = sum(self.probabilities) + (self.noul or 0.0)
        if abs(total - 1.0) > PROBABILITY_SUM_TOLERANCE:
            raise ValueError(f"probabilities sum to {total}, not 1")
        return self


def summarize_details(details: list[dict[str, Any]], limit: int | None = 5) -> str:
    """Validation errors on one line, 'questions.q.criteria: too short; ...' (the first `limit`)."""
    return "; ".join(f"{'.'.join(str(p) for p in d['loc'][1:]) or 'body'}: {d['msg']}" for d in details[:limit])


class ErrorDetail(BaseModel):
    error_type: str
    message: str


class ValidationItem(BaseModel):
    loc: list[str | int]
    msg: str
    type: str


class ErrorEnvelope(BaseModel):
    """The API's error bodies: `{"detail": {"error_type", "message"}}`, or for validation failures
    (422) `{"detail": [{"loc": ["body", ...], "msg", "type"}]}`."""

    detail: ErrorDetail | list[ValidationItem]

    @property
    def type(self) -> str:
        return "validation_error" if isinstance(self.detail, list) else self.detail.error_type

    @property
    def message(self) -> str:
        if isinstance(self.detail, list):
            return summarize_details([item.model_dump() for item in self.detail], limit=None)
        return self.detail.message


class HealthResponse(BaseModel):
    status: Literal["ok", "loading", "degraded", "unavailable", "stopping", "stalled"]
    detail: dict[str, Any] = Field(default_factory=dict)


class CacheLevelStats(BaseModel):
    enabled: bool
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    resident_bytes: int = 0
    resident_entries: int = 0
    budget: int = 0


class CacheStats(BaseModel):
    enabled: bool
    levels: dict[str, CacheLevelStats]
    prefix_reuse: str | None = None  # the worker's backend: whether rows reuse the state prefix, or why not


# ===== the System One envelope ===================================================================

Content = str | dict[str, Any] | list[Any]  # text, or a JSON object or array rendered as JSON text
MAX_SCORE_LEVELS = 10
MAX_QUESTIONS = 128
MAX_CONTENT_DEPTH = 32
MAX_NAME_CHARS = 2_000
# Text in one request (state, instructions, criteria), in characters: sized from the largest context a served
# family reads (262,144 tokens, Qwen3.5's) at 8 characters a token. Each worker refuses far less by its own
# model's limit (jev_worker.prompt.bounds); this cap keeps megabytes from being parsed, rendered or tokenised anywhere.
MAX_CONTENT_CHARS = 2_097_152
LATEST_ALIAS = "jev-latest"


def content_depth(value: object) -> int:
    """Nesting depth of a JSON value, without recursion (a hostile body cannot blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_CONTENT_DEPTH:
            return depth
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def content_chars(value: object, stop_at: int = MAX_CONTENT_CHARS) -> int:
    """Characters of every string (keys included) in a JSON value, without recursion; counting stops past
    `stop_at`."""
    total, stack = 0, [value]
    while stack and total <= stop_at:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item)
        elif isinstance(item, dict):
            total += sum(len(k) for k in item if isinstance(k, str))
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _shallow(value: object, where: str) -> object:
    if content_depth(value) > MAX_CONTENT_DEPTH:
        raise ValueError(f"{where} is nested deeper than {MAX_CONTENT_DEPTH} levels")
    if content_chars(value) > MAX_CONTENT_CHARS:
        raise ValueError(f"{where} is longer than {MAX_CONTENT_CHARS:,} characters, past what any served model reads")
    return value


class _Question(BaseModel):
    model_config = ConfigDict(extra="forbid")

    @field_validator("instructions", mode="after", check_fields=False)
    @classmethod
    def _instructions_shallow(cls, value: object) -> object:
        return _shallow(value, "instructions")


class NoulCriteria(BaseModel):
    model_config = ConfigDict(extra="forbid")
    true: Content | None = None
    false: Content | None = None


_GIVEN: JsonDict = {"type": ["string", "object", "array"]}  # a Content that is there (not null)
NAMES_SCHEMA: JsonDict = {
    "propertyNames": {"minLength": 1, "maxLength": MAX_NAME_CHARS}
}  # what _names_valid checks of keys


# what NoulQuestion._asks_something checks, in the JSON schema too (so the description says it)
_NOUL_ASKS_SOMETHING: JsonDict = {
    "anyOf": [
        {"required": ["instructions"], "properties": {"instructions": _GIVEN}},
        {
            "required": ["criteria"],
            "properties": {
                "criteria": {
                    "anyOf": [{"required": [side], "properties": {side: _GIVEN}} for side in ("true", "false")]
                }
            },
        },
    ]
}


class NoulQuestion(_Question):
    """A yes/no question; its answer is P(yes)."""

    model_config = ConfigDict(json_schema_extra=_NOUL_ASKS_SOMETHING)
    type: Literal["noul"]
    instructions: Content | None = None
    criteria: NoulCriteria | None = None

    @model_validator(mode="after")
    def _asks_something(self) -> NoulQuestion:
        described = self.criteria is not None and (self.criteria.true is not None or self.criteria.false is not None)
        if self.instructions is None and not described:
            raise ValueError("a noul question needs instructions or a described outcome (criteria.true/false)")
        if self.criteria is not None:
            _shallow(self.criteria.true, "criteria.true")
            _shallow(self.criteria.false, "criteria.false")
        return self


def _names_valid(names: Iterable[str]) -> None:
    for name in names:
        if not name:
            raise ValueError("option names must be non-empty strings")
        if len(name) > MAX_NAME_CHARS:
            raise ValueError(f"option names must be at most {MAX_NAME_CHARS} characters")


def _described_options(criteria: dict[str, Any]) -> dict[str, Any]:
    """Option names valid, and no description nested deeper than content may be."""
    _names_valid(criteria)
    for name, description in criteria.items():
        _shallow(description, f"criteria[{name!r}]")
    return criteria


class ChoiceQuestion(_Question):
    """One of the named options; `criteria` maps each name to its description (or null)."""

    type: Literal["choice"]
    instructions: Content | None = None
    # one option is valid API (some families' upstreams answer it: {"only": 1.0}); a family that needs two says
    # so with a 422 (its question type's `min_options`, jev_worker.questions.plan)
    criteria: dict[str, Content | None] = Field(min_length=1, max_length=MAX_OPTIONS, json_schema_extra=NAMES_SCHEMA)

    @field_validator("criteria")
    @classmethod
    def _options_valid(cls, criteria: dict[str, Any]) -> dict[str, Any]:
        return _described_options(criteria)


class ScoreQuestion(_Question):
    """An ordered rubric: level i is described by criteria[i]; the answer's score is sum(i * p_i)."""

    type: Literal["score"]
    instructions: Content | None = None
    criteria: list[Content] = Field(min_length=2, max_length=MAX_SCORE_LEVELS)

    @field_validator("criteria")
    @classmethod
    def _levels_shallow(cls, criteria: list[Any]) -> list[Any]:
        for i, level in enumerate(criteria):
            _shallow(level, f"criteria[{i}]")
        return criteria


class SpanQuestion(_Question):
    """Extension: which candidate substring of the (text) state answers the question."""

    type: Literal["span"]
    instructions: Content | None = None
    criteria: list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]] = Field(
        min_length=2, max_length=MAX_OPTIONS
    )

    @field_validator("criteria")
    @classmethod
    def _candidates_valid(cls, criteria: list[str]) -> list[str]:
        _names_valid(criteria)
        if len(set(criteria)) != len(criteria):
            raise ValueError("span candidates must be unique")
        return criteria


class SetQuestion(_Question):
    """Extension: each named statement judged true or false on its own row."""

    type: Literal["set"]
    instructions: Content | None = None
    criteria: dict[str, Content | None] = Field(min_length=1, max_length=64, json_schema_extra=NAMES_SCHEMA)

    @field_validator("criteria")
    @classmethod
    def _options_valid(cls, criteria: dict[str, Any]) -> dict[str, Any]:
        return _described_options(criteria)


Question = Annotated[
    NoulQuestion | ChoiceQuestion | ScoreQuestion | SpanQuestion | SetQuestion, Field(discriminator="type")
]
QUESTION_TYPES: tuple[str, ...] = ("noul", "choice", "score", "span", "set")


class AssetRef(BaseModel):
    """An image named in the state by its placeholder: a multipart `part`, or inline base64."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["image"] = "image"
    format: Literal["png", "jpg", "jpeg"] | None = None
    data_base64: str | None = None
    part: str | None = None

    @model_validator(mode="after")
    def _has_data(self) -> AssetRef:
        if self.part is None and self.data_base64 is None:
            raise ValueError("an asset needs `part` (multipart) or `data_base64`")
        return self


SIDE_MEDIA = ("images", "videos")  # other APIs' media beside the state (a family's record format, vLLM-SR's request)


class SystemOneRequest(BaseModel):
    """`{"model", "state", "questions": {id: question}}`; unknown top-level fields are ignored, except media
    sent beside the state (`images`, `videos`): ignoring them would answer without them, so they are refused."""

    model_config = ConfigDict(extra="ignore")
    model: str
    state: Content
    questions: dict[Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)], Question] = Field(
        min_length=1, max_length=MAX_QUESTIONS
    )
    assets: dict[Annotated[str, Field(min_length=1)], AssetRef] | None = Field(default=None, min_length=1)
    # extension (x_: the SDK and other servers ignore it): answers that do not depend on option order.
    # `cyclic`: each choice answered from the cyclic shifts of its options (all of them up to 8 options, else 8
    # evenly spaced shifts), each option's probability averaged over the shifts, and each score from its levels
    # listed in both orders; `prior`: each choice single pass, debiased by the model's position prior (PriDe)
    # estimated on a fixed calibration set (README, "Coherence").
    x_coherence: Literal["off", "cyclic", "prior"] = "off"

    @model_validator(mode="before")
    @classmethod
    def _bounded_text(cls, data: object) -> object:
        """The whole request's text within MAX_CONTENT_CHARS, checked before any field is parsed (each field's
        own check names it; this one catches many fields that are each under the cap)."""
        if isinstance(data, dict):
            parts = [("state", data.get("state"))]
            questions = data.get("questions")
            if isinstance(questions, dict):
                parts += [
                    (f"questions[{qid[:100]!r}].{field}", value)
                    for qid, q in questions.items()
                    for field, value in (q.items() if isinstance(q, dict) else [("", q)])
                ]
            for where, value in parts:
                if content_chars(value) > MAX_CONTENT_CHARS:
                    raise ValueError(
                        f"{where} is longer than {MAX_CONTENT_CHARS:,} characters, past what any served model reads"
                    )
            if content_chars([data.get("state"), questions]) > MAX_CONTENT_CHARS:
                raise ValueError(
                    f"the request's text is longer than {MAX_CONTENT_CHARS:,} characters, past what "
                    "any served model reads"
                )
        return data

    @model_validator(mode="before")
    @classmethod
    def _no_side_media(cls, data: object) -> object:
        for key in SIDE_MEDIA if isinstance(data, dict) else ():
            if key in data:  # type: ignore[operator]  # a dict: the loop runs only then
                raise ValueError(
                    f"top-level `{key}` is not read by this API (it would be answered without them): "
                    'send each image as an `assets` entry, e.g. {"<image:1>": {"type": "image", '
                    '"data_base64": "..."}}, and put its reference where it belongs in the state'
                )
        return data

    @field_validator("state")
    @classmethod
    def _state_shallow(cls, value: object) -> object:
        return _shallow(value, "state")

    @model_validator(mode="after")
    def _spans_in_state(self) -> SystemOneRequest:
        for qid, question in self.questions.items():
            if isinstance(question, SpanQuestion):
                if not isinstance(self.state, str):
                    raise ValueError(f"question {qid!r}: span questions need a text state")
                missing = [c for c in question.criteria if c not in self.state]
                if missing:
                    raise ValueError(
                        f"question {qid!r}: span candidates must occur in the state; not found: {missing[:3]!r}"
                    )
        return self


def is_envelope(payload: object) -> bool:
    """The single-question form is told apart by its `kind` field; everything else is the envelope."""
    return not (isinstance(payload, dict) and "kind" in payload and "questions" not in payload)


class NoulAnswer(BaseModel):
    type: Literal["noul"] = "noul"
    noul: float = Field(ge=0, le=1)


class ChoiceAnswer(BaseModel):
    type: Literal["choice"] = "choice"
    choice: str
    probabilities: dict[str, float]
    confidence: float = Field(ge=0, le=1)


class ScoreAnswer(BaseModel):
    type: Literal["score"] = "score"
    score: float
    legend: dict[str, Content]
    probabilities: dict[str, float]
    confidence: float = Field(ge=0, le=1)


class SpanAnswer(BaseModel):
    type: Literal["span"] = "span"
    span: Span
    probabilities: dict[str, float]
    confidence: float = Field(ge=0, le=1)


class SetAnswer(BaseModel):
    """probabilities[name] is that statement's own P(true); selected are those >= 0.5."""

    type: Literal["set"] = "set"
    selected: list[str]
    probabilities: dict[str, float]


Answer = NoulAnswer | ChoiceAnswer | ScoreAnswer | SpanAnswer | SetAnswer


class SystemOneUsage(BaseModel):
    input_tokens: int = Field(ge=0)
    output_tokens: int = Field(ge=0)


class SystemOneResponse(BaseModel):
    """Extra fields are prefixed `x_` as the API asks of extensions."""

    model: str
    answers: dict[str, Answer]
    usage: SystemOneUsage
    x_cached_input_tokens: int = Field(default=0, ge=0)
    x_elapsed_seconds: float = Field(default=0.0, ge=0)


COHERENCE_MODES = ("off", "cyclic", "prior")  # SystemOneRequest.x_coherence


class CoherenceEntry(BaseModel):
    """How one question type of a model answers the x_coherence modes (GET /v1/models)."""

    modes: list[str]  # the modes it lays out and reads its own way (under another mode the model offers: as off)
    position_free: bool = False  # its head scores each option apart from where it is listed: every mode, unchanged
    note: str | None = None  # why, where the family's layout is the reason


class ModelInfo(BaseModel):
    name: str
    description: str
    release_date: str
    # what answers this model's decisions, so that a changed answer can be traced (extensions, x_: the SDK ignores
    # them): the checkpoint's identity (its pinned revision, or a digest of a local folder) and the code version
    x_revision: str | None = None
    x_code_version: str | None = None
    # what the state may hold: "vision-language" models read images (`assets`), "text" ones do not
    x_modality: Literal["text", "vision-language"] | None = None
    x_coherence: list[str] | None = None  # the request's x_coherence modes this model accepts
    x_coherence_types: dict[str, CoherenceEntry] | None = None  # per question type with an option order
    x_readout: str | None = None  # how the answers are read from the model: the served readout's name


class ModelList(BaseModel):
    models: list[ModelInfo]


def choice_answer(names: list[str], probabilities: list[float]) -> ChoiceAnswer:
    """A choice answer from the options' probabilities in request order (ties: the earliest option)."""
    best = max(range(len(probabilities)), key=probabilities.__getitem__)
    return ChoiceAnswer(
        choice=names[best], probabilities=dict(zip(names, probabilities)), confidence=choice_confidence(probabilities)
    )


def score_answer(levels: list[Any], probabilities: list[float]) -> ScoreAnswer:
    """A score answer from the levels' probabilities: score = sum(i * p_i), the legend the levels."""
    return ScoreAnswer(
        score=sum(i * p for i, p in enumerate(probabilities)),
        legend={str(i): level for i, level in enumerate(levels)},
        probabilities={str(i): p for i, p in enumerate(probabilities)},
        confidence=score_confidence(probabilities),
    )


def choice_confidence(probabilities: list[float]) -> float:
    """The reference formula: (p_max - 1/n) / (1 - 1/n), 0 for a uniform answer, 1 for a certain one."""
    n = len(probabilities)
    if n <= 1:
        return 1.0
    return min(1.0, max(0.0, (max(probabilities) - 1 / n) / (1 - 1 / n)))


def score_confidence(probabilities: list[float]) -> float:
    """The reference formula: 1 - E|level - mode| / (the same spread under a uniform answer)."""
    n = len(probabilities)
    if n <= 1:
        return 1.0
    mode = max(range(n), key=probabilities.__getitem__)
    spread = sum(p * abs(i - mode) for i, p in enumerate(probabilities))
    uniform = sum(abs(i - (n - 1) / 2) for i in range(n)) / n
    return min(1.0, max(0.0, 1 - spread / uniform))


# ===== POST /v1/preencode (the preencoder, behind the frontend) ====================================


class PreencodeLine(BaseModel):
    """One image to prepare: `{"image": data URI}`, a single-question request with `state.image`, or a System One
    request with one inline asset (jev_preencoder.encode.manifest_image)."""

    model_config = ConfigDict(extra="allow")
    image: str | None = Field(default=None, description="data:image/png;base64,...")


class PreencodeLines(BaseModel):
    model_config = ConfigDict(extra="allow")
    lines: list[PreencodeLine | str]


class PreencodeManifest(RootModel[list[PreencodeLine | str] | PreencodeLines | PreencodeLine]):
    """A JSON array of lines, `{lines: [...]}` or one line (JSON Lines: application/x-ndjson)."""


class PreencodeResult(BaseModel):
    """One line's outcome, as the preencoder makes it (jev_preencoder.encode) and answers it."""

    line: int
    status: Literal["done", "skipped", "failed"]
    key: str | None = None
    reason: str | None = None
    message: str | None = None
    grid: list[int] | None = None
    n_tokens: int | None = None
    redone: bool = False
    indexed: bool | None = None

    def answered(self) -> dict[str, Any]:
        """As the preencoder answers it: unset fields left out, `redone` only when true."""
        return self.model_dump(exclude_none=True, exclude=set() if self.redone else {"redone"})


class PreencodeSummary(BaseModel):
    done: int = Field(ge=0)
    skipped: int = Field(ge=0)
    failed: int = Field(ge=0)
    redone: int = Field(ge=0)
    index_errors: int = Field(ge=0)
    seconds: float = Field(ge=0)


class PreencodeResponse(BaseModel):
    results: list[PreencodeResult]
    summary: PreencodeSummary
    identity: str
