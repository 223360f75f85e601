"""option-scoring: each option's own text scored as the model's answer, for causal LMs without a trained head.

The label-token readout asks the model to bind options to letters and pick a letter, which small models do not do
(Robinson & Wingate, ICLR 2023). Here every option is a row after the shared state prefix: the question, then the
option's text as the assistant's answer, scored by the summed log-probability of its tokens (the head LFM2.5's value
scoring uses, engine/continuation_head.py). Calibrated (`baseline: content-free`, the default), each score has the
same text's log-probability after a content-free state subtracted (domain-conditional PMI, Holtzman et al., EMNLP
2021; a content-free input as in Zhao et al., 2021), computed once per question and option and cached
(engine/baseline_rows.py). The question types are questions/scored.py's: choice, noul (" Yes" vs " No"), score
(levels as texts), span and set. No option order enters a row, so the answer does not depend on it.

Options (`serving.options`):
- `baseline`: `content-free` (PMI against `content_free_state`) or `none` (raw log-probabilities);
- `content_free_state`: the state the baseline rows follow (default "N/A");
- `system`: the system turn for these rows (default: the recipe's prompt.system);
- `calibration_file`: a JSON file beside the recipe's recipe.yaml with an `option_scoring` block: per type
  {weight, temperature, bias} fitted on a committed calibration set by `python -m tools.calibrate_option_scoring`,
  with the checkpoint and layout it was fitted under (not applied to another; /health says why).
"""

from __future__ import annotations

import hashlib
import json
import math
import os

from jev_common.checkpoint_files import ServingError, read_json

from ..backends.causal_scores import CausalScores
from ..engine.baseline_rows import BaselineCache
from ..engine.continuation_head import ContinuationLogProbHead
from ..prompt.scored_rows import ScoredRowsBuilder
from ..questions.scored import Scaling, ScoredChoice, ScoredLayout, ScoredNoul, ScoredScore, ScoredSet, ScoredSpan
from .calibration import Calibration
from .standard import StandardReadout

BASELINES = ("content-free", "none")
TYPES = ("noul", "choice", "score", "span", "set")
FALLBACK = {"set": "noul", "span": "choice"}  # a type without its own fitted scaling takes this one's


class OptionScoring(StandardReadout):
    name = "option-scoring"
    question_types = frozenset(TYPES)
    needs_lm_head = True

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.option("baseline") not in BASELINES:
            raise ServingError(
                f"readout {self.name!r}: serving.options.baseline must be one of {', '.join(BASELINES)}, "
                f"got {self.option('baseline')!r}"
            )
        self.baselines = BaselineCache()
        self.scalings: dict[str, Scaling] = {}
        self.scaling_source: str | None = None
        self.scaling_unused: str | None = None

    def known_options(self) -> dict:
        return {"baseline": "content-free", "content_free_state": "N/A", "system": None, "calibration_file": None}

    def make_backend(self) -> CausalScores:
        return CausalScores(self.baselines)

    def prompt_builder(self, tokenizer, recipe, identity: str) -> ScoredRowsBuilder:
        system = self.option("system")
        if system is not None:
            recipe = recipe.model_copy(update={"prompt": recipe.prompt.model_copy(update={"system": system})})
        content_free = self.option("content_free_state") if self.option("baseline") == "content-free" else None
        return ScoredRowsBuilder(tokenizer, recipe, identity, content_free)

    def load(self, loaded, builder) -> None:
        self.head = ContinuationLogProbHead(loaded.model)
        self.scalings = self.fitted(builder)
        layout = ScoredLayout()
        kinds = [
            ScoredChoice(self.scaling("choice"), layout),
            ScoredNoul(self.scaling("noul"), layout),
            ScoredScore(self.scaling("score"), layout),
            ScoredSpan(self.scaling("span"), layout),
            ScoredSet(self.scaling("set"), layout),
        ]
        self.serve(kinds, Calibration())  # the kinds scale their own scores (Scaling); no logit calibration on top

    def scaling(self, type_: str) -> Scaling:
        default = Scaling(weight=1.0 if self.option("baseline") == "content-free" else 0.0)
        return self.scalings.get(type_) or self.scalings.get(FALLBACK.get(type_, type_)) or default

    def layout(self, builder) -> str:
        """What a fitted scaling depends on beside the checkpoint: this readout, its prompt and its baseline."""
        blob = json.dumps(
            {
                "readout": self.name,
                "prompt": builder.recipe.prompt.model_dump(mode="json"),
                "baseline": self.option("baseline"),
                "content_free_state": self.option("content_free_state"),
                "layout": ScoredLayout().__dict__,
            },
            sort_keys=True,
        )
        return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()

    def fitted(self, builder) -> dict[str, Scaling]:
        """The scalings in the recipe's calibration file when they were fitted on this checkpoint and layout."""
        name = self.option("calibration_file")
        recipe = builder.recipe
        if name is None:
            return {}
        if not isinstance(name, str) or recipe.folder is None:
            raise ServingError(
                f"recipe {recipe.name}: serving.options.calibration_file must name a file beside its recipe.yaml"
            )
        source = f"recipes/{recipe.folder.name}/{name}"
        path = os.path.join(recipe.folder, name)
        if not os.path.isfile(path):
            self.scaling_unused = f"{source}: no such file (fit it with python -m tools.calibrate_option_scoring)"
            return {}
        block = read_json(path)
        block = block.get("option_scoring") if isinstance(block, dict) else None
        scalings = parse_scalings(block, source)
        assert isinstance(block, dict)  # parse_scalings refuses anything else
        if block.get("checkpoint") != builder.identity:
            self.scaling_unused = (
                f"{source}: not applied, fitted on {block.get('checkpoint')!r}, this worker serves {builder.identity!r}"
            )
            return {}
        if block.get("layout") != self.layout(builder):
            self.scaling_unused = f"{source}: not applied, fitted under another prompt or baseline (layout differs)"
            return {}
        self.scaling_source = source
        return scalings

    def describe(self) -> dict:
        out = super().describe()
        out["scoring"] = {
            "baseline": self.option("baseline"),
            "content_free_state": self.option("content_free_state") if self.option("baseline") != "none" else None,
            "scaling": {type_: self.scaling(type_).describe() for type_ in TYPES},
            "scaling_source": self.scaling_source,
        }
        if self.scaling_unused:
            out["scoring"]["scaling_unused"] = self.scaling_unused
        return out


def parse_scalings(block: object, source: str) -> dict[str, Scaling]:
    """{type: Scaling} of an `option_scoring` block (ServingError naming what is wrong)."""
    if not isinstance(block, dict) or not isinstance(block.get("types"), dict):
        raise ServingError(f"{source}: option_scoring must be an object with `types` {{type: {{weight, ...}}}}")
    out = {}
    for type_, values in block["types"].items():
        if type_ not in TYPES or not isinstance(values, dict):
            raise ServingError(f"{source}: option_scoring.types.{type_}: not a question type with its values")
        fields = {}
        for key, value in values.items():
            if key not in ("weight", "temperature", "bias") or not _finite(value):
                raise ServingError(
                    f"{source}: option_scoring.types.{type_}.{key} must be weight, temperature or bias, a finite number"
                )
            fields[key] = float(value)
        if fields.get("temperature", 1.0) <= 0:
            raise ServingError(f"{source}: option_scoring.types.{type_}.temperature must be positive")
        out[type_] = Scaling(**fields)
    return out


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
