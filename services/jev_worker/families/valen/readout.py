"""valen-head: Valen-Preview-0923's learned decision head (Liuziyu77/Valen `valen/modeling/qwen/model.py`) over
the Valen compiler's input (`valen/data/compilers/qwen.py`), on backend `valen-lora` (its checkpoint layout:
families/valen/checkpoint.py).

Sequence of one branch, token ids laid end to end:
  state:  the base's chat template over one user message, no generation prompt, tokenised in one pass
          (the state prefix): its content is the state's text, and where the state names an image an
          {"type": "image"} item (Valen's `messages` state form), each image then expanded to its embedding
          rows as the processor does. Image embeddings are the preencoder's, made with Valen's trained vision
          blocks and merger (jev_preencoder/vision_models.py);
  then each piece tokenised alone, without special tokens:
          "<|im_start|>user\\n", "Task: {type}\\nQuestion: {instructions}\\nCandidates:\\n",
          for every candidate of the branch "{name}: {description}" (score: "{description}" alone; its last
          token is the candidate's position) and "\\n", and finally "Decision:" (its last token is the
          decision position).
Branches per question type, as the compiler builds them from `valen/data/schema.py` `candidates`:
- choice: one branch, the options in request order; a null description is the option's name, as the public
  reference worker does.
- noul: one branch with Valen's two fixed candidates ("true", "True / 是：满足问题中的条件。") and ("false",
  "False / 否：不满足问题中的条件。"); the request's true/false descriptions are not shown (the compiler
  never reads them); noul = P(true).
- score: one branch per level, each seeing only its own description (never its index nor another level);
  the levels' logits, one per branch, form one softmax; score = sum(i p_i), legend {i: level}.
Missing instructions are the recipe's default question of the type. A branch may not exceed the checkpoint's
`max_length` (no truncation).

Head (FP32): d = W_decision h[decision], c_k = W_candidate h[option k], logit_k = (c_k . d) / sqrt(projection_dim)
over the backbone's final (normed) hidden states; p = softmax(logits / T) with T = 1, as Valen's inference
does when no calibration file is given (none ships with the checkpoint); confidence is Valen's
(max p - 1/K) / (1 - 1/K) for choice, 1 - E|i - mode| / (the same under a uniform answer) for score. Set and
span have no head here (422).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from jev_common.checkpoint_files import ServingError
from jev_common.control_tokens import ControlTokens
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

from ...loading.checkpoint import Requirement
from ...loading.vision import IMAGE_ITEM, PLACED_IMAGE
from ...prompt.builder import PreparedRequest, ids_key
from ...protocols import Backend, Head, PromptBuilder, QuestionKind
from ...questions.base import BuildContext
from ...readouts.standard import StandardReadout
from .backend import ValenLora
from .checkpoint import CHECKPOINT, CONFIG, forget_checkpoint, read_checkpoint

TEMPERATURE = 1.0
MEDIA_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")
NOUL_CANDIDATES = (("true", "True / 是：满足问题中的条件。"), ("false", "False / 否：不满足问题中的条件。"))


@dataclass(frozen=True)
class ValenRow:
    """One branch: its task type, the instructions and the (name, description) candidates in order; `keyed`
    shows each candidate as "name: description" (score shows the description alone)."""

    task: str
    instructions: str
    options: tuple[tuple[str, str], ...]
    keyed: bool = True


class ValenPromptBuilder(PromptBuilder):
    """Lays each question out as the Valen compiler does: the row's labels are its option positions
    (indices into state + row); the decision position is the row's last token. Its control tokens are the
    tokenizer's special tokens and the media tokens, as Valen's compiler refuses them in user text."""

    def __init__(self, tokenizer, recipe, identity: str):
        super().__init__(
            tokenizer,
            recipe,
            identity,
            controls=ControlTokens.of(
                tokenizer, extra=MEDIA_TOKENS, hint="Valen's compiler refuses it in user text, remove it"
            ),
        )
        self.template = tokenizer  # the processor, once the readout has loaded (its chat template)
        self.max_length: int | None = None

    def _piece(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def state_ids(self, state_text: str) -> list[int]:
        """`state_text` holds each image as its expanded placeholder (the service put it there): the message
        gets an image item in its place, and the rendered item is expanded back, in order."""
        content, images, at = [], [], 0
        for match in PLACED_IMAGE.finditer(state_text):
            if match.start() > at:
                content.append({"type": "text", "text": state_text[at : match.start()]})
            content.append({"type": "image"})
            images.append(match.group(0))
            at = match.end()
        if at < len(state_text) or not content:
            content.append({"type": "text", "text": state_text[at:]})
        text = self.template.apply_chat_template(
            [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=False
        )
        pieces = text.split(IMAGE_ITEM)
        if len(pieces) != len(images) + 1:
            raise ValueError(f"the chat template rendered {len(pieces) - 1} image items for {len(images)} images")
        text = pieces[0] + "".join(image + piece for image, piece in zip(images, pieces[1:]))
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def branch(self, row: ValenRow, start: int) -> tuple[list[int], list[int]]:
        ids = self._piece("<|im_start|>user\n")
        ids += self._piece(f"Task: {row.task}\nQuestion: {row.instructions}\nCandidates:\n")
        positions = []
        for name, description in row.options:
            ids += self._piece(f"{name}: {description}" if row.keyed else description)
            positions.append(start + len(ids) - 1)
            ids += self._piece("\n")
        ids += self._piece("Decision:")
        return ids, positions

    def prepare(
        self, state_text: str, rows: list[ValenRow], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        prefix = self.state_ids(state_text)
        branches, labels = [], []
        for row in rows:
            ids, positions = self.branch(row, len(prefix))
            length = len(prefix) + len(ids)
            if self.max_length is not None and length > self.max_length:
                raise ValueError(
                    f"a question's branch is {length} tokens; this checkpoint's max_length is "
                    f"{self.max_length} (Valen does not truncate)"
                )
            branches.append(tuple(ids))
            labels.append(tuple(positions))
        return PreparedRequest(
            prefix_ids=tuple(prefix),
            rows=tuple(branches),
            row_labels=tuple(labels),
            image_keys=tuple(image_keys),
            prefix_key=ids_key(f"{self.identity}|valen|{','.join(image_keys)}|", prefix),
            plan=plan,
        )


class BilinearHead(Head):
    """Valen's DecisionHead in FP32 over one branch's hidden states [length, hidden]."""

    def __init__(self, decision: torch.Tensor, candidate: torch.Tensor, device):
        self.decision = decision.to(device, torch.float32)
        self.candidate = candidate.to(device, torch.float32)
        self.scale = math.sqrt(decision.shape[0])

    def logits(self, hidden: torch.Tensor, positions: tuple[int, ...]) -> torch.Tensor:
        d = self.decision @ hidden[-1].float()
        c = hidden[list(positions)].float() @ self.candidate.T
        return ((c * d).sum(-1) / self.scale).cpu()


def _instructions(question, ctx: BuildContext, where: str) -> str:
    instructions = ctx.instructions(question, where)
    if not instructions.strip():
        raise UnreadableInput(f"{where}.instructions is blank; Valen needs a question")
    return instructions


def _described(text: str, where: str) -> str:
    if not text.strip():
        raise UnreadableInput(f"{where}: option names and descriptions must not be blank for Valen")
    return text


def _softmax(logits: torch.Tensor) -> list[float]:
    probs = torch.softmax(logits.to(torch.float32) / TEMPERATURE, -1).tolist()
    total = sum(probs)
    return [p / total for p in probs]


class ValenChoice(QuestionKind):
    type = "choice"
    min_options = 1  # valen/data/schema.py `candidates`: "Choice needs 1–255 named criteria"

    def rows(self, question: ChoiceQuestion, ctx: BuildContext, where: str) -> list[ValenRow]:
        instructions = _instructions(question, ctx, where)
        options = []
        for name, description in question.criteria.items():
            ctx.builder.check_user_text(name, f"{where}.criteria")
            text = name if description is None else ctx.user_text(description, f"{where}.criteria[{name!r}]")
            _described(name, f"{where}.criteria[{name!r}]")
            options.append((name, _described(text, f"{where}.criteria[{name!r}]")))
        return [ValenRow("choice", instructions, tuple(options))]

    def answer(self, question: ChoiceQuestion, logits: list[torch.Tensor], ctx: BuildContext) -> ChoiceAnswer:
        probs = _softmax(logits[0])
        names = list(question.criteria)
        return choice_answer(names, probs)


class ValenNoul(QuestionKind):
    type = "noul"

    def rows(self, question: NoulQuestion, ctx: BuildContext, where: str) -> list[ValenRow]:
        return [ValenRow("noul", _instructions(question, ctx, where), NOUL_CANDIDATES)]

    def answer(self, question: NoulQuestion, logits: list[torch.Tensor], ctx: BuildContext) -> NoulAnswer:
        return NoulAnswer(noul=_softmax(logits[0])[0])  # P("true"), the first candidate


class ValenScore(QuestionKind):
    type = "score"
    position_free = True  # a branch per level, seeing only its own description: no listing order to correct

    def rows(self, question: ScoreQuestion, ctx: BuildContext, where: str) -> list[ValenRow]:
        instructions = _instructions(question, ctx, where)
        rows = []
        for i, level in enumerate(question.criteria):
            text = _described(ctx.user_text(level, f"{where}.criteria[{i}]"), f"{where}.criteria[{i}]")
            rows.append(ValenRow("score", instructions, ((str(i), text),), keyed=False))
        return rows

    def answer(self, question: ScoreQuestion, logits: list[torch.Tensor], ctx: BuildContext) -> ScoreAnswer:
        probs = _softmax(torch.cat([branch.reshape(-1) for branch in logits]))
        return score_answer(question.criteria, probs)


class ValenHeadReadout(StandardReadout):
    name = "valen-head"
    question_types = frozenset({"choice", "noul", "score"})
    stage: str | None = None  # the checkpoint's training stage, once loaded
    projection_dim: int | None = None
    base: dict | None = None  # the base manifest's repo and revision

    def make_backend(self) -> Backend:
        return ValenLora()  # the base the checkpoint names, its deltas merged; each branch whole

    def prompt_builder(self, tokenizer, recipe, identity: str) -> ValenPromptBuilder:
        return ValenPromptBuilder(tokenizer, recipe, identity)

    def known_options(self) -> dict:
        return {"base_path": None}

    def requirements(self) -> list[Requirement]:
        return [Requirement(CHECKPOINT), Requirement(CONFIG)]

    def check(self, folder: str) -> None:
        super().check(folder)
        read_checkpoint(folder)  # names whatever checkpoint.pt / config.json lack (and refuses code pickles)

    def load(self, loaded, builder) -> None:
        checkpoint = read_checkpoint(loaded.folder)
        hidden = int(loaded.model.config.get_text_config().hidden_size)
        decision, candidate = checkpoint.head
        if decision.shape[1] != hidden:
            raise ServingError(
                f"{CHECKPOINT}: the decision head reads {decision.shape[1]}-wide hidden states; the base's are {hidden}"
            )
        self.head = BilinearHead(decision, candidate, loaded.device)
        self.projection_dim = int(decision.shape[0])
        self.stage, self.base = checkpoint.config["stage"], dict(checkpoint.base)
        builder.template = loaded.processor or loaded.tokenizer
        builder.max_length = checkpoint.max_length
        self.kinds = {kind.type: kind for kind in (ValenChoice(), ValenNoul(), ValenScore())}
        forget_checkpoint()  # the deltas are in the model and the head holds its own copy

    def describe(self) -> dict:
        described = {
            "readout": self.name,
            "question_types": sorted(self.question_types),
            "calibration": {"temperature": TEMPERATURE, "source": "none shipped: Valen's softmax at temperature 1"},
        }
        if self.stage is not None:
            described.update(
                stage=self.stage,
                projection_dim=self.projection_dim,
                base=f"{self.base['repo']}@{self.base['revision']}",
            )
        return described
