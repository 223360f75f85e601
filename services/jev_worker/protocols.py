"""The worker's declared protocols: what a backend, an engine, a head, a prompt builder, a question type
and a readout are. Every implementation subclasses one of these, so what a piece is is stated where it is
written (no duck typing, no `getattr` plug points), and the pipeline calls only what is declared here.

    recipe.serving.family ──▶ Readout (families/registry.py)
                                 ├─ make_backend() ──▶ Backend ── load() ──▶ LoadedModel
                                 │                         └──── build() ──▶ Engine (runs batches of EngineItems)
                                 ├─ prompt_builder() ──▶ PromptBuilder (state + rows ──▶ PreparedRequest;
                                 │                        prefix_groups: which questions share one prefix)
                                 ├─ kinds: {type: QuestionKind} (rows of a question, its answer from logits)
                                 ├─ head: Head (a row's hidden state ──▶ FP32 logits)
                                 └─ single_question() ──▶ SingleQuestionForm (the `kind` form ──▶ Job, fields)
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from jev_common.checkpoint_files import ServingError

if TYPE_CHECKING:  # imported for annotations only: these modules import torch and transformers
    import torch
    from pydantic import BaseModel

    from jev_common.assets import ImageAsset
    from jev_common.recipe import Recipe
    from jev_common.schema import SystemOneRequest

    from .caches import BudgetLRU
    from .control_tokens import ControlTokens
    from .engine import EngineItem, EngineResult
    from .loader import LoadedModel
    from .pipeline import Job
    from .prompt import PreparedRequest, RowSpec
    from .questions.base import BuildContext
    from .readouts.calibration import Calibration


# ----- the network ------------------------------------------------------------------------------
class Engine(ABC):
    """Runs batches on the one model thread; owns the L3 prefix cache (a zero-budget one when it has none)."""

    l3: "BudgetLRU"

    @abstractmethod
    def run(self, items: list["EngineItem"]) -> list["EngineResult"]:
        """One result per item, in order: the FP32 logits of each of its rows (or answer rows)."""

    def calibrate(self) -> None:
        """Once at start-up, on the model thread: measure what the engine's choices depend on (default: none)."""

    def describe(self) -> dict:
        """What /health shows about the engine's paths (default: nothing)."""
        return {}


class Backend(ABC):
    """What runs the network: loads the checkpoint and builds the engine that runs batches of rows."""

    name: ClassVar[str]
    prefix_reuse: ClassVar[str]  # whether rows reuse the state prefix's KV (L3), or why not (stats, /health)

    def check(self, recipe: "Recipe") -> None:
        """Refuse a recipe this backend cannot run (raise ServingError)."""

    def load(self, recipe: "Recipe", folder: str, device: str, dtype: str, *, lm_head: bool) -> "LoadedModel":
        """The checkpoint in `folder` on `device` (already checked by the readout)."""
        from .loader import load_model

        return load_model(recipe, folder, device, dtype, lm_head=lm_head)

    def l3_bytes(self, configured: int) -> int:
        """The L3 budget this backend can use of the configured one (0: it reuses no prefix state)."""
        return configured

    @abstractmethod
    def build(self, loaded: "LoadedModel", *, head: "Head", l3: "BudgetLRU", batching: bool, max_batch_rows: int,
              pad_id: int, vision=None, graph_capture=None, reuse=None) -> Engine:
        """The engine that runs this checkpoint's batches; it fills `l3` (caches.WorkerCaches' L3, sized by
        `l3_bytes`) with prefix states. `graph_capture` (graphs.py) and `reuse` (reuse.ReusePolicy) are for
        engines that replay graphed forwards and choose per request whether an L3 hit pays; others ignore them."""

    def describe(self) -> dict:
        return {"backend": self.name, "prefix_reuse": self.prefix_reuse}


class ExternalBackend(Backend):
    """A backend whose network runs in another server: requests are posted there, nothing is loaded here."""

    def load(self, recipe, folder, device, dtype, *, lm_head):
        raise ServingError(f"backend {self.name!r} loads no local model")

    def build(self, loaded, **kwargs) -> Engine:
        raise ServingError(f"backend {self.name!r} runs no local model")

    @abstractmethod
    async def post(self, path: str, body: dict, timeout_s: float) -> dict:
        """The server's JSON answer (raise ExternalServerFailed / ExternalServerTimeout)."""

    @abstractmethod
    async def health(self) -> tuple[bool, object]:
        """(answering, its health body or why not)."""

    async def close(self) -> None:
        """Release connections."""


