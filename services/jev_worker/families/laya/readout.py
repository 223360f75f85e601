"""laya-heads: Laya's decision layers over an encoder's hidden states (backend `encoder`).

Checkpoint (convaiinnovations/laya): `rl_agent_config.json` (`encoder`, `head_layers`, `max_len`,
`head_max_len`, `temperature` [choice, score, noul], `temperature_by_options` {"type:bucket": T}),
`model.safetensors` (the encoder under `encoder.`, then `head.layers.{i}.*` pre-norm transformer
layers with max(1, hidden // 64) heads and a 4 x hidden feed-forward, `type_emb.weight` [3, hidden],
`scorer.{0,1,3}.*` LayerNorm -> Linear -> GELU -> Linear(hidden, 1), `act_head.*`), `encoder/`, `tokenizer/`.

Per question: h = encoder states + type_emb[type]; the decision layers over the whole sequence; one
FP32 logit per [mask] marker from the scorer; divided by the checkpoint's temperature for (type,
option-count bucket), clamped to [0.5, 5] as Laya applies it; softmax. Choice: the options; score:
the levels (score = sum i p_i); noul: the [false, true] pair, P(yes) = p[true]. The act head (Laya's
"act" probability) is not part of a System One answer and is not run. span and set: no head (4xx).
"""

from __future__ import annotations

import math
import os

import torch
from torch import nn

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.schema import (
    ChoiceAnswer,
    ChoiceQuestion,
    NoulAnswer,
    NoulQuestion,
    ScoreAnswer,
    ScoreQuestion,
    choice_answer,
    score_answer,
)

from ...backends.encoder import Encoder, SplitFolders
from ...loading.checkpoint import Requirement, load_exactly
from ...protocols import Backend, Head, QuestionKind
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout
from .layout import QTYPE_IDS, LayaRow, LayaSequenceBuilder

CONFIG = "rl_agent_config.json"
WEIGHTS = "model.safetensors"
TEMP_MIN, TEMP_MAX = 0.5, 5.0
NOUL_DEFAULTS = {"false": "no, the statement does not hold", "true": "yes, the statement holds"}


def clamp_temperature(value) -> float:
    """Laya's usable temperature: a finite number confined to [0.5, 5], else 1."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return 1.0
    return min(TEMP_MAX, max(TEMP_MIN, value)) if math.isfinite(value) else 1.0


def bucket(type_: str, k: int) -> str:
    size = "2" if k <= 2 else "3-5" if k <= 5 else "6-10" if k <= 10 else "11+"
    return f"{type_}:{size}"


class LayaTemperatures:
    def __init__(self, config: dict):
        raw = config.get("temperature", [1.0, 1.0, 1.0])
        if not isinstance(raw, list) or len(raw) != 3:
            raise ServingError(f"{CONFIG}: temperature must be a list [choice, score, noul], got {raw!r}")
        self.by_type = {type_: clamp_temperature(raw[i]) for type_, i in QTYPE_IDS.items()}
        self.by_options = {key: clamp_temperature(v) for key, v in (config.get("temperature_by_options") or {}).items()}

    def of(self, type_: str, k: int) -> float:
        return self.by_options.get(bucket(type_, k), self.by_type[type_])

    def describe(self) -> dict:
        return {
            "source": CONFIG,
            "temperatures": dict(self.by_type),
            "temperature_by_options": dict(self.by_options),
            "clamp": [TEMP_MIN, TEMP_MAX],
        }


class LayaDecisionHead(nn.Module, Head):
    """type embedding + decision layers + scorer; `logits(hidden [L, d], (type id, *markers))`."""

    def __init__(self, hidden: int, layers: int, temperatures: LayaTemperatures):
        super().__init__()
        heads = max(1, hidden // 64)
        self.layers = nn.ModuleList(
            [
                nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, 0.0, batch_first=True, norm_first=True)
                for _ in range(layers)
            ]
        )
        self.type_emb = nn.Embedding(3, hidden)
        self.scorer = nn.Sequential(nn.LayerNorm(hidden), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.temperatures = temperatures
        self.type_names = {i: t for t, i in QTYPE_IDS.items()}

    def load(self, weights: dict) -> None:
        state = {}
        for key, value in weights.items():
            if key.startswith("head.layers."):
                state[key.removeprefix("head.")] = value
            elif key.startswith(("type_emb.", "scorer.")):
                state[key] = value
        load_exactly(self, state, source=WEIGHTS, fits="the decision layers' hidden size / head_layers")
        self.float().eval().requires_grad_(False)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        type_id, markers = labels[0], list(labels[1:])
        h = (hidden.float() + self.type_emb.weight[type_id])[None]
        for layer in self.layers:
            h = layer(h)
        scores = self.scorer(h[0, markers]).squeeze(-1).float()
        return scores / self.temperatures.of(self.type_names[type_id], len(markers))


def instructions(question, ctx: BuildContext, where: str) -> str:
    """The question's instructions as laya 0.3.20 reads them (`Agent._to_internal`: text as is, anything else
    `json.dumps(..., ensure_ascii=False)`, so an explicit null is `null`). Absent instructions upstream refuses;
    this API allows them, so the recipe's default question of the type is sent (recipe README)."""
    if question.instructions is None and "instructions" in question.model_fields_set:
        return "null"
    return ctx.instructions(question, where)


