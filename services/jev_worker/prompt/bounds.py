"""Bounds before compute: a prompt longer than the served model reads is refused (422 naming the limit and the
count) before any forward, and text far past that limit is refused before it is even tokenised.

The limit is the family's own cut where its prompt builder declares one (`max_length`, upstream's documented
limit), else the model's positions (`max_position_embeddings`, of the text model on vision-language checkpoints). Three
checks, cheapest first, so that a megabyte of state costs milliseconds:

1. characters: the state and the longest question against `limit x CHARS_PER_TOKEN` (no tokenizer here
   writes more characters than that into one token of ordinary text); skipped for a family that cuts its
   input to fit, as its upstream does (`PromptBuilder.cuts_state`; the schema's cap still holds);
2. the state's tokens, counted once (not once per row, as the prompt builder's one-pass rows do); skipped
   where the family refuses over-long prompts itself, in its upstream's words (its builder's `max_length`);
3. the prepared prompt's exact count: prefix + the longest row (the family's own, where it has a limit).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from jev_common.errors import PromptTooLong
from jev_common.schema import content_chars

CHARS_PER_TOKEN = 16
SLACK_TOKENS = 8  # the state counted alone may merge differently at its edges than inside the prompt


def positions_of(config) -> int | None:
    """The positions a checkpoint's config gives its (text) model, or None when it names none."""
    for cfg in (config, getattr(config, "text_config", None), getattr(config, "backbone_config", None)):
        value = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
        if isinstance(value, int) and value > 0:
            return value
    return None


def question_chars(question) -> int:
    """Characters of a question's text (instructions, options, descriptions) as the request sent them."""
    return content_chars(question.model_dump(mode="json") if isinstance(question, BaseModel) else str(question))


@dataclass(frozen=True)
class PromptBounds:
    tokens: int | None  # None: no limit known (every check passes)
    source: str = "the model's positions"
    family_refuses: bool = False  # the family's prompt builder refuses past its own limit, in its own words
    cuts_state: bool = False  # the family cuts an over-long state itself: only rows are refused by characters

    @classmethod
    def of(cls, config, builder) -> PromptBounds:
        positions = positions_of(config)
        family = builder.max_length
        if family:  # upstream's documented cut is the family's contract
            return cls(family, "the family's input limit", family_refuses=True, cuts_state=builder.cuts_state)
        return cls(positions, cuts_state=builder.cuts_state)

    @property
    def chars(self) -> int | None:
        return None if self.tokens is None else self.tokens * CHARS_PER_TOKEN

    def describe(self) -> dict:
        return {"max_prompt_tokens": self.tokens, "max_prompt_chars": self.chars}

    def check_chars(self, state_text: str, questions: dict, where: str) -> None:
        """The state and the longest question (its text, as sent) against `chars`; a family that cuts its
        input to fit, as its upstream does, is left to do so (the schema's cap still bounds the request)."""
        chars = self.chars
        if chars is None or self.cuts_state:
            return
        longest = max((question_chars(q) for q in questions.values()), default=0)
        total = len(state_text) + longest
        if total > chars:
            part = (
                f"a question has {longest:,} characters"
                if longest > len(state_text)
                else f"{where} has {len(state_text):,} characters"
            )
            raise PromptTooLong(
                f"prompt too long: {part}, {total:,} with the longest question; this model reads at "
                f"most {self.tokens:,} tokens ({self.source}), so at most {chars:,} characters "
                "are read before counting tokens",
                (where,),
            )

    def check_state_tokens(self, tokenizer, state_text: str, where: str) -> None:
        if self.tokens is None or self.family_refuses or len(state_text) <= self.tokens:  # fewer chars than tokens
            return
        count = len(tokenizer(state_text, add_special_tokens=False)["input_ids"])
        if count > self.tokens + SLACK_TOKENS:
            raise PromptTooLong(
                f"prompt too long: {where} alone is {count:,} tokens; this model reads at most "
                f"{self.tokens:,} ({self.source})",
                (where,),
            )

    def check_prepared(self, prepared, where: str) -> None:
        if self.tokens is None or self.family_refuses:
            return
        longest = len(prepared.prefix_ids) + max((len(row) for row in prepared.rows), default=0)
        if longest > self.tokens:
            raise PromptTooLong(
                f"prompt too long: {longest:,} tokens ({len(prepared.prefix_ids):,} of {where} and "
                f"the prompt around it, the rest the longest question row); this model reads at "
                f"most {self.tokens:,} ({self.source})",
                (where,),
            )
