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
from typing import TYPE_CHECKING, Any, ClassVar

from jev_common.checkpoint_files import ServingError
from jev_common.control_tokens import ControlTokens
from jev_common.recipe import PromptSpec
from jev_common.state_text import render_state

from .values.datatypes import (
    BatchOutput,
    Calibration,
    EngineItem,
    Job,
    LoadedModel,
    Match,
    PrefixGroup,
    PrefixState,
    PreparedRequest,
    RowSpec,
)

if TYPE_CHECKING:  # imported for annotations only
    from collections.abc import Callable

    import torch
    from pydantic import BaseModel

    from jev_common.assets import ImageAsset
    from jev_common.recipe import Recipe
    from jev_common.schema import SystemOneRequest


# ----- the network ------------------------------------------------------------------------------
class PrefixCache(ABC):
    """Prefix states by prefix key (L3), owned by the scheduler (prefix_cache.py)."""

    @abstractmethod
    def match(self, key: str, reusable: bool = True) -> Match:
        """The state to start from, or why none: hit | miss | bypass | off."""

    @abstractmethod
    def insert(self, key: str, state: PrefixState) -> bool: ...

    @abstractmethod
    def evict(self, key: str) -> None: ...

    @abstractmethod
    def resident(self, key: str) -> bool:
        """Whether `key` has a state, without counting a lookup or refreshing it (for ordering the queue)."""

    @property
    @abstractmethod
    def size(self) -> int: ...


class ForwardAdapter(ABC):
    """What differs by architecture in a forward, chosen by the backend (adapters.py): positions, the prefix's
    inputs (token ids, or spliced image embeddings), the attention mask of whole rows, which positions the head
    reads, and what the runner may do with it (declared, never detected)."""

    causal: ClassVar[bool] = True  # a position sees only earlier ones: prefill may run in chunks
    graph_capturable: ClassVar[bool] = True  # static-buffer graph replay (graphs.py) computes the same forward
    reuses_prefix: ClassVar[bool] = True  # rows may continue a prefix state (L3, shared-prefix branching)
    packs: ClassVar[bool] = True  # rows may run packed end to end under a block mask
    reads: ClassVar[str] = "last"  # the head reads: last | row (every position of a row) | sequence

    @abstractmethod
    def positions(self, start: int, length: int, batch: int, rope_delta: int, device: Any) -> torch.Tensor: ...

    @abstractmethod
    def prefix_inputs(self, model: Any, ids: torch.Tensor, assets: list[Any]) -> tuple[dict[str, Any], int]:
        """The prefix's forward inputs (ids, or embeddings with images spliced) and its rope delta."""

    def whole_mask(self, lengths: torch.Tensor, width: int, dtype: Any) -> torch.Tensor | None:
        """The attention mask of right-padded whole rows (None: causal attention hides the padding)."""
        return None


class Engine(ABC):
    """Runs formed batches on the one model thread: the scheduler matched each group's prefix in its cache."""

    # rows can continue a prefix state (known once the runner has seen the model's cache); False: no L3
    reuses_prefix: bool = False

    @abstractmethod
    def run(self, items: list[EngineItem], groups: list[PrefixGroup]) -> BatchOutput:
        """One result per item, in order (the FP32 logits of each of its rows), and the prefix states computed
        for groups whose cache lookup missed."""

    def measure_reuse(self) -> object | None:
        """Once at start-up, on the model thread: the measured costs the reuse policy decides with (reuse.py's
        ReuseCosts), or None."""
        return None

    def describe(self) -> dict[str, Any]:
        """What /health shows about the engine's paths (default: nothing)."""
        return {}


