"""clm-cosine: CLM (Contrastive-LM) decisions, computed by CLM's own server (`clm-serve`, PyPI
contrastive-lm) on the external-http backend, translated to and from this API.

CLM scores each option by `exp(logit_scale) * cos(state_head(e(state + instructions)), action_head(e(option)))`
over an embeddings server's vectors, and a softmax over a question's options is its answer; it answers
noul, choice and score. The worker sends `{model: native_model, state, questions, temperature}` to
`POST {endpoint}/v1/systemone` and rebuilds every answer from the returned probabilities: CLM must give
exactly one answer per question, of the asked type, with one finite probability per option summing to 1
(else 502, naming the question); `confidence` and score `legend` are this API's, computed here; `usage`
is CLM's encoder tokens (cache misses only). span / set are refused (422) before anything is sent.
Choice and score are position-free: each option's own text is embedded apart from the others, so every
x_coherence mode is accepted and answered unchanged (nothing of the mode is sent to CLM).

serving.options: `endpoint` (read by the backend), `native_model` (`clm-latest`; `clm-raw` is CLM's
no-head ablation), `temperature` (CLM's softmax temperature, default 1.0).
"""

from __future__ import annotations

import math

from jev_common.checkpoint_files import ServingError
from jev_common.errors import ExternalServerFailed, UnsupportedQuestionType
from jev_common.schema import NoulAnswer, SystemOneRequest, SystemOneUsage, choice_answer, score_answer

from ...backends.external import ExternalHTTP
from ...questions.coherence import AnsweredElsewhere
from ...readouts.calibration import Calibration
from ...readouts.standard import ExternalReadout

POSITION_FREE = (
    "CLM embeds each option's own text apart from the others and scores it against the state: no listing "
    "order, so every mode is answered unchanged"
)


class ClmCosine(ExternalReadout):
    name = "clm-cosine"
    question_types = frozenset({"noul", "choice", "score"})

    def known_options(self) -> dict:
        return {"endpoint": None, "native_model": "clm-latest", "temperature": 1.0}

    def __post_init__(self) -> None:
        super().__post_init__()
        temperature = self.option("temperature")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature <= 100:
            raise ServingError(
                f"readout {self.name!r}: temperature must be in (0, 100] (CLM's range), got {temperature!r}"
            )
        self.calibration = Calibration({}, {}, f"CLM server ({self.option('native_model')}, T={temperature:g})")
        self.kinds = {
            t: AnsweredElsewhere(t, position_free=True, coherence_note=POSITION_FREE) for t in ("choice", "score")
        }

    def make_backend(self) -> ExternalHTTP:
        return ExternalHTTP()  # CLM's own server (serving.options.endpoint) answers

    def request_body(self, request: SystemOneRequest) -> dict:
        """CLM's request for `request`; a question type CLM has no answer for is refused here."""
        for qid, question in request.questions.items():
            if question.type not in self.question_types:
                raise UnsupportedQuestionType(
                    f"question {qid!r} is {question.type}; CLM answers {', '.join(sorted(self.question_types))}",
                    ("questions", qid, "type"),
                )
        return {
            "model": self.option("native_model"),
            "state": request.state,
            "questions": {qid: q.model_dump(mode="json", exclude_none=True) for qid, q in request.questions.items()},
            "temperature": float(self.option("temperature")),
        }

    def answers(self, request: SystemOneRequest, raw: object) -> tuple[dict, SystemOneUsage]:
        """This API's answers and usage from CLM's response (ExternalServerFailed, a 502, when it is not what was
        asked)."""
        raw_answers = raw.get("answers") if isinstance(raw, dict) else None
        if not isinstance(raw_answers, dict) or set(raw_answers) != set(request.questions):
            raise _bad("did not return exactly one answer per question")
        answers = {qid: self._answer(qid, question, raw_answers[qid]) for qid, question in request.questions.items()}
        usage = raw.get("usage") if isinstance(raw.get("usage"), dict) else {}
        tokens = usage.get("input_tokens", 0)
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise _bad(f"returned usage.input_tokens {tokens!r}")
        return answers, SystemOneUsage(input_tokens=tokens, output_tokens=0)

    def _answer(self, qid: str, question, answer: object):
        if not isinstance(answer, dict) or answer.get("type") != question.type:
            raise _bad(f"returned no {question.type} answer for {qid!r}")
        if question.type == "noul":
            return NoulAnswer(noul=_probability(answer.get("noul"), qid))
        names = (
            list(question.criteria) if question.type == "choice" else [str(i) for i in range(len(question.criteria))]
        )
        given = answer.get("probabilities")
        if not isinstance(given, dict) or set(given) != set(names):
            raise _bad(
                f"returned probabilities for {sorted(given) if isinstance(given, dict) else given!r}, "
                f"not the options of {qid!r}"
            )
        probs = [_probability(given[name], qid) for name in names]
        if not math.isclose(sum(probs), 1.0, abs_tol=1e-5):
            raise _bad(f"returned probabilities for {qid!r} that sum to {sum(probs)!r}")
        if question.type == "choice":
            return choice_answer(names, probs)
        return score_answer(question.criteria, probs)


def _probability(value: object, qid: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise _bad(f"returned the probability {value!r} for {qid!r}")
    return float(value)


def _bad(what: str) -> ExternalServerFailed:
    return ExternalServerFailed(f"the CLM server {what}")
