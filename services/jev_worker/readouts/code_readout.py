"""code-readout: a trained linear readout over answer codes (the code-readout v1 checkpoint format of
pplx-decider and D3; the generic `code-readout` family serves a user-supplied one with the recipe's prompt).

Checkpoint: the backbone without an LM head (`config.json` + `model*.safetensors`), `readout.safetensors`
(`weight` [n_codes (255), hidden]) and `decision_config.json` (`codes`, their `token_ids`, `temperature`, and
optionally `attention_mode` causal | noncausal_full_attention, `pooling` last and `readout_dtype` float32 |
bfloat16, with those defaults, as the format's readers default them). Options and score levels are listed
under the checkpoint's codes (each checked at load to be the single token `token_ids` says); the readout
scores code i with weight row i at the row's last position, over the question's codes only (codes past the
option count are not scored), softmax at the checkpoint temperature: FP32 `h @ W.T`, or with `readout_dtype:
bfloat16` the BF16 `F.linear(h, W)` the format's BF16 readout computes. The generic family answers choice,
score and span; yes/no questions have no code layout in it (noul, set: 4xx). A family with its own prompt
(families/pplx_decider, families/d3) subclasses it with its question types (readouts/code_prompt.py).
"""

from __future__ import annotations

import os

import torch

from jev_common.checkpoint_files import ServingError, read_json

from ..backends.registry import build_backend
from ..loading.checkpoint import Requirement
from ..protocols import Backend, Head
from ..questions.choice import Choice
from ..questions.score import Score
from ..questions.span import SpanKind
from .calibration import Calibration
from .standard import StandardReadout

CONFIG = "decision_config.json"
WEIGHTS = "readout.safetensors"
BACKEND_FOR_ATTENTION = {"causal": "causal-lm", "noncausal_full_attention": "noncausal-lm"}
READOUT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class CodeHead(Head):
    """logits[i] = h_last @ W[code_i]: in FP32, or (bfloat16) the BF16 linear of the BF16 hidden state, read as
    FP32; `labels` are code indices."""

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype = torch.float32):
        self.weight = weight.to(dtype)
        self.dtype = dtype

    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        rows = self.weight.index_select(0, torch.tensor(labels, device=self.weight.device))
        if self.dtype == torch.float32:
            return hidden.to(torch.float32) @ rows.T
        return torch.nn.functional.linear(hidden.to(self.dtype), rows).to(torch.float32)


def hidden_size(model) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.hidden_size)


class CodeReadout(StandardReadout):
    name = "code-readout"
    question_types = frozenset({"choice", "score", "span"})
    attention_mode: str | None = None  # the checkpoint's (decision_config.json), known once `check` has read it
    config: dict | None = None  # decision_config.json, once `check` has read it

    def requirements(self) -> list[Requirement]:
        return [Requirement(CONFIG, ("codes", "token_ids", "temperature")), Requirement(WEIGHTS, ("weight",))]

    def check(self, folder: str) -> None:
        super().check(folder)
        config = read_json(os.path.join(folder, CONFIG))
        mode, pooling = config.get("attention_mode", "causal"), config.get("pooling", "last")
        if mode not in BACKEND_FOR_ATTENTION:
            raise ServingError(f"{CONFIG}: attention_mode {mode!r} is not one of {', '.join(BACKEND_FOR_ATTENTION)}")
        if pooling != "last":
            raise ServingError(f"{CONFIG}: pooling {pooling!r} is not served (only 'last')")
        if config.get("readout_dtype", "float32") not in READOUT_DTYPES:
            raise ServingError(
                f"{CONFIG}: readout_dtype {config['readout_dtype']!r} is not one of {', '.join(READOUT_DTYPES)}"
            )
        self.attention_mode, self.config = mode, config

    def make_backend(self) -> Backend:
        """causal-lm for a causal checkpoint, noncausal-lm for `noncausal_full_attention` (read by `check`)."""
        if self.attention_mode is None:
            raise ServingError(
                f"readout {self.name!r} chooses its backend by the checkpoint's {CONFIG} "
                "attention_mode: check the checkpoint first"
            )
        return build_backend(BACKEND_FOR_ATTENTION[self.attention_mode])

    def question_kinds(self) -> list:
        """The question types answered (the generic family: the recipe-prompted choice, score and span)."""
        return [Choice(), Score(), SpanKind()]

    def load(self, loaded, builder) -> None:
        folder = loaded.folder
        config = read_json(os.path.join(folder, CONFIG))
        codes, token_ids = list(config["codes"]), [int(t) for t in config["token_ids"]]
        from safetensors.torch import load_file

        weight = load_file(os.path.join(folder, WEIGHTS))["weight"]
        hidden = hidden_size(loaded.model)
        if len(codes) != len(token_ids) or len(set(codes)) != len(codes):
            raise ServingError(
                f"{CONFIG}: {len(codes)} codes (distinct: {len(set(codes))}) for {len(token_ids)} token_ids"
            )
        if tuple(weight.shape) != (len(codes), hidden):
            raise ServingError(
                f"{WEIGHTS}: weight is {list(weight.shape)}, expected [{len(codes)} codes, hidden {hidden}]"
            )
        for code, token in zip(codes, token_ids):
            actual = builder._try_single_token(code)
            if actual != token:
                raise ServingError(
                    f"{CONFIG}: code {code!r} is token {token} there, but this tokenizer makes it "
                    f"{'several tokens' if actual is None else f'token {actual}'}"
                )
        builder.use_codebook(codes, list(range(len(codes))), f"its {CONFIG} has")
        self.head = CodeHead(weight.to(loaded.device), READOUT_DTYPES[config.get("readout_dtype", "float32")])
        self.serve(self.question_kinds(), Calibration.from_config(config, CONFIG))

    def describe(self) -> dict:
        config = self.config or {}
        return {
            **super().describe(),
            "attention_mode": self.attention_mode,
            "readout_dtype": config.get("readout_dtype", "float32"),
        }
