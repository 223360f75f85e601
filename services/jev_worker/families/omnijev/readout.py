"""omnijev-heads: OmniJev-4B v1.1's trained decision and ordinal heads (heads.py) over rows laid
out as the reference's branch path lays them out (backend `causal-lm-rows`).

Checkpoint (the system1-omni export of tinnel123/OmniJev): the merged backbone with its LM head,
`heads.safetensors` (`head.*`, `ord.*`, FP32) and `omnijev_export.json` (`option_tokens`
{"<|opt|>": id, "<|/opt|>": id}, `calibration` {`temperatures` {noul, choice, score}, `noul_bias`}).

Each option of a question is its own row: the user turn `{state block}{instructions}`, the template's
answer turn, then one block `<|opt|>{option}<|/opt|>` (option text cut to 200 characters; noul's one
option is empty). From each row: u = the hidden state at `<|/opt|>`, zq = the one before `<|opt|>`
(the question's, taken from its first row), and the option text's token log-probabilities from the
LM head (each token from the position before it; the first one also from zq): the six LM features.
Choice: softmax over [options, abstain] from the OptionScorer; score: the ordinal head; noul: the
sigmoid of its one logit with the noul bias on the log-odds. Then each type's temperature as the
reference applies it (p^(1/T) renormalised, p floored at 1e-9). This API has no abstain field: choice
and score report the options' probabilities renormalised without the abstain mass.
"""

from __future__ import annotations

import math
import os

import torch

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.errors import UnreadableInput
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

from ...backends.causal_rows import CausalRows
from ...loading.checkpoint import Requirement
from ...prompt.builder import ChatPromptBuilder, RowSpec
from ...protocols import Backend, Head, QuestionKind
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout
from .heads import TYPE_IDS, OmniJevHeads, lm_features

HEADS = "heads.safetensors"
MANIFEST = "omnijev_export.json"
OPEN, CLOSE = "<|opt|>", "<|/opt|>"
OPTION_CHARS = 200


class RowReader(Head):
    """A row's readouts from its hidden states [length, d] (addressed from the row's end, which is
    `<|/opt|>`): u, zq, the option-text tokens' log-probabilities (labels = their ids), the first one's from zq."""

    def __init__(self, lm_head: torch.Tensor):
        self.lm_head = lm_head.to(torch.float32)

    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        n = len(labels)
        hidden = hidden.to(torch.float32)
        u, zq = hidden[-1], hidden[-3 - n]
        targets = torch.tensor(labels, dtype=torch.long, device=hidden.device)
        if n:
            predictors = hidden[-2 - n : -2]  # <|opt|> and the text tokens but the last
            picked = torch.log_softmax(predictors @ self.lm_head.T, -1).gather(1, targets[:, None]).squeeze(1)
            first = torch.log_softmax(zq @ self.lm_head.T, -1)[targets[0]].reshape(1)
        else:
            picked, first = hidden.new_zeros(0), hidden.new_full((1,), math.nan)
        return torch.cat([u, zq, picked, first]).cpu()


def split_row(out: torch.Tensor, hidden: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, float | None]:
    first = float(out[-1])
    return out[:hidden], out[hidden : 2 * hidden], out[2 * hidden : -1], None if math.isnan(first) else first


def scale(probabilities: list[float], temperature: float) -> list[float]:
    """The reference's post-hoc temperature: p^(1/T) renormalised, identity at T = 1."""
    if abs(temperature - 1.0) < 1e-6:
        return probabilities
    weights = [max(1e-9, p) ** (1.0 / temperature) for p in probabilities]
    total = sum(weights)
    return [w / total for w in weights]


class OmniJevBuilder(ChatPromptBuilder):
    """The prompt builder, checking that each row ends `<|opt|>` + its option's tokens + `<|/opt|>`."""

    def prepare(self, state_text, rows, image_keys=(), plan=None):
        prepared = super().prepare(state_text, rows, image_keys, plan)
        open_id, close_id = (self.tokenizer.convert_tokens_to_ids(t) for t in (OPEN, CLOSE))
        for ids, row in zip(prepared.rows, rows):
            want = (open_id, *row.labels, close_id)
            if tuple(ids[-len(want) :]) != want:
                raise UnreadableInput(
                    f"option text {row.after!r} does not tokenise on its own between the option markers"
                )
        return prepared


class _OmniKind(QuestionKind):
    def __init__(self, readout: OmniJevReadout):
        self.readout = readout

    def row(self, question, ctx: BuildContext, where: str, option: str) -> RowSpec:
        text = ctx.instructions(question, where)
        option = option[:OPTION_CHARS]
        labels = tuple(ctx.builder.tokenizer(option, add_special_tokens=False)["input_ids"]) if option else ()
        return RowSpec(text, labels, after=f"{OPEN}{option}{CLOSE}")

    def readouts(self, logits) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = self.readout.hidden
        parts = [split_row(out, hidden) for out in logits]
        u = torch.stack([p[0] for p in parts])
        feats = lm_features([p[2] for p in parts], [p[3] for p in parts])
        return u, parts[0][1], feats

    def finish(self, probabilities: list[float], type_: str) -> list[float]:
        full = scale(probabilities, self.readout.temperatures[type_])
        options = full[:-1]
        total = sum(options)
        return [p / total for p in options]