def _softmax(logits) -> list[float]:
    return torch.softmax(logits[0].float(), dim=-1).tolist()


class LayaChoice(QuestionKind):
    type = "choice"

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[LayaRow]:
        options = [name if not text else f"{name}: {text}" for name, text in ctx.criteria(question, where)]
        return [LayaRow("choice", instructions(question, ctx, where), tuple(options))]

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        probs, names = _softmax(logits), list(question.criteria)
        return choice_answer(names, probs)


class LayaScore(QuestionKind):
    type = "score"

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[LayaRow]:
        levels = [
            f"level {i}: {ctx.user_text(level, f'{where}.criteria[{i}]')}" for i, level in enumerate(question.criteria)
        ]
        return [LayaRow("score", instructions(question, ctx, where), tuple(levels))]

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        probs = _softmax(logits)
        return score_answer(question.criteria, probs)


class LayaNoul(QuestionKind):
    type = "noul"

    def rows(self, question: NoulQuestion, ctx: BuildContext, where: str) -> list[LayaRow]:
        criteria = question.criteria
        given = {} if criteria is None else {"false": criteria.false, "true": criteria.true}
        sides = []
        for side in ("false", "true"):
            value = given.get(side)
            text = "" if value is None else ctx.user_text(value, f"{where}.criteria.{side}")
            sides.append(f"{side}: {text or NOUL_DEFAULTS[side]}")
        return [LayaRow("noul", instructions(question, ctx, where), tuple(sides))]

    def answer(self, question: NoulQuestion, logits, ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=_softmax(logits)[1])


class LayaHeads(StandardReadout):
    name = "laya-heads"
    question_types = frozenset({"choice", "score", "noul"})
    config: dict | None = None  # rl_agent_config.json, read by `check`
    temperatures: LayaTemperatures | None = None  # once loaded

    def make_backend(self) -> Backend:
        return Encoder(SplitFolders())  # the encoder's config in encoder/, its tokenizer in tokenizer/

    def requirements(self) -> list[Requirement]:
        return [
            Requirement(CONFIG, ("encoder", "head_layers")),
            Requirement(WEIGHTS, ("type_emb.weight", "scorer.1.weight", "scorer.3.weight")),
            Requirement(os.path.join("encoder", "config.json")),
            Requirement(os.path.join("tokenizer", "tokenizer_config.json")),
        ]

    def prompt_builder(self, tokenizer, recipe, identity: str) -> LayaSequenceBuilder:
        return LayaSequenceBuilder(
            tokenizer,
            recipe,
            identity,
            max_len=int(self.config.get("max_len", 512)),
            head_max_len=int(self.config.get("head_max_len", 192)),
        )

    def check(self, folder: str) -> None:
        super().check(folder)
        self.config = read_json(os.path.join(folder, CONFIG))

    def load(self, loaded, builder) -> None:
        from safetensors.torch import load_file

        self.config = read_json(os.path.join(loaded.folder, CONFIG))
        self.temperatures = LayaTemperatures(self.config)
        weights = load_file(os.path.join(loaded.folder, WEIGHTS))
        hidden = int(loaded.model.config.hidden_size)
        head = LayaDecisionHead(hidden, int(self.config["head_layers"]), self.temperatures)
        head.load(weights)
        self.head = head.to(loaded.device)
        self.kinds = {kind.type: kind for kind in (LayaChoice(), LayaScore(), LayaNoul())}

    def describe(self) -> dict:
        calibration = self.temperatures.describe() if self.temperatures is not None else None
        return {"readout": self.name, "question_types": sorted(self.question_types), "calibration": calibration}
