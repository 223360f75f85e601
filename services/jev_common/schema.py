"""The one typed schema of the /v1/systemone API, used by every service and test."""
from __future__ import annotations

import math
import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Kind = Literal["choice", "noul", "score", "span", "set"]
KINDS: tuple[str, ...] = ("choice", "noul", "score", "span", "set")

MAX_OPTIONS = 26  # one letter label each
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
    def _not_empty(self) -> "State":
        if not (self.text and self.text.strip()) and self.image is None:
            raise ValueError("state needs non-empty text or an image")
        return self


class DecisionRequest(_Strict):
    kind: Kind
    state: State
    question: str = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    options: list[str] = Field(min_length=2, max_length=MAX_OPTIONS)
    request_id: str | None = Field(default=None, max_length=200)
    deadline_s: float | None = Field(default=None, gt=0, le=600)

    @field_validator("state", mode="before")
    @classmethod
    def _text_shorthand(cls, value):
        return {"text": value} if isinstance(value, str) else value

    @field_validator("question")
    @classmethod
    def _question_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("question must not be blank")
        return value

    @field_validator("options")
    @classmethod
    def _options_valid(cls, options: list[str]) -> list[str]:
        for i, option in enumerate(options):
            if not option.strip():
                raise ValueError(f"option {i} is empty")
            if len(option) > MAX_OPTION_CHARS:
                raise ValueError(f"option {i} is longer than {MAX_OPTION_CHARS} characters")
        if len(set(options)) != len(options):
            raise ValueError("options must be unique")
        return options

    @model_validator(mode="after")
    def _kind_specific(self) -> "DecisionRequest":
        if self.kind == "score":
            for option in self.options:
                try:
                    number = float(option)
                except ValueError:
                    raise ValueError(f"kind 'score' needs numeric options, got {option!r}") from None
                if not math.isfinite(number):
                    raise ValueError(f"kind 'score' needs finite numeric options, got {option!r}")
        if self.kind == "span":
            text = self.state.text or ""
            missing = [o for o in self.options if o not in text]
            if missing:
                raise ValueError(f"kind 'span' options must be substrings of state.text; not found: {missing[:3]!r}")
        return self


class Usage(BaseModel):
    prompt_tokens: int = Field(ge=0)
    cached_tokens: int = Field(ge=0)


class Span(BaseModel):
    start: int = Field(ge=0)
    end: int = Field(ge=0)
    text: str


class DecisionResponse(BaseModel):
    """probabilities[i] belongs to options[i].

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
    def _probabilities_valid(self) -> "DecisionResponse":
        values = list(self.probabilities) + ([self.noul] if self.noul is not None else [])
        values += list(self.yes_probabilities or [])
        if not all(math.isfinite(p) and -1e-6 <= p <= 1 + 1e-6 for p in values):
            raise ValueError("probabilities must be finite and within [0, 1]")
        total = sum(self.probabilities) + (self.noul or 0.0)
        if abs(total - 1.0) > PROBABILITY_SUM_TOLERANCE:
            raise ValueError(f"probabilities sum to {total}, not 1")
        return self


class ErrorBody(BaseModel):
    type: str
    message: str


class ErrorEnvelope(BaseModel):
    """The one error shape every service returns: {"error": {"type", "message"}}."""

    error: ErrorBody


class HealthResponse(BaseModel):
    status: Literal["ok", "loading", "degraded", "unavailable"]
    detail: dict = Field(default_factory=dict)


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
