"""code-readout: a trained linear readout over answer codes (pplx-decider, Decider-style and D3-style
code-readout v1 checkpoints).

Checkpoint: the backbone without an LM head (`config.json` + `model*.safetensors`), `readout.safetensors`
(`weight` [n_codes (255), hidden]) and `decision_config.json` (`codes`, their `token_ids`, `temperature`,
`attention_mode` causal | noncausal_full_attention, `pooling` last). Options and score levels are listed
under the checkpoint's codes (each checked at load to be the single token `token_ids` says); the
readout scores code i with weight row i at the row's last position, in FP32, over the question's
codes only (codes past the option count are not scored), softmax at the checkpoint temperature.
Yes/no questions have no code layout in this readout: noul and set are refused with a 4xx.
"""
from __future__ import annotations

import os

import torch

from ..backends.registry import build_backend
from ..protocols import Backend, Head, Readout
from ..questions.choice import Choice
from ..questions.score import Score
from ..questions.span import SpanKind
from .base import Requirement, ServingError, read_json
from .calibration import Calibration

CONFIG = "decision_config.json"
WEIGHTS = "readout.safetensors"
BACKEND_FOR_ATTENTION = {"causal": "causal-lm", "noncausal_full_attention": "noncausal-lm"}


class CodeHead(Head):
    """logits[i] = h_last(FP32) @ W[code_i](FP32); `labels` are code indices."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight.to(torch.float32)

    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        rows = self.weight.index_select(0, torch.tensor(labels, device=self.weight.device))
        return hidden.to(torch.float32) @ rows.T


def hidden_size(model) -> int:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.hidden_size)


class CodeReadout(Readout):
    name = "code-readout"
    question_types = frozenset({"choice", "score", "span"})
    attention_mode: str | None = None  # the checkpoint's (decision_config.json), known once `check` has read it

    def requirements(self) -> list[Requirement]:
        return [Requirement(CONFIG, ("codes", "token_ids", "temperature", "attention_mode", "pooling")),
                Requirement(WEIGHTS, ("weight",))]

    def check(self, folder: str) -> None:
        super().check(folder)
        config = read_json(os.path.join(folder, CONFIG))
        mode, pooling = config["attention_mode"], config["pooling"]
        if mode not in BACKEND_FOR_ATTENTION:
            raise ServingError(f"{CONFIG}: attention_mode {mode!r} is not one of {', '.join(BACKEND_FOR_ATTENTION)}")
        if pooling != "last":
            raise ServingError(f"{CONFIG}: pooling {pooling!r} is not served (only 'last')")
        self.attention_mode = mode

    def make_backend(self) -> Backend:
        """causal-lm for a causal checkpoint, noncausal-lm for `noncausal_full_attention` (read by `check`)."""
        if self.attention_mode is None:
            raise ServingError(f"readout {self.name!r} chooses its backend by the checkpoint's {CONFIG} "
                               "attention_mode: check the checkpoint first")
        return build_backend(BACKEND_FOR_ATTENTION[self.attention_mode])

    def load(self, loaded, builder) -> None:
        folder = loaded.folder
        config = read_json(os.path.join(folder, CONFIG))
        codes, token_ids = list(config["codes"]), [int(t) for t in config["token_ids"]]
        from safetensors.torch import load_file

        weight = load_file(os.path.join(folder, WEIGHTS))["weight"]
        hidden = hidden_size(loaded.model)
        if len(codes) != len(token_ids) or len(set(codes)) != len(codes):
            raise ServingError(f"{CONFIG}: {len(codes)} codes (distinct: {len(set(codes))}) for {len(token_ids)} token_ids")
        if tuple(weight.shape) != (len(codes), hidden):
            raise ServingError(f"{WEIGHTS}: weight is {list(weight.shape)}, expected [{len(codes)} codes, hidden {hidden}]")
        for code, token in zip(codes, token_ids):
            actual = builder._try_single_token(code)
            if actual != token:
                raise ServingError(f"{CONFIG}: code {code!r} is token {token} there, but this tokenizer makes it "
                                   f"{'several tokens' if actual is None else f'token {actual}'}")
        builder.use_codebook(codes, list(range(len(codes))), f"its {CONFIG} has")
        self.head = CodeHead(weight.to(loaded.device))
        self.serve([Choice(), Score(), SpanKind()], Calibration.from_config(config, CONFIG))

    def describe(self) -> dict:
        return {**super().describe(), "attention_mode": self.attention_mode}
