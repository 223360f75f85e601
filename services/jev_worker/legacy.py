"""The single-question form of the JEV-VL worker contract (`kind`, `state`, `question`, `options`):
its rows, and (kinds.py) its answer fields. Built on the same exact prompt builder as the envelope."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

from jev_common.schema import DecisionRequest

from .prompt import RowSpec
from .protocols import PromptBuilder


@dataclass(frozen=True)
class LegacyPlan:
    kind: str
    options: tuple[str, ...]
    numeric_values: tuple[float, ...] | None


def legacy_rows(request: DecisionRequest, builder: PromptBuilder) -> tuple[list[RowSpec], LegacyPlan]:
    prompt = builder.recipe.prompt
    verbalizer = builder.recipe.verbalizer
    for where, text in (("state.text", request.state.text or ""), ("question", request.question),
                        *((f"options[{i}]", o) for i, o in enumerate(request.options))):
        builder.check_user_text(text, where)
    question = prompt.question_block.format(question=request.question)
    options = list(request.options)
    numeric = None

    def lettered(names: list[str]):
        codes, ids = builder.coded(len(names))
        return "\n".join(f"{c}. {o}" for c, o in zip(codes, names)), ids

    if request.kind == "set":
        rows = [RowSpec(question + prompt.set_instruction.format(option=o), builder.yes_no_ids) for o in options]
    else:
        if request.kind == "noul":
            listing, ids = lettered(options + [verbalizer.noul_option])
            instruction = prompt.choice_instruction.format(options=listing)
        elif request.kind == "score":
            numeric = tuple(float(o) for o in options)
            own = [builder._try_single_token(o) for o in options] if verbalizer.numeric_labels_for_score else []
            if own and all(i is not None for i in own) and len(set(own)) == len(own):
                instruction, ids = prompt.score_instruction.format(options="\n".join(options)), tuple(own)
            else:
                listing, ids = lettered(options)
                instruction = prompt.choice_instruction.format(options=listing)
        else:
            listing, ids = lettered(options)
            instruction = prompt.choice_instruction.format(options=listing)
        rows = [RowSpec(question + instruction, tuple(ids))]
    return rows, LegacyPlan(kind=request.kind, options=tuple(options), numeric_values=numeric)


def legacy_state_text(request: DecisionRequest, image_placeholders: list[str]) -> str:
    return "".join(p + "\n" for p in image_placeholders) + (request.state.text or "")


def l1_key(request: DecisionRequest, image_keys: tuple[str, ...]) -> str:
    """Identifies a request's prompt: everything but request_id and deadline."""
    payload = request.model_dump_json(include={"kind", "question", "options"}) + "|" + (request.state.text or "")
    return hashlib.sha256(("legacy|" + payload + "|" + ",".join(image_keys)).encode()).hexdigest()


def prepare_legacy(builder: PromptBuilder, request: DecisionRequest, image_placeholders: list[str] = (),
                   image_keys: tuple[str, ...] = ()):
    rows, plan = legacy_rows(request, builder)
    return builder.prepare(legacy_state_text(request, list(image_placeholders)), rows, tuple(image_keys), plan)
