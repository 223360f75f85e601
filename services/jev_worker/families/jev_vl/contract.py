"""JEV-27B-VL's System 1 contract as upstream writes it; no torch here (recipes/jev-27b-vl/export.py reads it).

Sources: `serve_decide.py` of autotrust/JEV-27B-VL@f34b598d4ef4bcefd337bee8d8e7ddd3b7733ccc (`setup`'s
`single_token_labels`, `_parts`, `s1_pass`, `decide`) and its native port in ThinkFlowLab/system1-omni
(`src/models/jev_vl/native/src/contract.rs`@f8fb7996, `processing.rs`/`executor.rs`@8f813552,
`recipe/jev_vl/export_merged.py`@28083ead).

    "[kind] " KIND "\\n[state] " STATE "\\n[question] " QUESTION "\\n[options]\\n" LINES "\\n[decision]:"

no chat template, no BOS, no system prompt; the answer is the next token after `:`. LINES: choice
`A) opt`, `B) opt`, ... (labels A..Z then two-letter labels, each one token that the tokenizer keeps in
`"x\\n{label}) y"`, at most 256); noul `false`, `true`; score `0` ... `5`. STATE: text as sent, a JSON
object as `json.dumps(ensure_ascii=False)`, a list as its parts concatenated with no separator (text parts
as sent, image parts the model's vision tokens where they stand, any other item as JSON).
"""

from __future__ import annotations

import json
import math
import os
import string
from dataclasses import dataclass

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.schema import image_part_url

KINDS = ("noul", "score", "choice")
NOUL_OPTIONS = ("false", "true")  # decide(): the noul candidates, P over [false, true]
SCORE_OPTIONS = tuple(str(i) for i in range(6))  # decide(): score is always 0..5
MAX_OPTIONS = 256
LABEL_CONTEXT = "x\n{}) y"  # setup(): dec = single_token_labels("x\n{}) y")
RANGES = {"noul": [0, 2], "score": [2, 8], "choice": [8, 24]}  # decision_head.json slots.ranges (engine.rs)
SLOTS = 24
MAX_LENGTH = 16384  # export_merged.py --max-length default (processing.rs)
HEAD_CONFIG = os.path.join("adapter_vllm", "decision_head.json")  # serve_decide reads it from the adapter
CALIBRATION = "calibration.json"  # ... and calibration.json from the adapter's parent
LABEL_HEAD = "label_head.safetensors"  # export_merged.py: merged FP32 rows `rows`, their `ids`
DEFAULT_TEMPERATURES = {"noul": 1.0, "score": 1.0, "choice": 1.0}  # setup() without calibration.json


def candidate_labels() -> list[str]:
    return list(string.ascii_uppercase) + [a + b for a in string.ascii_uppercase for b in string.ascii_uppercase]


def single_token_labels(tokenizer) -> list[tuple[str, int]]:
    """serve_decide.py setup()'s option-label scan: each label that is one token, and that token occurs
    when the label is written in "x\\n{label}) y"; at most 256."""
    out = []
    for label in candidate_labels():
        ids = tokenizer.encode(label, add_special_tokens=False)
        if len(ids) == 1 and ids[0] in tokenizer.encode(LABEL_CONTEXT.format(label), add_special_tokens=False):
            out.append((label, ids[0]))
        if len(out) == MAX_OPTIONS:
            break
    return out


def head_text(kind: str, state: str) -> str:
    """The prompt up to the end of the state (what every question of `kind` about `state` shares)."""
    return f"[kind] {kind}\n[state] {state}"


def tail_text(question: str, lines: list[str]) -> str:
    """The prompt after the state."""
    return f"\n[question] {question}\n[options]\n" + "\n".join(lines) + "\n[decision]:"


def choice_lines(options: list[str], labels: list[str]) -> list[str]:
    return [f"{labels[i]}) {option}" for i, option in enumerate(options)]


def options_message(n: int, labels: int) -> str:
    return f"choice needs 2-{labels} options, got {n}"  # decide()'s refusal, word for word


def too_long_message(max_length: int, tokens: int) -> str:
    """processing.rs's refusal of a prompt over the export's max_length (vLLM's words)."""
    return (
        f"This model's maximum context length is {max_length} tokens. However, you requested 1 output tokens "
        f"and your prompt contains at least {tokens} input tokens, for a total of at least {tokens + 1} tokens. "
        "Please reduce the length of the input prompt or the number of requested output tokens. "
        f"(parameter=input_tokens, value={tokens})"
    )


