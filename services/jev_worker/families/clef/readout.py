"""clef-joint-head: Cloudflare Clef / Clef-flash, every question of a request decided jointly (backend
`causal-lm-joint`).

Checkpoint (Cloudflare/clef, Cloudflare/clef-flash): the merged Qwen3_5ForConditionalGeneration backbone
with its LM head, `joint_head.safetensors` and `joint_head_config.json` ({hidden_size, width,
routing_layers, layers, heads, feedforward}). The checkpoint's `joint_schema_model.py` is never imported:
the head's tensors are read with safetensors into our own FP32 computation (head.py).

The request is one sequence (layout.py); the backbone runs once over it (no cache) and the head
gives each question one logit per option; a softmax over a question's options is its answer: noul =
P(`true`), choice = its options' probabilities (reported in the request's order), score = over the
levels, score = sum(i * p_i). span and set have no head here: 422. Images: preencoded by the checkpoint's own
vision tower, placed after the prefix as `encode_record` places them (layout.py).
Options (recipe `serving.options`): `max_length` (16384, encode_record's default), `max_state_tokens`.
"""

from __future__ import annotations

import os

import torch

from jev_common.checkpoint_files import ServingError, read_json
from jev_common.schema import ChoiceAnswer, NoulAnswer, ScoreAnswer, choice_answer, score_answer

from ...backends.joint import CausalJoint
from ...loading.checkpoint import Requirement
from ...prompt.builder import RowSpec
from ...protocols import Backend, QuestionKind
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout
from .head import CONFIG_KEYS, NORMS, PROJECTIONS, SCALARS, ClefJointHead, tensor_shapes
from .layout import TEMPLATE_TOKENS, ClefBuilder

HEAD = "joint_head.safetensors"
CONFIG = "joint_head_config.json"


class _ClefKind(QuestionKind):
    """One answer row per question (a placeholder: the request is laid out whole by ClefBuilder)."""

    def rows(self, question, ctx: BuildContext, where: str) -> list[RowSpec]:
        if question.instructions is not None:
            ctx.user_text(question.instructions, f"{where}.instructions")
        for key, value in self.described(question):
            ctx.builder.check_user_text(key, f"{where}.criteria")
            if value is not None:
                ctx.user_text(value, f"{where}.criteria[{key!r}]")
        return [RowSpec("", ())]

    def described(self, question) -> list[tuple[str, object]]:
        return []

    @staticmethod
    def probabilities(logits) -> list[float]:
        return torch.softmax(logits[0].to(torch.float32), dim=-1).tolist()


class ClefNoul(_ClefKind):
    type = "noul"

    def described(self, question):
        criteria = question.criteria
        return [] if criteria is None else [("true", criteria.true), ("false", criteria.false)]

    def answer(self, question, logits, ctx) -> NoulAnswer:
        return NoulAnswer(noul=self.probabilities(logits)[0])  # options are (true, false)


class ClefChoice(_ClefKind):
    type = "choice"

    def described(self, question):
        return list(question.criteria.items())

    def answer(self, question, logits, ctx) -> ChoiceAnswer:
        by_name = dict(zip(sorted(question.criteria), self.probabilities(logits)))
        names = list(question.criteria)
        probs = [by_name[name] for name in names]
        return choice_answer(names, probs)


class ClefScore(_ClefKind):
    type = "score"

    def described(self, question):
        return [(str(i), level) for i, level in enumerate(question.criteria)]

    def answer(self, question, logits, ctx) -> ScoreAnswer:
        probs = self.probabilities(logits)
        return score_answer(question.criteria, probs)


class ClefJointReadout(StandardReadout):
    name = "clef-joint-head"
    question_types = frozenset({"noul", "choice", "score"})
    needs_lm_head = True
    config: dict | None = None  # joint_head_config.json, once loaded

    def make_backend(self) -> Backend:
        return CausalJoint()  # one sequence per request, read whole by the joint head

    def prompt_builder(self, tokenizer, recipe, identity: str) -> ClefBuilder:
        return ClefBuilder(tokenizer, recipe, identity)

    def known_options(self) -> dict:
        return {"max_length": ClefBuilder.max_length, "max_state_tokens": None}

    def requirements(self) -> list[Requirement]:
        static = SCALARS + tuple(f"{n}.weight" for n in PROJECTIONS + NORMS) + ("type_embedding.weight",)
        return [Requirement(HEAD, static), Requirement(CONFIG, CONFIG_KEYS)]

    def _config(self, folder: str) -> dict:
        raw = read_json(os.path.join(folder, CONFIG))
        config = {key: raw.get(key) for key in CONFIG_KEYS}
        bad = [
            k
            for k, v in config.items()
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if "layers" in k else 1)
        ]
        if bad or config["width"] % config["heads"]:
            raise ServingError(
                f"{CONFIG}: {', '.join(bad) or 'width'} must be positive integers (width a multiple of "
                f"heads), got {config}"
            )
        return config

    def _tensors(self, folder: str, config: dict, device) -> dict[str, torch.Tensor]:
        from safetensors.torch import load_file

        tensors = load_file(os.path.join(folder, HEAD))
        want = tensor_shapes(config)
        missing = sorted(set(want) - set(tensors))
        if missing:
            raise ServingError(
                f"{HEAD} has no {', '.join(map(repr, missing[:5]))}"
                f"{f' (and {len(missing) - 5} more)' if len(missing) > 5 else ''} for {CONFIG} {config}"
            )
        wrong = [f"{k} {tuple(tensors[k].shape)} (want {want[k]})" for k in want if tuple(tensors[k].shape) != want[k]]
        if wrong:
            raise ServingError(f"{HEAD}: shapes do not fit {CONFIG}: {'; '.join(wrong[:5])}")
        return {k: tensors[k].to(device, torch.float32) for k in want}

    def load(self, loaded, builder) -> None:
        config = self._config(loaded.folder)
        hidden = int(loaded.model.config.get_text_config().hidden_size)
        if config["hidden_size"] != hidden:
            raise ServingError(f"{CONFIG}: hidden_size {config['hidden_size']} but the backbone's is {hidden}")
        for token in TEMPLATE_TOKENS:  # Clef's prompt is typed as text: its control tokens must parse as one each
            ids = builder.tokenizer(token, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ServingError(f"the tokenizer makes Clef's template token {token!r} {len(ids)} tokens, not one")
        lm_head = loaded.model.get_output_embeddings().weight.detach()
        for key in ("max_length", "max_state_tokens"):
            value = self.option(key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ServingError(
                    f"readout {self.name!r}: serving.options.{key} must be a positive integer, got {value!r}"
                )
        builder.max_length, builder.max_state_tokens = self.option("max_length"), self.option("max_state_tokens")
        self.config = config
        self.head = ClefJointHead(self._tensors(loaded.folder, config, loaded.device), config, lm_head)
        self.kinds = {kind.type: kind for kind in (ClefNoul(), ClefChoice(), ClefScore())}

    def describe(self) -> dict:
        return {
            "readout": self.name,
            "question_types": sorted(self.question_types),
            "calibration": None,
            "joint_head": self.config,
            "max_length": self.option("max_length"),
        }
