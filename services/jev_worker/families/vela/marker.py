"""vela-marker-heads: Vela 2.0 0.3B, the family's ModernBERT encoder member (`vela2-unified`), on the `encoder`
backend: the packages' marker sequences (marker_layout.py) and FP32 marker head (marker_head.py).
The package's Python code is never imported.

Package files read: `config.json` (model_type vela2-unified, format_version 1, `encoder_config`, `proj_dim`,
`readout`, `marker_ids`, `bos_token_id` / `eos_token_id` / `pad_token_id`, `max_length`), `calibration.json`
(`temperature` {choice, score, set, span}, `thresholds` {"set:*"}), `tokenizer.json`, `model.safetensors`
(`encoder.*` and the head tensors).

Question types, as vLLM-SR's reader (`request.py`) and answerer (`answers.py`) read them for both members:
- choice: options + the [ABS] abstain marker; softmax over the real options' logits / T_choice (the abstain
  logit is read but not part of the answer: this API has no field for it).
- noul: the two-option choice (no, yes) with [ABS]; P(yes) at T_choice, then the package's optional Noul fit
  (noul_fit.py) when its calibration.json turns it on (or `serving.options.noul_calibration`).
- score: the levels as options (`level` read alone), no [ABS]; softmax / T_score; score = sum(i p_i).
- set: the labels as options, no [ABS]; sigmoid(logit / T_set) per label; selected: p > thresholds["set:*"].
- span: the encoder reads a span question's [E] labels only (not its text). Vela's span questions take labels
  and return labelled spans; this API's span is one of the listed candidate substrings. Mapping (ours, not
  Vela's): one label ("answer", the question's instructions), so the question reaches the encoder as the label's
  description; word probabilities sigmoid(logit / T_span) over the words of the text state; a candidate's
  score is the mean probability of the words its first occurrence overlaps, normalised over the candidates
  (as vela-heads maps the decoders' span head).
A question without instructions reads the recipe's default question of its kind (the packages require one).
"""

from __future__ import annotations

import os

from jev_common.checkpoint_files import ServingError, read_json

from ...backends.encoder import Encoder
from ...loading.checkpoint import Requirement
from ...protocols import Backend
from ...readouts.standard import StandardReadout
from .encoder_files import VelaEncoderFiles
from .layout import span_text
from .marker_head import READOUTS, VelaMarkerHead, tensor_names
from .marker_layout import MARKERS, MarkerRow, MarkerSequenceBuilder
from .noul_fit import NoulFit
from .readout import VelaChoice, VelaNoul, VelaScore, VelaSet, VelaSpan, question_text

CONFIG, CALIBRATION, TOKENIZER, WEIGHTS = "config.json", "calibration.json", "tokenizer.json", "model.safetensors"
MEMBER, FORMAT_VERSION = "vela2-unified", 1
CONFIG_KEYS = (
    "model_type",
    "format_version",
    "encoder_config",
    "proj_dim",
    "readout",
    "marker_ids",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "max_length",
)
TEMPERATURES = ("choice", "score", "set", "span")
SET_THRESHOLD = "set:*"
SPAN_LABEL = "answer"


class _MarkerRow:
    """A Vela option question (its options, abstain and answer as the decoders') as the encoder reads it: one
    [Q] question with its [O] options (and [ABS]) in the request's marker sequence."""

    def rows(self, question, ctx, where):
        text = question_text(question, ctx, where)
        return [MarkerRow(text, tuple(self.options(question, ctx, where)), abstain=self.abstain)]


class MarkerChoice(_MarkerRow, VelaChoice):
    pass


class MarkerNoul(_MarkerRow, VelaNoul):
    pass


class MarkerScore(_MarkerRow, VelaScore):
    pass


class MarkerSet(_MarkerRow, VelaSet):
    pass


class MarkerSpan(VelaSpan):
    def rows(self, question, ctx, where):
        span_text(ctx.state, where)
        for candidate in question.criteria:
            ctx.builder.check_user_text(candidate, f"{where}.criteria")
        text = question_text(question, ctx, where)
        return [MarkerRow("", ((SPAN_LABEL, text),), span=True)]