class BadPart(ValueError):
    """A state part upstream cannot read (its message names it); `index` is its place in the list."""

    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index = index


def state_parts(state) -> list[tuple[str, object]]:
    """`_parts`: the state as ("text", text) and ("image", url) parts in order."""
    if isinstance(state, str):
        return [("text", state)]
    if isinstance(state, dict):
        return [("text", json.dumps(state, ensure_ascii=False))]
    out: list[tuple[str, object]] = []
    for i, part in enumerate(state):
        if isinstance(part, str):
            out.append(("text", part))
        elif isinstance(part, dict) and ("image" in part or part.get("type") == "image_url"):
            out.append(("image", image_part_url(part)))
        elif isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
            if not isinstance(text, str):  # upstream fails on it (a KeyError, a TypeError)
                raise BadPart(i, f"state[{i}] is a text part without a string `text`")
            out.append(("text", text))
        else:
            out.append(("text", json.dumps(part, ensure_ascii=False)))
    return out


# ----- the checkpoint's decision files ------------------------------------------------------------
def _number(value, what: str, source: str, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or (positive and value <= 0)
    ):
        raise ServingError(f"{source}: {what} must be a {'positive ' if positive else ''}finite number, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class DecisionFiles:
    """`adapter_vllm/decision_head.json` (24 verbalizer ids and slot biases, slot ranges) and
    `calibration.json` (`per_kind` temperatures), checked as the native engine checks its export."""

    verbalizer_ids: tuple[int, ...]
    bias: tuple[float, ...]
    temperatures: dict[str, float]
    calibration: str | None  # the file the temperatures came from (None: upstream's defaults, 1.0)

    @classmethod
    def read(cls, folder: str) -> DecisionFiles:
        head = read_json(os.path.join(folder, HEAD_CONFIG))
        if not isinstance(head, dict):
            raise ServingError(f"{HEAD_CONFIG}: not a JSON object")
        ranges = (head.get("slots") or {}).get("ranges") if isinstance(head.get("slots"), dict) else None
        if ranges != RANGES:
            raise ServingError(f"{HEAD_CONFIG}: slots.ranges is {ranges!r}; JEV-VL's trained head is {RANGES}")
        ids, bias = head.get("verbalizer_ids"), head.get("bias")
        if not (
            isinstance(ids, list)
            and len(ids) == SLOTS
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids)
        ):
            raise ServingError(f"{HEAD_CONFIG}: verbalizer_ids must be {SLOTS} token ids")
        if not (isinstance(bias, list) and len(bias) == SLOTS):
            raise ServingError(f"{HEAD_CONFIG}: bias must be {SLOTS} numbers")
        bias = tuple(_number(b, f"bias[{i}]", HEAD_CONFIG) for i, b in enumerate(bias))
        path = os.path.join(folder, CALIBRATION)
        source, temperatures = None, dict(DEFAULT_TEMPERATURES)
        if os.path.isfile(path):
            config = read_json(path)
            per_kind = config.get("per_kind") if isinstance(config, dict) else None
            if not isinstance(per_kind, dict):
                raise ServingError(f"{CALIBRATION}: no `per_kind` temperatures")
            per_kind = {"score": 1.0, **per_kind}  # setup(): temps.setdefault("score", 1.0)
            missing = [kind for kind in KINDS if kind not in per_kind]
            if missing:
                raise ServingError(f"{CALIBRATION}: per_kind has no temperature for {', '.join(missing)}")
            temperatures = {kind: _number(per_kind[kind], f"per_kind.{kind}", CALIBRATION, True) for kind in KINDS}
            source = CALIBRATION
        return cls(tuple(ids), bias, temperatures, source)

    def slots(self, kind: str) -> tuple[int, int]:
        lo, hi = RANGES[kind]
        return lo, hi

    def choice_bias(self, n: int) -> list[float]:
        """s1_pass: the slot bias of the first 16 options, 0.0 past them."""
        lo, hi = self.slots("choice")
        return [self.bias[lo + i] if lo + i < hi else 0.0 for i in range(n)]

    def describe(self) -> dict:
        return {"source": self.calibration, "temperatures": dict(self.temperatures), "bias": HEAD_CONFIG}
