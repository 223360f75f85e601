"""What most readouts share (protocols.Readout only declares it): the causal-lm backend, the chat prompt
builder, the single-question form asked as the System One question it is, the state rendered as sent, and
question types wrapped in their calibration. A family's readout subclasses StandardReadout and overrides what
its contract does differently; ExternalReadout is the one for a family whose own server runs the network."""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

from jev_common.checkpoint_files import ServingError
from jev_common.state_text import render_state

from ..protocols import Backend, PromptBuilder, Readout, SingleQuestionForm
from .calibration import CalibratedKind, Calibration


@dataclass
class StandardReadout(Readout):
    calibration: Calibration = field(default_factory=Calibration)

    def make_backend(self) -> Backend:
        from ..backends.registry import build_backend

        return build_backend("causal-lm")

    def prompt_builder(self, tokenizer, recipe, identity: str) -> PromptBuilder:
        from ..prompt.builder import ChatPromptBuilder

        return ChatPromptBuilder(tokenizer, recipe, identity)

    def single_question(self, recipe) -> SingleQuestionForm:
        from ..request.legacy import QuestionForm

        return QuestionForm(recipe.verbalizer.noul_option)

    def envelope_state(self, request) -> str:
        """Text as sent, objects and arrays as JSON text."""
        return render_state(request.state)

    def serve(self, kinds: list, calibration: Calibration) -> None:
        """Answer with `kinds`, each calibrated; with a position prior, the choice type also answers x_coherence
        `prior` (questions/prior_choice.py), debiasing the calibrated logits."""
        if calibration.position_prior is not None:
            from ..questions.prior_choice import PriorChoice

            try:
                kinds = [
                    PriorChoice(kind, calibration.position_prior) if kind.type == "choice" else kind for kind in kinds
                ]
            except ValueError as exc:
                raise ServingError(f"readout {self.name!r}: {calibration.position_prior.source}: {exc}") from None
        self.calibration = calibration
        self.kinds = {kind.type: CalibratedKind(kind, calibration) for kind in kinds}
        assert set(self.kinds) == set(self.question_types), (self.name, sorted(self.kinds))


class ExternalReadout(StandardReadout):
    """A readout for an external backend: translates a System One request to the server's body and its
    answer back; nothing is loaded here."""

    def load(self, loaded, builder) -> None:
        raise ServingError(f"readout {self.name!r} loads no local model")

    @abstractmethod
    def request_body(self, request) -> dict: ...

    @abstractmethod
    def answers(self, request, raw: dict) -> tuple[dict, object]:
        """(answers by question id, usage) from the server's JSON answer."""