class VelaMarkerHeads(StandardReadout):
    name = "vela-marker-heads"
    question_types = frozenset({"choice", "noul", "score", "set", "span"})
    config: dict | None = None  # the package's config.json, read by `check`
    temperatures: dict[str, float] | None = None  # calibration.json's, once loaded
    thresholds: dict[str, float] | None = None
    noul_fit: NoulFit | None = None  # the package's optional Noul fit, when on

    def known_options(self) -> dict:
        return {"noul_calibration": None}  # None: as the package's calibration.json says

    def make_backend(self) -> Backend:
        # one bidirectional marker sequence; the encoder from config.json encoder_config + tokenizer.json
        return Encoder(VelaEncoderFiles())

    def requirements(self) -> list[Requirement]:
        return [
            Requirement(CONFIG, CONFIG_KEYS),
            Requirement(CALIBRATION, ("temperature", "thresholds")),
            Requirement(TOKENIZER),
        ]

    def check(self, folder: str) -> None:
        super().check(folder)
        config = read_json(os.path.join(folder, CONFIG))
        if config["model_type"] != MEMBER:
            raise ServingError(
                f"readout {self.name!r} serves Vela 2.0's encoder package ({CONFIG} model_type "
                f"{MEMBER!r}); this checkpoint's is {config['model_type']!r} (the decoders are "
                "served by vela-heads)"
            )
        if config["format_version"] != FORMAT_VERSION:
            raise ServingError(
                f"{CONFIG}: format_version {config['format_version']!r}; this readout reads "
                f"Vela 2.0 packages of format_version {FORMAT_VERSION}"
            )
        marker_ids = config["marker_ids"] if isinstance(config["marker_ids"], dict) else {}
        missing = [m for m in MARKERS if m not in marker_ids]
        if missing:
            raise ServingError(f"{CONFIG}: marker_ids has no {', '.join(missing)} (the eight Vela 2.0 markers)")
        if config["readout"] not in READOUTS:
            raise ServingError(f"{CONFIG}: readout must be one of {', '.join(READOUTS)}, got {config['readout']!r}")
        Requirement(WEIGHTS, tensor_names(config["readout"])).check(folder, self.name)
        self.config = config

    def prompt_builder(self, tokenizer, recipe, identity: str) -> MarkerSequenceBuilder:
        return MarkerSequenceBuilder(tokenizer, recipe, identity, self.config)

    def load(self, loaded, builder) -> None:
        from safetensors import safe_open

        config = self.config
        self._calibration(read_json(os.path.join(loaded.folder, CALIBRATION)))
        names = tensor_names(config["readout"])
        with safe_open(os.path.join(loaded.folder, WEIGHTS), framework="pt") as handle:
            tensors = {name: handle.get_tensor(name) for name in names}
        hidden = int(loaded.model.config.hidden_size)
        self.head = VelaMarkerHead(
            tensors, readout=config["readout"], hidden=hidden, projection=int(config["proj_dim"]), source=WEIGHTS
        ).to(loaded.device)
        self.kinds = {
            kind.type: kind
            for kind in (MarkerChoice(self), MarkerNoul(self), MarkerScore(self), MarkerSet(self), MarkerSpan(self))
        }

    def _calibration(self, calibration: dict) -> None:
        temperatures = calibration.get("temperature")
        if not isinstance(temperatures, dict) or not all(
            isinstance(temperatures.get(t), (int, float)) and temperatures[t] > 0 for t in TEMPERATURES
        ):
            raise ServingError(
                f"{CALIBRATION}: temperature needs positive {', '.join(TEMPERATURES)}, got {temperatures!r}"
            )
        thresholds = calibration.get("thresholds") or {}
        if SET_THRESHOLD not in thresholds:
            raise ServingError(f"{CALIBRATION}: thresholds has no {SET_THRESHOLD!r} (the set questions' threshold)")
        self.temperatures = {t: float(temperatures[t]) for t in TEMPERATURES}
        self.thresholds = {k: float(v) for k, v in thresholds.items() if isinstance(v, (int, float))}
        self.noul_fit = NoulFit.read(calibration, self.option("noul_calibration"))

    def temperature(self, type_: str) -> float:
        return self.temperatures[type_]

    def set_threshold(self) -> float:
        return self.thresholds[SET_THRESHOLD]

    def set_bias(self) -> float:
        return 0.0  # the 0.3B's marker head has no set bias

    def span_temperature(self) -> float:
        return self.temperatures["span"]

    def describe(self) -> dict:
        calibration = None
        if self.temperatures is not None:
            calibration = {
                "source": CALIBRATION,
                "temperatures": dict(self.temperatures),
                "set_threshold": self.set_threshold(),
                "abstain": "read, not part of an answer",
                "noul_calibration": self.noul_fit.describe() if self.noul_fit else "off",
            }
        return {
            "readout": self.name,
            "question_types": sorted(self.question_types),
            "calibration": calibration,
            "marker_readout": self.config.get("readout") if self.config is not None else None,
        }
