"""vela-heads: Vela 2.0's decoder decision and span heads (0.8B; the 4B / 9B share the layout) on the
`vela-decoder` backend, with the packages' own prompt layout (layout.py) and FP32 heads
(heads.py). The package's Python code is never imported.

Package files read: `config.json` (`model_type` vela2-decoder, `backbone_config`, `head_dim`, `max_length`),
`calibration.json` (`temperature` {choice, score, set, span}, `thresholds` {"set:<id>" | "set:*"},
`broad_head` {temperature}), `tokenizer.json`, the shards of `model.safetensors.index.json` (`head.*`,
`set_bias`, `span2.*`) and, when present, `broad_head.safetensors` (`span_broad.*`).

Every question is one block after the state prefix (the state's typed parts as the packages read a System One
state, layout.state_parts) and reads every part; the rows backend runs prefix + block whole, so a block
sees the prefix and itself only, as the packages' tree does.
The question text is the instructions (canonical JSON when structured), or the recipe's default question
of its kind where this API lets instructions out (Vela's own reader requires them).
- choice: options + the abstain option; softmax over the real options' logits / T_choice.
- noul: the packages' two-option choice (no, yes) with abstain; P(yes) at T_choice, then the package's
  optional Noul fit (noul_fit.py) when its calibration.json turns it on (or `serving.options.noul_calibration`).
- score: levels as options, no abstain; softmax / T_score; score = sum(i p_i).
- set: the candidate head + set_bias, sigmoid(/ T_set) per label; selected: p > thresholds["set:*"] (the
  packages also read per-question "set:<id>" entries; a question type here does not see its id).
- span: Vela's span questions take labels and return labelled spans; our schema's span is one of the
  listed candidate substrings. Mapping (ours, not Vela's): one span block over the state with the single
  label ("answer", "") under the question's instructions; word probabilities sigmoid(logit / T) from the
  broad span head when the package ships one (the packages' dispatch for a label outside the router's
  sets), else the router head, each at its own temperature;
  a candidate's score is the mean probability of the words its first occurrence overlaps (the packages'
  span probability), normalised over the candidates.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.errors import UnreadableInput
from jev_common.schema import (
    ChoiceAnswer,
    NoulAnswer,
    ScoreAnswer,
    SetAnswer,
    Span,
    SpanAnswer,
    choice_answer,
    choice_confidence,
    score_answer,
)

from ...loading.checkpoint import Requirement
from ...prompt.builder import PreparedRequest, RowSpec, ids_key
from ...protocols import Backend, PromptBuilder, QuestionKind
from ...readouts.standard import StandardReadout
from .backend import VelaDecoder
from .heads import BROAD_SPAN, OPTIONS, ROUTER_SPAN, VelaHeads
from .layout import REPEAT_LIMIT, SPAN_ROLE, VelaLayout, content_text, span_text, state_parts, words_of
from .noul_fit import NoulFit

CONFIG, CALIBRATION, INDEX, BROAD_FILE, TOKENIZER = (
    "config.json",
    "calibration.json",
    "model.safetensors.index.json",
    "broad_head.safetensors",
    "tokenizer.json",
)
MEMBER = "vela2-decoder"
NOUL_NO = "No. The statement or question is not satisfied."
NOUL_YES = "Yes. The statement or question is satisfied."
SPAN_LABEL = ("answer", "")
MIN_PART_BUDGET = 64  # the packages' floor on what the parts may keep


@dataclass(frozen=True)
class VelaRow(RowSpec):
    ids: tuple[int, ...] = ()


class VelaBuilder(PromptBuilder):
    """Lays out a request as the packages do: the state prefix, then each question's block ids."""

    def __init__(self, tokenizer, recipe, identity: str):
        super().__init__(tokenizer, recipe, identity)
        self.layout = VelaLayout(self.encode)
        self.max_length: int | None = None  # the package's input budget, set by the readout at load

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        out = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return out["input_ids"], [tuple(o) for o in out["offset_mapping"]]

    def prepare(self, state_text: str, rows: list[VelaRow], image_keys=(), plan=None) -> PreparedRequest:
        state = plan.state if plan is not None else state_text
        parts = [(role, self.encode(text)) for role, text in state_parts(state)]  # each part tokenised once
        prefix = tuple(self.layout.prefix(parts))
        if self.max_length is not None:
            self._within_budget(parts, len(prefix), rows)
        return PreparedRequest(
            prefix_ids=prefix,
            rows=tuple(row.ids for row in rows),
            row_labels=tuple(row.labels for row in rows),
            image_keys=tuple(image_keys),
            prefix_key=ids_key(f"{self.identity}|vela|", prefix),
            plan=plan,
        )

    def _within_budget(self, parts: list[tuple[str, list[int]]], prefix_length: int, rows: list[VelaRow]) -> None:
        """The packages' budget (their decoder render, then `fit`): every option question and the first span
        question share one tree, each further span question has its own. Where it says the state must be cut,
        the cut is not served, so the request is refused rather than answered on a state the package would
        not read whole."""
        tokens = {role: len(ids) for role, ids in parts}
        overhead = prefix_length - sum(tokens.values())  # the parts' head and segment tags
        options = [row for row in rows if row.labels[0] == OPTIONS]
        spans = [row for row in rows if row.labels[0] != OPTIONS]
        for tree in [options + spans[:1]] + [[span] for span in spans[1:]]:
            extra, schema = overhead, 0
            for row in tree:
                if row.labels[0] == OPTIONS:  # 1 + the block + one per option (abstain included)
                    schema += 1 + len(row.ids) + len(row.labels) - 2
                    continue
                label = row.labels[4] - row.labels[3] + 1
                target = tokens[SPAN_ROLE]
                extra += len(row.ids) - label - target  # span head, text head, segment tags, suffix
                extra += min(target, max(0, self.max_length - extra) // 2)  # the repeat's allowance
                schema += 1 + label
            need = 3 + len(parts) + schema + sum(tokens.values())
            limit = max(MIN_PART_BUDGET, self.max_length - extra)
            if need > limit:
                raise ValueError(
                    f"the state and questions count {need} tokens against this model's budget of "
                    f"{limit} (max_length {self.max_length}); Vela 2.0 cuts the state to fit, which "
                    "is not served here: send a shorter state or fewer questions"
                )


def _roles(ctx) -> tuple[str, ...]:
    """The parts a question reads: every part of the state (the packages' default without `over`)."""
    return tuple(role for role, _ in state_parts(ctx.state))


def question_text(question, ctx, where: str) -> str:
    """The question text: its instructions (canonical JSON when structured), or the recipe's default
    question of that kind (Vela's own request reader requires instructions; this API does not)."""
    if question.instructions is None:
        return ctx.default_question(question.type)
    text = content_text(question.instructions)
    ctx.builder.check_user_text(text, f"{where}.instructions")
    if not text.strip():
        raise UnreadableInput(f"{where}.instructions must not be blank")
    return text


def noul_options(question, ctx, where: str) -> list[tuple[str, str]]:
    """Noul as Vela's two-option choice: ("no", false text), ("yes", true text), the packages' defaults if unset."""
    criteria = question.criteria
    no = NOUL_NO if criteria is None or criteria.false is None else content_text(criteria.false)
    yes = NOUL_YES if criteria is None or criteria.true is None else content_text(criteria.true)
    for text, side in ((no, "false"), (yes, "true")):
        ctx.builder.check_user_text(text, f"{where}.criteria.{side}")
    return [("no", no), ("yes", yes)]


def score_levels(question, ctx, where: str) -> list[tuple[str, str]]:
    """Score levels as Vela's options (name, no description); they must be distinct."""
    levels = []
    for i, level in enumerate(question.criteria):
        text = content_text(level)
        ctx.builder.check_user_text(text, f"{where}.criteria[{i}]")
        levels.append((text, ""))
    if len(set(levels)) != len(levels):
        raise UnreadableInput(f"{where}.criteria: Vela 2.0 needs distinct score levels")
    return levels


def described_options(question, ctx, where: str) -> list[tuple[str, str]]:
    options = []
    for name, description in question.criteria.items():
        ctx.builder.check_user_text(name, f"{where}.criteria")
        text = "" if description is None else content_text(description)
        ctx.builder.check_user_text(text, f"{where}.criteria[{name!r}]")
        options.append((name, text))
    return options


def _softmax(logits: torch.Tensor, temperature: float) -> list[float]:
    return torch.softmax(logits.to(torch.float32) / temperature, -1).tolist()


class _Options(QuestionKind):
    """A question answered by the candidate head over one options block: the packages' task type `block`, the
    question's options and, where `abstain`, the abstain option after them."""

    block: ClassVar[str]
    abstain: ClassVar[bool]

    def __init__(self, readout: VelaHeadsReadout):
        self.readout = readout

    @abstractmethod
    def options(self, question, ctx, where: str) -> list[tuple[str, str]]: ...

    def rows(self, question, ctx, where):
        text = question_text(question, ctx, where)
        block = ctx.builder.layout.options_block(
            self.block, _roles(ctx), text, self.options(question, ctx, where), self.abstain
        )
        return [VelaRow("", (OPTIONS, len(block.ids), *block.ends), ids=block.ids)]


class VelaChoice(_Options):
    type = "choice"
    block, abstain = "choice", True
    options = staticmethod(described_options)

    def answer(self, question, logits, ctx) -> ChoiceAnswer:
        names = list(question.criteria)
        probs = _softmax(logits[0][: len(names)], self.readout.temperature("choice"))
        return choice_answer(names, probs)


class VelaNoul(_Options):
    type = "noul"
    block, abstain = "choice", True  # the packages' two-option choice
    options = staticmethod(noul_options)

    def answer(self, question, logits, ctx) -> NoulAnswer:
        yes = _softmax(logits[0][:2], self.readout.temperature("choice"))[1]
        fit = self.readout.noul_fit
        return NoulAnswer(noul=yes if fit is None else fit.apply(yes))


class VelaScore(_Options):
    type = "score"
    block, abstain = "score", False
    options = staticmethod(score_levels)

    def answer(self, question, logits, ctx) -> ScoreAnswer:
        probs = _softmax(logits[0], self.readout.temperature("score"))
        return score_answer(question.criteria, probs)


class VelaSet(_Options):
    type = "set"
    block, abstain = "set", False
    options = staticmethod(described_options)

    def answer(self, question, logits, ctx) -> SetAnswer:
        readout = self.readout
        scores = torch.sigmoid((logits[0].to(torch.float32) + readout.set_bias()) / readout.temperature("set"))
        probs = dict(zip(question.criteria, scores.tolist()))
        threshold = readout.set_threshold()
        return SetAnswer(selected=[name for name, p in probs.items() if p > threshold], probabilities=probs)


class VelaSpan(QuestionKind):
    type = "span"
    position_free = True  # each candidate scored from the state's own word probabilities: no listing order

    def __init__(self, readout: VelaHeadsReadout):
        self.readout = readout

    def rows(self, question, ctx, where):
        state = span_text(ctx.state, where)
        text = question_text(question, ctx, where)
        for candidate in question.criteria:
            ctx.builder.check_user_text(candidate, f"{where}.criteria")
        ids, offsets = ctx.builder.encode_offsets(state)
        if len(ids) > REPEAT_LIMIT:
            raise UnreadableInput(
                f"{where}: the state is {len(ids)} tokens; Vela reads longer "
                f"span targets than {REPEAT_LIMIT} in windows, which is not served here"
            )
        words = words_of(state, offsets)
        block = ctx.builder.layout.span_block(SPAN_ROLE, text, [SPAN_LABEL], ids, words)
        labels = (self.readout.span_head(), len(block.ids), 1, *block.starts, *block.ends, *block.words)
        return [VelaRow("", labels, ids=block.ids)]

    def answer(self, question, logits, ctx) -> SpanAnswer:
        state = ctx.state
        ids, offsets = ctx.builder.encode_offsets(state)
        words = words_of(state, offsets)
        word_probs = torch.sigmoid(logits[0][:, 0].to(torch.float32) / self.readout.span_temperature())
        scores = []
        for candidate in question.criteria:
            start = state.index(candidate)
            end = start + len(candidate)
            inside = [i for i, (a, b) in enumerate(words.offsets) if a < end and b > start]
            scores.append(float(word_probs[inside].mean()) if inside else 0.0)
        total = sum(scores)
        probs = [s / total for s in scores] if total > 0 else [1.0 / len(scores)] * len(scores)
        best = max(range(len(probs)), key=probs.__getitem__)
        chosen = question.criteria[best]
        start = state.index(chosen)
        return SpanAnswer(
            span=Span(start=start, end=start + len(chosen), text=chosen),
            probabilities=dict(zip(question.criteria, probs)),
            confidence=choice_confidence(probs),
        )


class VelaHeadsReadout(StandardReadout):
    name = "vela-heads"
    question_types = frozenset({"choice", "noul", "score", "set", "span"})
    temperatures: dict[str, float] | None = None  # calibration.json's, once loaded
    thresholds: dict[str, float] | None = None
    broad_temperature: float | None = None
    noul_fit: NoulFit | None = None  # the package's optional Noul fit, when on

    def known_options(self) -> dict:
        return {"noul_calibration": None}  # None: as the package's calibration.json says

    def make_backend(self) -> Backend:
        return VelaDecoder()  # the package's backbone, built natively; each question block whole

    def prompt_builder(self, tokenizer, recipe, identity: str) -> VelaBuilder:
        return VelaBuilder(tokenizer, recipe, identity)

    def requirements(self) -> list[Requirement]:
        return [
            Requirement(CONFIG, ("model_type", "backbone_config", "head_dim", "max_length")),
            Requirement(CALIBRATION, ("temperature", "thresholds")),
            Requirement(TOKENIZER),
            Requirement(INDEX, ("weight_map",)),
        ]

    def check(self, folder: str) -> None:
        super().check(folder)
        member = read_json(os.path.join(folder, CONFIG)).get("model_type")
        if member != MEMBER:
            raise ServingError(
                f"readout {self.name!r} serves Vela 2.0's decoder packages ({CONFIG} model_type "
                f"{MEMBER!r}); this checkpoint's is {member!r}"
            )
        weight_map = read_json(os.path.join(folder, INDEX))["weight_map"]
        from .heads import CANDIDATE, HEAD, ROUTER, SET_BIAS, SPAN

        for name in [HEAD + n for n in CANDIDATE] + [SET_BIAS] + [ROUTER + n for n in SPAN]:
            if name not in weight_map:
                raise ServingError(f"readout {self.name!r}: {INDEX} maps no {name!r} (in {folder})")
            Requirement(weight_map[name], (name,)).check(folder, self.name)

    def load(self, loaded, builder) -> None:
        from safetensors import safe_open
        from safetensors.torch import load_file

        folder = loaded.folder
        config = read_json(os.path.join(folder, CONFIG))
        self._calibration(read_json(os.path.join(folder, CALIBRATION)))
        weight_map = read_json(os.path.join(folder, INDEX))["weight_map"]
        tensors = {}
        for name, shard in weight_map.items():
            if name.startswith(("head.", "span2.")) or name == "set_bias":
                with safe_open(os.path.join(folder, shard), framework="pt") as handle:
                    tensors[name] = handle.get_tensor(name)
        broad_path = os.path.join(folder, BROAD_FILE)
        broad = load_file(broad_path) if os.path.isfile(broad_path) else None
        hidden = int(config["backbone_config"]["hidden_size"])
        self.head = VelaHeads(tensors, hidden, "the model shards", broad)
        if self.head.candidate["key.weight"].shape[0] != int(config["head_dim"]):
            raise ServingError(
                f"{CONFIG}: head_dim {config['head_dim']} but head.key.weight is "
                f"{list(self.head.candidate['key.weight'].shape)}"
            )
        builder.max_length = int(config["max_length"])
        self.kinds = {
            kind.type: kind
            for kind in (VelaChoice(self), VelaNoul(self), VelaScore(self), VelaSet(self), VelaSpan(self))
        }

    def _calibration(self, calibration: dict) -> None:
        temperatures = calibration.get("temperature")
        needed = ("choice", "score", "set", "span")
        if not isinstance(temperatures, dict) or not all(
            isinstance(temperatures.get(t), (int, float)) and temperatures[t] > 0 for t in needed
        ):
            raise ServingError(f"{CALIBRATION}: temperature needs positive {', '.join(needed)}, got {temperatures!r}")
        self.temperatures = {t: float(temperatures[t]) for t in needed}
        self.thresholds = {k: float(v) for k, v in (calibration.get("thresholds") or {}).items()}
        broad = calibration.get("broad_head") or {}
        self.broad_temperature = float(broad.get("temperature", self.temperatures["span"]))
        self.noul_fit = NoulFit.read(calibration, self.option("noul_calibration"))

    def temperature(self, type_: str) -> float:
        return self.temperatures[type_]

    def set_threshold(self) -> float:
        return self.thresholds.get("set:*", 0.5)

    def set_bias(self) -> float:
        return self.head.set_bias

    def span_head(self) -> int:
        return BROAD_SPAN if BROAD_SPAN in self.head.spans else ROUTER_SPAN

    def span_temperature(self) -> float:
        return self.broad_temperature if BROAD_SPAN in self.head.spans else self.temperatures["span"]

    def describe(self) -> dict:
        calibration = None
        if self.temperatures is not None:
            calibration = {
                "source": CALIBRATION,
                "temperatures": dict(self.temperatures),
                "set_threshold": self.set_threshold(),
                "broad_span_temperature": self.broad_temperature,
                "noul_calibration": self.noul_fit.describe() if self.noul_fit else "off",
            }
        heads = sorted({ROUTER_SPAN: "router", BROAD_SPAN: "broad"}[k] for k in self.head.spans) if self.head else []
        return {
            "readout": self.name,
            "question_types": sorted(self.question_types),
            "calibration": calibration,
            "span_heads": heads,
        }
