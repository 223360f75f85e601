"""Prompt building: a state and its question rows -> the exact token ids the model would see.

Every row's prompt is rendered whole (`[template head][state block][row][template tail]`) and
tokenised in one pass, exactly as `tokenizer(apply_chat_template(...))` would. The shared prefix
(what L3 caches) is then cut from those ids at the last token that ends inside the state block, so
prefix + row is always the one-pass tokenisation: nothing is tokenised in pieces and glued, and no
marker string is ever inserted into user text. The template's head and tail around the user content
are learned once at load and checked against the template itself.
"""

from __future__ import annotations

import hashlib
import string
from collections.abc import Iterable

from jev_common.checkpoint_files import ServingError
from jev_common.control_tokens import ControlTokens
from jev_common.errors import TooManyOptions
from jev_common.recipe import PromptSpec, Recipe

from ..protocols import PromptBuilder
from ..values.datatypes import (
    PreparedRequest as PreparedRequest,
    RowSpec as RowSpec,  # declared below the protocols
)


def family_prompt(recipe: Recipe, prompt: PromptSpec, family: str) -> Recipe:
    """`recipe` laid out by its family's own `prompt` (written from the family's upstream source). A recipe
    that sets prompt fields of its own would only seem to change the prompt, so it is refused."""
    if recipe.prompt.model_fields_set:
        raise ServingError(
            f"recipe {recipe.name}: family {family!r} lays its prompt out as its upstream does; "
            f"remove prompt.{', prompt.'.join(sorted(recipe.prompt.model_fields_set))} from the recipe"
        )
    return recipe.model_copy(update={"prompt": prompt})


def ids_key(head: str, ids: Iterable[int]) -> str:
    """A prefix key: sha256 of `head` (the checkpoint identity, a layout tag, image keys) and the token ids."""
    digest = hashlib.sha256(head.encode())
    digest.update(b"".join(i.to_bytes(4, "little") for i in ids))
    return digest.hexdigest()


class PromptLayout:
    """The template text around the user message: `head + content + tail`.

    With a chat template, head and tail come from rendering the template once; the layout is then
    checked on probe contents (inner newlines, spaces at the state's edges) so a template that
    rewrites its content is refused at load rather than served with the wrong text.
    """

    def __init__(self, tokenizer, recipe: Recipe):
        prompt = recipe.prompt
        self.use_chat = bool(prompt.use_chat_template and getattr(tokenizer, "chat_template", None))
        self.add_special_tokens = not self.use_chat
        if not self.use_chat:
            self.head = prompt.system + "\n\n" if prompt.system else ""
            self.tail = "\n" + prompt.answer_prefix
            return
        system = [{"role": "system", "content": prompt.system}] if prompt.system else []

        def render(content: str) -> str:
            return tokenizer.apply_chat_template(
                system + [{"role": "user", "content": content}],
                tokenize=False,
                add_generation_prompt=True,
                **prompt.chat_template_kwargs,
            )

        probe = "\u2063jev-layout-probe\u2063"
        text = render(probe)
        if text.count(probe) != 1:
            raise ValueError(f"recipe {recipe.name}: the chat template does not place the user message once")
        head, _, tail = text.partition(probe)
        for state in ("  spaced state  ", "\nline one\n\nline two\n", "x"):
            content = prompt.state_block.format(state=state) + prompt.question_block.format(question="q?") + "Answer."
            if render(content) != head + content + tail:
                raise ValueError(
                    f"recipe {recipe.name}: the chat template rewrites the user message "
                    "(e.g. trims it), so prompts could not be rendered exactly; fix the recipe's "
                    "state_block/question_block or use_chat_template"
                )
        self.head = head
        self.tail = tail + prompt.answer_prefix