class OmniChoice(_OmniKind):
    type = "choice"

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        """An option is its key, or `"{}: {}".format(key, description)` (mso/infer.py `MSO1._options`): a
        description that is not text reads as Python prints it (`k: {'a': 1}`), as upstream writes it."""
        rows = []
        for name, description in question.criteria.items():
            text = name if description in (None, "") else f"{name}: {description}"
            ctx.builder.check_user_text(text, f"{where}.criteria[{name!r}]")
            rows.append(self.row(question, ctx, where, text))
        return rows

    def answer(self, question: ChoiceQuestion, logits, ctx: BuildContext) -> ChoiceAnswer:
        u, zq, feats = self.readouts(logits)
        mu = torch.softmax(self.readout.heads.option_logits(u, zq, TYPE_IDS["choice"], feats), 0)[:-1].tolist()
        probs = self.finish(mu + [max(0.0, 1.0 - sum(mu))], "choice")
        names = list(question.criteria)
        return choice_answer(names, probs)


class OmniScore(_OmniKind):
    type = "score"

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        return [
            self.row(question, ctx, where, ctx.user_text(level, f"{where}.criteria[{i}]"))
            for i, level in enumerate(question.criteria)
        ]

    def answer(self, question: ScoreQuestion, logits, ctx: BuildContext) -> ScoreAnswer:
        u, zq, _ = self.readouts(logits)
        mu = self.readout.heads.ordinal(zq, u)
        probs = self.finish((mu / mu.sum().clamp(min=1e-6)).tolist() + [0.0], "score")
        return score_answer(question.criteria, probs)


class OmniNoul(_OmniKind):
    type = "noul"

    def rows(self, question: NoulQuestion, ctx: BuildContext, where: str) -> list[RowSpec]:
        """One empty option; criteria are not read (mso/infer.py `MSO1._options` ignores them for noul)."""
        return [self.row(question, ctx, where, "")]

    def answer(self, question: NoulQuestion, logits, ctx: BuildContext) -> NoulAnswer:
        u, zq, feats = self.readouts(logits)
        p = float(torch.sigmoid(self.readout.heads.option_logits(u, zq, TYPE_IDS["noul"], feats)[0]))
        bias = self.readout.noul_bias
        if bias:
            p = min(max(p, 1e-9), 1.0 - 1e-9)
            p = 1.0 / (1.0 + math.exp(-max(-40.0, min(40.0, math.log(p / (1.0 - p)) + bias))))
        return NoulAnswer(noul=scale([p, 1.0 - p], self.readout.temperatures["noul"])[0])


class OmniJevReadout(StandardReadout):
    name = "omnijev-heads"
    question_types = frozenset({"choice", "score", "noul"})
    needs_lm_head = True
    temperatures: dict[str, float] | None = None  # omnijev_export.json's calibration, once loaded
    noul_bias: float | None = None
    hidden: int | None = None  # the backbone's hidden size
    heads: OmniJevHeads | None = None

    def make_backend(self) -> Backend:
        return CausalRows()  # the head reads several positions of each (question, option) row

    def prompt_builder(self, tokenizer, recipe, identity: str) -> OmniJevBuilder:
        return OmniJevBuilder(tokenizer, recipe, identity)

    def requirements(self) -> list[Requirement]:
        return [
            Requirement(HEADS, ("head.opt.0.weight", "head.log_tau", "ord.cut.0.weight")),
            Requirement(MANIFEST, ("option_tokens", "calibration")),
        ]

    def _calibration(self, manifest: dict) -> None:
        calibration = manifest["calibration"] if isinstance(manifest["calibration"], dict) else {}
        temperatures = calibration.get("temperatures") or {}
        values = {t: temperatures.get(t) for t in TYPE_IDS}
        if not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
            for v in values.values()
        ):
            raise ServingError(
                f"{MANIFEST}: calibration.temperatures needs positive noul, choice and score, got {values}"
            )
        bias = calibration.get("noul_bias")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ServingError(f"{MANIFEST}: calibration.noul_bias must be a finite number, got {bias!r}")
        self.temperatures, self.noul_bias = {t: float(v) for t, v in values.items()}, float(bias)

    def load(self, loaded, builder) -> None:
        from safetensors.torch import load_file

        manifest = read_json(os.path.join(loaded.folder, MANIFEST))
        self._calibration(manifest)
        tokens = manifest["option_tokens"]
        for token in (OPEN, CLOSE):
            actual = builder._try_single_token(token)
            if not isinstance(tokens, dict) or actual is None or tokens.get(token) != actual:
                raise ServingError(
                    f"{MANIFEST}: option token {token!r} is {tokens.get(token) if isinstance(tokens, dict) else None}"
                    f" there, but this tokenizer makes it {actual if actual is not None else 'several tokens'}"
                )
        text_config = loaded.model.config.get_text_config()
        self.hidden = int(text_config.hidden_size)
        self.heads = OmniJevHeads(load_file(os.path.join(loaded.folder, HEADS)), self.hidden)
        self.head = RowReader(loaded.model.get_output_embeddings().weight.detach())
        self.kinds = {kind.type: kind for kind in (OmniChoice(self), OmniScore(self), OmniNoul(self))}

    def describe(self) -> dict:
        calibration = (
            {"source": MANIFEST, "temperatures": dict(self.temperatures), "noul_bias": self.noul_bias}
            if self.temperatures is not None
            else None
        )
        return {"readout": self.name, "question_types": sorted(self.question_types), "calibration": calibration}