class Backend(ABC):
    """What runs the network: loads the checkpoint and builds the engine that runs batches of rows."""

    name: ClassVar[str]
    prefix_reuse: ClassVar[str]  # whether rows reuse the state prefix's KV (L3), or why not (stats, /health)

    def check(self, recipe: Recipe) -> None:  # noqa: B027 - a hook: by default a backend runs every recipe
        """Refuse a recipe this backend cannot run (raise ServingError)."""

    @abstractmethod
    def load(self, recipe: Recipe, folder: str, device: str, dtype: str, *, lm_head: bool) -> LoadedModel:
        """The checkpoint in `folder` on `device` (already checked by the readout)."""

    def l3_bytes(self, configured: int) -> int:
        """The L3 budget this backend can use of the configured one (0: it reuses no prefix state)."""
        return configured

    @abstractmethod
    def build(
        self,
        loaded: LoadedModel,
        *,
        head: Head | RequestHead | None,
        batching: bool,
        max_batch_rows: int,
        pad_id: int,
        vision: Any = None,
        graph_capture: Any = None,
        kv_budget_bytes: int = 0,
        prefill_chunk: int = 0,
        pack_tokens: int = 0,
        simulated: Any = None,
    ) -> Engine:
        """The engine that runs this checkpoint's batches. `graph_capture` (graphs.py) and `kv_budget_bytes` (the
        L3 budget, the most prefix KV a graph's pool holds) are for engines that replay graphed forwards;
        `prefill_chunk` (JEV_PREFILL_CHUNK_TOKENS) for those that prefill causal sequences in chunks;
        `pack_tokens` (JEV_PACK_TOKENS) for those that pack rows after prefix states into one forward;
        `simulated` (engine/simulated.py Shapes, benchmarks only) for the runner, whose forwards it replaces."""

    def describe(self) -> dict[str, Any]:
        return {"backend": self.name, "prefix_reuse": self.prefix_reuse}