# ----- heads ------------------------------------------------------------------------------------
class Head(ABC):
    """A row's final hidden state(s) -> FP32 logits over that row's labels (a list when one sequence answers
    several questions)."""

    @abstractmethod
    def logits(self, hidden: "torch.Tensor", labels: tuple[int, ...]) -> "torch.Tensor | list[torch.Tensor]": ...


class RequestHead(ABC):
    """A head that answers a whole request from its one sequence (every position): one logits tensor per
    answer row, in the order the readout's prompt builder planned."""

    @abstractmethod
    def request_logits(self, hidden: "torch.Tensor", prepared: "PreparedRequest") -> list["torch.Tensor"]: ...


# ----- prompts ----------------------------------------------------------------------------------
class PromptBuilder(ABC):
    """A state and its question rows -> the exact token ids the model sees (a PreparedRequest).

    Every builder refuses user text holding one of the model's control tokens the same way (`controls`, by
    default the tokenizer's special tokens; a family may name others)."""

    # The family's own input limit in tokens (its upstream's documented cut), when it has one: the builder then
    # refuses (or cuts the state, as upstream does) past it, in upstream's words. None: the model's positions
    # bound the prompt (jev_worker.bounds).
    max_length: int | None = None
    # The family cuts an over-long input to fit, as its upstream does: nothing is refused by its length in
    # characters before tokenising (the schema's cap still holds), only the prepared prompt is checked.
    cuts_state: bool = False

    def __init__(self, tokenizer, recipe: "Recipe", identity: str, *, controls: "ControlTokens | None" = None):
        from .control_tokens import ControlTokens

        self.tokenizer = tokenizer
        self.recipe = recipe
        self.identity = identity  # the checkpoint's identity: every prefix key hashes it
        self.controls = controls if controls is not None else ControlTokens.of(tokenizer)

    def check_user_text(self, text: str, where: str) -> None:
        """Refuse text the model's layout cannot carry (raise UnreadableInput naming `where`)."""
        self.controls.check(text, where)

    def check_image(self, asset: "ImageAsset", where: str) -> None:
        """Refuse a prepared image the model's contract does not read (its asset's grid and the image facts the
        preencoder recorded: a domain error naming `where`); by default every prepared image is read."""

    @abstractmethod
    def prepare(self, state_text: str, rows: list["RowSpec"], image_keys: tuple[str, ...] = (),
                plan: object = None) -> "PreparedRequest":
        """The prefix (what L3 caches) and rows; `state_text` may hold image placeholders already."""

    def prefix_groups(self, questions: dict) -> list[dict]:
        """A request's questions (id -> question) in groups whose rows share one prompt prefix; each group is
        prepared and run as its own sequence. One group by default (every row follows the shared state
        prefix); a layout that writes question text before the state splits them, so that each group's
        prefix still holds the state and its images."""
        return [questions]


class QuestionKind(ABC):
    """One System One question type: its rows after the state prefix, and its answer from their logits."""

    type: ClassVar[str]

    @abstractmethod
    def rows(self, question, ctx: "BuildContext", where: str) -> list["RowSpec"]: ...

    @abstractmethod
    def answer(self, question, logits: list["torch.Tensor"], ctx: "BuildContext") -> "BaseModel": ...


# ----- the single-question form ----------------------------------------------------------------
class SingleQuestionForm(ABC):
    """How a family answers the single-question form (`kind`, `state`, `question`, `options`): the job that
    asks it (one question, under legacy.QID) and the form's response fields from that question's answer."""

    @abstractmethod
    def job(self, request, image_key: Callable[[str], str] | None) -> "Job":
        """The request as a Job; `image_key(data_uri)` names an image's asset (None: no image store)."""

    @abstractmethod
    def fields(self, request, answer) -> dict:
        """DecisionResponse's `probabilities`, `choice_index`, `choice` and kind-specific fields."""


