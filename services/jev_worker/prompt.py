"""Prompt building and tokenisation: request -> shared prefix ids + one suffix row per candidate.

Layout: [system + state] is the prefix (shared by every question about the same state, so its KV
state is what L3 caches), then each row is [question + instruction + assistant cue]. Kinds choice,
noul, score and span use one row listing lettered options; kind set uses one yes/no row per option.
Prefix and rows are tokenised separately and concatenated, so the served ids are identical whether
or not the prefix comes from the cache.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from jev_common.errors import ApiError
from jev_common.recipe import Recipe
from jev_common.schema import DecisionRequest

_SPLIT = "\u0000JEV-SPLIT\u0000"


@dataclass(frozen=True)
class PreparedRequest:
    kind: str
    options: tuple[str, ...]
    prefix_ids: tuple[int, ...]
    rows: tuple[tuple[int, ...], ...]
    row_labels: tuple[tuple[int, ...], ...]  # label token ids scored at the end of each row
    numeric_values: tuple[float, ...] | None
    image_keys: tuple[str, ...]
    prefix_key: str

    @property
    def prompt_tokens(self) -> int:
        return len(self.prefix_ids) + sum(len(r) for r in self.rows)

    @property
    def nbytes(self) -> int:
        return 8 * self.prompt_tokens + 256


class PromptBuilder:
    def __init__(self, tokenizer, recipe: Recipe, identity: str):
        self.tokenizer = tokenizer
        self.recipe = recipe
        self.identity = identity
        verbalizer = recipe.verbalizer
        self.letter_ids = [self.single_token(label) for label in verbalizer.labels]
        self.yes_no_ids = (self.single_token(verbalizer.yes), self.single_token(verbalizer.no))
        self.use_chat = bool(recipe.prompt.use_chat_template and getattr(tokenizer, "chat_template", None))

    def single_token(self, label: str) -> int:
        ids = self.tokenizer.encode(self.recipe.verbalizer.label_prefix + label, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"label {label!r} is {len(ids)} tokens for this tokenizer; the verbalizer needs one")
        return ids[0]

    def _try_single_token(self, label: str) -> int | None:
        ids = self.tokenizer.encode(self.recipe.verbalizer.label_prefix + label, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None

    def render(self, state_text: str, tail: str) -> tuple[str, str]:
        """Full prompt text split into (prefix text, row text)."""
        prompt = self.recipe.prompt
        content = prompt.state_block.format(state=state_text) + _SPLIT + tail
        if self.use_chat:
            messages = ([{"role": "system", "content": prompt.system}] if prompt.system else [])
            messages.append({"role": "user", "content": content})
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            text = (prompt.system + "\n\n" if prompt.system else "") + content + "\n"
        head, _, rest = text.partition(_SPLIT)
        return head, rest + prompt.answer_prefix

    def _encode(self, text: str, first: bool) -> tuple[int, ...]:
        add_special = first and not self.use_chat
        return tuple(self.tokenizer(text, add_special_tokens=add_special)["input_ids"])

    def _letters(self, n: int) -> list[str]:
        labels = self.recipe.verbalizer.labels
        if n > len(labels):
            raise ApiError(422, "validation_error", f"at most {len(labels)} options for this recipe")
        return list(labels[:n])

    def _lettered(self, options: list[str]) -> tuple[str, tuple[int, ...]]:
        letters = self._letters(len(options))
        listing = "\n".join(f"{letter}. {option}" for letter, option in zip(letters, options))
        return listing, tuple(self.letter_ids[: len(options)])

    def prepare(self, request: DecisionRequest, image_placeholders: list[str] = (),
                image_keys: tuple[str, ...] = ()) -> PreparedRequest:
        prompt = self.recipe.prompt
        state_text = "".join(p + "\n" for p in image_placeholders) + (request.state.text or "")
        question = prompt.question_block.format(question=request.question)
        options = list(request.options)
        numeric = None
        if request.kind == "set":
            tails = [question + prompt.set_instruction.format(option=o) for o in options]
            labels = [self.yes_no_ids] * len(options)
        else:
            if request.kind == "noul":
                listing, label_ids = self._lettered(options + [self.recipe.verbalizer.noul_option])
                instruction = prompt.choice_instruction.format(options=listing)
            elif request.kind == "score":
                numeric = tuple(float(o) for o in options)
                own = [self._try_single_token(o) for o in options] if self.recipe.verbalizer.numeric_labels_for_score else []
                if own and all(i is not None for i in own) and len(set(own)) == len(own):
                    instruction = prompt.score_instruction.format(options="\n".join(options))
                    label_ids = tuple(own)
                else:
                    listing, label_ids = self._lettered(options)
                    instruction = prompt.choice_instruction.format(options=listing)
            else:
                listing, label_ids = self._lettered(options)
                instruction = prompt.choice_instruction.format(options=listing)
            tails = [question + instruction]
            labels = [label_ids]
        head_text = None
        rows = []
        for tail in tails:
            head, row = self.render(state_text, tail)
            if head_text is None:
                head_text = head
            rows.append(self._encode(row, first=False))
        prefix_ids = self._encode(head_text, first=True)
        digest = hashlib.sha256(f"{self.identity}|{','.join(image_keys)}|".encode())
        digest.update(b"".join(i.to_bytes(4, "little") for i in prefix_ids))
        return PreparedRequest(
            kind=request.kind, options=tuple(options), prefix_ids=prefix_ids, rows=tuple(rows),
            row_labels=tuple(labels), numeric_values=numeric, image_keys=tuple(image_keys),
            prefix_key=digest.hexdigest(),
        )


def l1_key(request: DecisionRequest, image_keys: tuple[str, ...]) -> str:
    """Identifies a request's prompt: everything but request_id and deadline."""
    payload = request.model_dump_json(include={"kind", "question", "options"}) + "|" + (request.state.text or "")
    return hashlib.sha256((payload + "|" + ",".join(image_keys)).encode()).hexdigest()