class ExternalBackend(Backend):
    """A backend whose network runs in another server: requests are posted there, nothing is loaded here."""

    endpoint: str | None = None  # the server's base URL

    def load(self, recipe: Recipe, folder: str, device: str, dtype: str, *, lm_head: bool) -> LoadedModel:
        raise ServingError(f"backend {self.name!r} loads no local model")

    def build(self, loaded: LoadedModel, **kwargs: Any) -> Engine:
        raise ServingError(f"backend {self.name!r} runs no local model")

    @abstractmethod
    async def post(self, path: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
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
    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor | list[torch.Tensor]: ...


class RequestHead(ABC):
    """A head that answers a whole request from its one sequence (every position): one logits tensor per
    answer row, in the order the readout's prompt builder planned."""

    @abstractmethod
    def request_logits(self, hidden: torch.Tensor, prepared: PreparedRequest) -> list[torch.Tensor]: ...


# ----- prompts ----------------------------------------------------------------------------------
class PromptBuilder(ABC):
    """A state and its question rows -> the exact token ids the model sees (a PreparedRequest).

    Every builder refuses user text holding one of the model's control tokens the same way (`controls`, by
    default the tokenizer's special tokens; a family may name others)."""

    # The family's own input limit in tokens (its upstream's documented cut), when it has one: the builder then
    # refuses (or cuts the state, as upstream does) past it, in upstream's words. None: the model's positions
    # bound the prompt (jev_worker.prompt.bounds).
    max_length: int | None = None
    # The family cuts an over-long input to fit, as its upstream does: nothing is refused by its length in
    # characters before tokenising (the schema's cap still holds), only the prepared prompt is checked.
    cuts_state: bool = False

    def __init__(self, tokenizer: Any, recipe: Recipe, identity: str, *, controls: ControlTokens | None = None) -> None:
        from jev_common.control_tokens import ControlTokens

        self.tokenizer = tokenizer
        self.recipe = recipe
        self.identity = identity  # the checkpoint's identity: every prefix key hashes it
        self.controls = controls if controls is not None else ControlTokens.of(tokenizer)

    def check_user_text(self, text: str, where: str) -> None:
        """Refuse text the model's layout cannot carry (raise UnreadableInput naming `where`)."""
        self.controls.check(text, where)

    def check_image(self, asset: ImageAsset, where: str) -> None:  # noqa: B027 - a hook with a default
        """Refuse a prepared image the model's contract does not read (its asset's grid and the image facts the
        preencoder recorded: a domain error naming `where`); by default every prepared image is read."""

    @abstractmethod
    def prepare(
        self, state_text: str, rows: list[RowSpec], image_keys: tuple[str, ...] = (), plan: object = None
    ) -> PreparedRequest:
        """The prefix (what L3 caches) and rows; `state_text` may hold image placeholders already."""

    def prefix_groups(self, questions: dict[str, Any]) -> list[dict[str, Any]]:
        """A request's questions (id -> question) in groups whose rows share one prompt prefix; each group is
        prepared and run as its own sequence. One group by default (every row follows the shared state
        prefix); a layout that writes question text before the state splits them, so that each group's
        prefix still holds the state and its images."""
        return [questions]


@dataclass(frozen=True)
class BuildContext:
    builder: PromptBuilder
    state: object  # the request's state as sent (span questions locate candidates in it)
    plan: object = None  # when answering: the prepared request's plan (a readout's own, e.g. its image count)
    coherence: str = "off"  # the request's x_coherence: how a kind that offers it lays out and reads its rows

    @property
    def prompt(self) -> PromptSpec:
        return self.builder.recipe.prompt

    def default_question(self, type_: str) -> str:
        """The recipe's question for a question of `type_` sent without instructions (span and set read as
        choice and noul)."""
        prompt = self.prompt
        return {
            "noul": prompt.default_noul_question,
            "set": prompt.default_noul_question,
            "choice": prompt.default_choice_question,
            "span": prompt.default_choice_question,
            "score": prompt.default_score_question,
        }[type_]

    def user_text(self, value: object, where: str) -> str:
        """Render a user-supplied value and refuse it if it carries the model's control tokens."""
        text = render_state(value)
        self.builder.check_user_text(text, where)
        return text

    def instructions(self, question: Any, where: str) -> str:
        """The question's instructions as checked user text, or the recipe's default question of its type."""
        if question.instructions is None:
            return self.default_question(question.type)
        return self.user_text(question.instructions, f"{where}.instructions")

    def criteria(self, question: Any, where: str) -> list[tuple[str, str | None]]:
        """(name, description as checked user text, or None) of a choice or set question's criteria, in order."""
        out = []
        for name, description in question.criteria.items():
            self.builder.check_user_text(name, f"{where}.criteria")
            out.append(
                (name, None if description is None else self.user_text(description, f"{where}.criteria[{name!r}]"))
            )
        return out

    def question_line(self, question: Any, where: str) -> str:
        return str(self.prompt.question_block.format(question=self.instructions(question, where)))


class QuestionKind(ABC):
    """One System One question type: its rows after the state prefix, and its answer from their logits."""

    # class attributes, which a kind that wraps another (readouts/calibration.py, questions/prior_choice.py) sets
    # per instance from the one it wraps
    type: str
    # the fewest options a choice of this type is answered with (the API allows one; most families' upstreams need
    # two, and the envelope refuses fewer with a 422 naming the family's readout)
    min_options: int = 2
    # the coherence modes (a request's x_coherence besides "off") that change how this type lays out and reads its
    # rows (questions/choice.py, questions/score.py); under another mode the model offers, it answers single pass
    coherence_modes: frozenset[str] = frozenset()
    # the head scores each option apart from where it is listed (a row per candidate): no option order to correct,
    # so every mode is answered unchanged, and GET /v1/models says "position-free"
    position_free: bool = False
    # why the modes are what they are, when a family's layout is the reason (GET /v1/models, the 422)
    coherence_note: str | None = None

    def refuses(self, question: Any, mode: str) -> str | None:
        """Why this type cannot answer `question` under coherence `mode` (one the model offers), or None."""
        return None

    @abstractmethod
    def rows(self, question: Any, ctx: BuildContext, where: str) -> list[RowSpec]: ...

    @abstractmethod
    def answer(self, question: Any, logits: list[torch.Tensor], ctx: BuildContext) -> BaseModel: ...


# ----- the single-question form ----------------------------------------------------------------
class SingleQuestionForm(ABC):
    """How a family answers the single-question form (`kind`, `state`, `question`, `options`): the job that
    asks it (one question, under legacy.QID) and the form's response fields from that question's answer."""

    @abstractmethod
    def job(self, request: Any, image_key: Callable[[str], str] | None) -> Job:
        """The request as a Job; `image_key(data_uri)` names an image's asset (None: no image store)."""

    @abstractmethod
    def fields(self, request: Any, answer: Any) -> dict[str, Any]:
        """DecisionResponse's `probabilities`, `choice_index`, `choice` and kind-specific fields."""


# ----- readouts ---------------------------------------------------------------------------------
@dataclass
class Readout(ABC):
    """What a family reads: its checkpoint requirements, backend, prompt builder, head and question types.

    A family's readout is one class registered under the family's name (families/registry.py); the recipe
    names the family (`serving.family`) and the readout says which backend runs it (`make_backend`).
    """

    options: dict[str, Any] = field(default_factory=dict)
    name: ClassVar[str] = "readout"
    question_types: ClassVar[frozenset[str]] = frozenset()
    needs_lm_head: ClassVar[bool] = False  # load the checkpoint with its LM head (AutoModelForCausalLM)
    single_question_form: ClassVar[bool] = False  # answers the JEV-VL `kind` form too (label-token rows only)
    head: Head | RequestHead | None = None
    calibration: Calibration | None = None  # set by `serve` (readouts.standard.StandardReadout)
    kinds: dict[str, QuestionKind] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.options) - set(self.known_options()))
        if unknown:
            raise ServingError(
                f"readout {self.name!r} has no option(s) {', '.join(unknown)}; "
                f"known: {', '.join(sorted(self.known_options())) or 'none'}"
            )

    def known_options(self) -> dict[str, Any]:
        """Option name -> default, for the recipe's `serving.options`."""
        return {}

    def option(self, key: str) -> Any:
        return self.options.get(key, self.known_options()[key])

    def warmup_request(self, request: SystemOneRequest) -> SystemOneRequest | None:
        """The decision that warms the worker up before /health says ok, from the worker's own (`request`): by
        default its questions of the types this readout answers; None when the readout's contract answers no
        request without the caller's data (e.g. a screenshot as the whole state): ready once loaded."""
        questions = {qid: q for qid, q in request.questions.items() if q.type in self.question_types}
        return request.model_copy(update={"questions": questions})

    # what runs it
    @abstractmethod
    def make_backend(self) -> Backend:
        """The backend that runs this readout's checkpoint; called after `check` (it may depend on it)."""

    @abstractmethod
    def prompt_builder(self, tokenizer: Any, recipe: Recipe, identity: str) -> PromptBuilder: ...

    # the request forms
    @abstractmethod
    def single_question(self, recipe: Recipe) -> SingleQuestionForm:
        """How this family asks a request of the single-question form (answered only when
        `single_question_form`)."""

    @abstractmethod
    def envelope_state(self, request: Any) -> str:
        """A System One request's state as this family's prompt writes it, asset references still in place
        (the envelope puts its images there)."""

    # the checkpoint
    def requirements(self) -> list[Any]:
        """Files (and keys in them) the checkpoint folder must hold (loading/checkpoint.py: Requirement)."""
        return []

    def check(self, folder: str) -> None:
        for requirement in self.requirements():
            requirement.check(folder, self.name)

    @abstractmethod
    def load(self, loaded: LoadedModel, builder: PromptBuilder) -> None:
        """Build the head and the question types answered (`serve`)."""

    @abstractmethod
    def serve(self, kinds: list[QuestionKind], calibration: Calibration) -> None:
        """Answer `kinds` (question-type objects), each calibrated; called at the end of `load`."""

    def describe(self) -> dict[str, Any]:
        return {
            "readout": self.name,
            "question_types": sorted(self.question_types),
            "calibration": self.calibration.describe() if self.calibration is not None else {},
        }