# ----- readouts ---------------------------------------------------------------------------------
def _no_calibration() -> "Calibration":
    from .readouts.calibration import Calibration  # imports torch: not at this module's import

    return Calibration()


@dataclass
class Readout(ABC):
    """What a family reads: its checkpoint requirements, backend, prompt builder, head and question types.

    A family's readout is one class registered under the family's name (families/registry.py); the recipe
    names the family (`serving.family`) and the readout says which backend runs it (`make_backend`).
    """

    options: dict = field(default_factory=dict)
    name: ClassVar[str] = "readout"
    question_types: ClassVar[frozenset[str]] = frozenset()
    needs_lm_head: ClassVar[bool] = False          # load the checkpoint with its LM head (AutoModelForCausalLM)
    single_question_form: ClassVar[bool] = False   # answers the JEV-VL `kind` form too (label-token rows only)
    head: "Head | RequestHead | None" = None
    calibration: "Calibration" = field(default_factory=_no_calibration)
    kinds: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(self.known_options()))
        if unknown:
            raise ServingError(f"readout {self.name!r} has no option(s) {', '.join(unknown)}; "
                               f"known: {', '.join(sorted(self.known_options())) or 'none'}")

    def known_options(self) -> dict:
        """Option name -> default, for the recipe's `serving.options`."""
        return {}

    def option(self, key: str):
        return self.options.get(key, self.known_options()[key])

    def warmup_request(self, request: "SystemOneRequest") -> "SystemOneRequest | None":
        """The decision that warms the worker up before /health says ok, from the worker's own (`request`): by
        default its questions of the types this readout answers; None when the readout's contract answers no
        request without the caller's data (e.g. a screenshot as the whole state): ready once loaded."""
        questions = {qid: q for qid, q in request.questions.items() if q.type in self.question_types}
        return request.model_copy(update={"questions": questions})

    # what runs it
    def make_backend(self) -> Backend:
        """The backend that runs this readout's checkpoint; called after `check` (it may depend on it)."""
        from .backends.registry import build_backend

        return build_backend("causal-lm")

    def prompt_builder(self, tokenizer, recipe: "Recipe", identity: str) -> PromptBuilder:
        from .prompt import ChatPromptBuilder

        return ChatPromptBuilder(tokenizer, recipe, identity)

    # the request forms
    def single_question(self, recipe: "Recipe") -> SingleQuestionForm:
        """How this family asks a request of the single-question form (answered only when
        `single_question_form`): by default as the System One question it is (legacy.QuestionForm)."""
        from .legacy import QuestionForm

        return QuestionForm(recipe.verbalizer.noul_option)

    def envelope_state(self, request) -> str:
        """A System One request's state as this family's prompt writes it, asset references still in place
        (the envelope puts its images there): text as sent, objects and arrays as JSON text by default."""
        from jev_common.state_text import render_state

        return render_state(request.state)

    # the checkpoint
    def requirements(self) -> list:
        """Files (and keys in them) the checkpoint folder must hold (readouts.base.Requirement)."""
        return []

    def check(self, folder: str) -> None:
        for requirement in self.requirements():
            requirement.check(folder, self.name)

    @abstractmethod
    def load(self, loaded: "LoadedModel", builder: PromptBuilder) -> None:
        """Build the head and the question types answered (`serve`)."""

    def serve(self, kinds: list, calibration: "Calibration") -> None:
        """Answer `kinds` (question-type objects), each calibrated; called at the end of `load`."""
        from .readouts.calibration import CalibratedKind

        self.calibration = calibration
        self.kinds = {kind.type: CalibratedKind(kind, calibration) for kind in kinds}
        assert set(self.kinds) == set(self.question_types), (self.name, sorted(self.kinds))

    def describe(self) -> dict:
        return {"readout": self.name, "question_types": sorted(self.question_types),
                "calibration": self.calibration.describe()}


class ExternalReadout(Readout):
    """A readout for an external backend: translates a System One request to the server's body and its
    answer back; nothing is loaded here."""

    def load(self, loaded, builder) -> None:
        raise ServingError(f"readout {self.name!r} loads no local model")

    @abstractmethod
    def request_body(self, request) -> dict: ...

    @abstractmethod
    def answers(self, request, raw: dict) -> tuple[dict, object]:
        """(answers by question id, usage) from the server's JSON answer."""