class ChatPromptBuilder(PromptBuilder):
    """The recipe's chat template (or plain layout) around the state block and each question row."""

    _code_source = "its tokenizer has"  # what the option codes come from (a readout's codebook names its own)

    def __init__(self, tokenizer, recipe: Recipe, identity: str):
        super().__init__(
            tokenizer,
            recipe,
            identity,
            controls=ControlTokens.of(
                tokenizer, hint="the model's template cannot carry it as text; remove it from the request"
            ),
        )
        self.layout = PromptLayout(tokenizer, recipe)
        self.use_chat = self.layout.use_chat
        verbalizer = recipe.verbalizer
        self.letter_ids = [self.single_token(label) for label in verbalizer.labels]
        self.codes, self.code_ids = self._codes()
        self.yes_no_ids = (self.single_token(verbalizer.yes), self.single_token(verbalizer.no))
        digits = [self._try_single_token(d) for d in string.digits]
        self.digit_ids = tuple(digits) if all(d is not None for d in digits) and len(set(digits)) == 10 else None

    # ----- labels -------------------------------------------------------------------------------
    def single_token(self, label: str) -> int:
        token = self._try_single_token(label)
        if token is None:
            raise ValueError(f"label {label!r} is not one token for this tokenizer; the verbalizer needs one")
        return token

    def _try_single_token(self, label: str) -> int | None:
        ids = self.tokenizer.encode(self.recipe.verbalizer.label_prefix + label, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def _codes(self) -> tuple[list[str], list[int]]:
        """The verbalizer's letters, then two-letter codes (AA, AB, ...) that are one distinct token
        each, up to max_codes. A tokenizer with fewer serves fewer options (422 beyond, see README)."""
        verbalizer = self.recipe.verbalizer
        codes, ids = list(verbalizer.labels), list(self.letter_ids)
        if verbalizer.extend_codes:
            seen = set(ids)
            for first in verbalizer.labels:
                for second in verbalizer.labels:
                    if len(codes) >= verbalizer.max_codes:
                        break
                    token = self._try_single_token(first + second)
                    if token is not None and token not in seen:
                        seen.add(token)
                        codes.append(first + second)
                        ids.append(token)
        return codes[: verbalizer.max_codes], ids[: verbalizer.max_codes]

    def use_codebook(self, codes: list[str], ids: list[int], source: str) -> None:
        """A readout's own option codes and the labels read for them (e.g. rows of a code-readout
        weight): options are listed under these codes, and score levels too (no digit labels)."""
        self.codes, self.code_ids, self.digit_ids = list(codes), list(ids), None
        self._code_source = source

    @property
    def max_options(self) -> int:
        return len(self.codes)

    def coded(self, n: int) -> tuple[list[str], tuple[int, ...]]:
        if n > len(self.codes):
            raise TooManyOptions(
                f"at most {len(self.codes)} options for this model ({self._code_source} "
                f"{len(self.codes)} single-token option codes)"
            )
        return self.codes[:n], tuple(self.code_ids[:n])

    # ----- tokens -------------------------------------------------------------------------------
    def prepare(
        self, state_text: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        """`state_text` may already hold image placeholders (they are the model's own tokens)."""
        head = self.layout.head + self.state_block(state_text)
        texts = [head + row.content + self.layout.tail + row.after for row in rows]
        prefix, row_ids, mismatch = split_prefix(
            self.tokenizer, texts, len(head), add_special_tokens=self.layout.add_special_tokens
        )
        return PreparedRequest(
            prefix_ids=prefix,
            rows=row_ids,
            row_labels=tuple(row.labels for row in rows),
            image_keys=tuple(image_keys),
            prefix_key=ids_key(f"{self.identity}|{','.join(image_keys)}|", prefix),
            plan=plan,
            boundary_mismatch=mismatch,
        )

    def state_block(self, state_text: str) -> str:
        """The state's text in the prompt, what the shared prefix ends with: the recipe's state_block around it."""
        return self.recipe.prompt.state_block.format(state=state_text)

    def reference_text(self, state_text: str, row: RowSpec) -> str:
        """The whole prompt text of one row, as the model's own template renders it."""
        return self.layout.head + self.state_block(state_text) + row.content + self.layout.tail + row.after


def _tokenize(tokenizer, texts: list[str], boundary: int, add_special: bool) -> list[tuple[tuple[int, ...], int]]:
    """One-pass ids of each text, and how many of them end inside the first `boundary` chars."""
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(texts, add_special_tokens=add_special, return_offsets_mapping=True)
        out = []
        for ids, offsets in zip(encoded["input_ids"], encoded["offset_mapping"]):
            cut = 0
            while cut < len(ids) and offsets[cut][1] <= boundary:
                cut += 1
            out.append((tuple(ids), cut))
        return out
    head = tuple(tokenizer(texts[0][:boundary], add_special_tokens=add_special)["input_ids"])
    out = []
    for text in texts:
        ids = tuple(tokenizer(text, add_special_tokens=add_special)["input_ids"])
        cut = 0
        while cut < min(len(ids), len(head)) and ids[cut] == head[cut]:
            cut += 1
        out.append((ids, max(0, cut - 1)))  # the head's last token may merge with what follows
    return out


def split_prefix(
    tokenizer, texts: list[str], boundary: int, *, add_special_tokens: bool
) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...], bool]:
    """Rows whose texts share their first `boundary` characters (the head: template head and state), each
    tokenised whole in one pass, as (prefix ids, each row's ids after it, whether the rows disagreed on
    where the head ends). The prefix is cut at the last token that ends inside the head (or the rows'
    common ids when they differ before it), every row keeping at least one token: prefix + row is always
    that row's one-pass tokenisation."""
    tokenized = _tokenize(tokenizer, texts, boundary, add_special_tokens)
    longest_cut = min(len(ids) for ids, _ in tokenized) - 1  # every row keeps at least one token
    cut = min(min(c for _, c in tokenized), longest_cut)
    prefix = tokenized[0][0][:cut]
    differs = any(ids[:cut] != prefix for ids, _ in tokenized)
    mismatch = differs or len({c for _, c in tokenized}) > 1
    if differs:  # rows disagree before the boundary: share only their common tokens
        cut = min(_common_prefix_length([ids for ids, _ in tokenized]), longest_cut)
        prefix = tokenized[0][0][:cut]
    return prefix, tuple(ids[cut:] for ids, _ in tokenized), mismatch


def _common_prefix_length(sequences: list[tuple[int, ...]]) -> int:
    first = sequences[0]
    n = min(len(s) for s in sequences)
    i = 0
    while i < n and all(s[i] == first[i] for s in sequences):
        i += 1
    return i
