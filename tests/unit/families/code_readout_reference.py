"""Upstream's read of a code-readout v1 question (pplx-decider's `DecisionModel.forward` / `predict`, vLLM-SR's
Decision 3.0 `_pass`), for the pplx-decider and D3 tests, which write each family's own prompt out themselves:
`messages(state, question, codes)` rendered by the checkpoint's chat template with `enable_thinking=False`, the
backbone's last hidden state, `h @ W.T` over the 255 codes with the codes past the option count excluded, softmax
of logits / temperature. Commit-pinned public sources: sgl-project/sglang
`python/sglang/srt/entrypoints/systemone/serving.py` @ 18396cfb51aeee87250be6e4241648c25479b902 (pplx-decider's
prompt and code readout as SGLang ports it) and vllm-project/semantic-router
`src/model-runtime/vllm_srun/families/decision3/family.py` @ b744aa1f6a18873339848c6367362d2e7b92fc42 (`_pass`)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from ..family_helpers import TOL, assert_probs

THINKING_OFF = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


class CodeReadoutReference:
    def __init__(self, folder, messages, keys, *, text_model_hook=None):
        """`messages(state, question, codes)` and `keys(question)` are the family's; `text_model_hook` may change
        the text model (pplx's noncausal attention)."""
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.backbone = AutoModel.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
        if text_model_hook is not None:
            text_model_hook(self.backbone.language_model)
        self.config = json.loads(Path(folder, "decision_config.json").read_text())
        self.readout = load_file(f"{folder}/readout.safetensors")["weight"].float()
        self.messages, self.keys = messages, keys

    def text(self, state, question: dict) -> str:
        text = self.tokenizer.apply_chat_template(
            self.messages(state, question, self.config["codes"]),
            tokenize=False,
            add_generation_prompt=True,
            enable_thinking=False,
        )
        assert text.endswith(THINKING_OFF)
        return text

    def ids(self, state, question: dict) -> list[int]:
        return self.tokenizer.encode(self.text(state, question), add_special_tokens=False)

    @torch.inference_mode()
    def probabilities(self, state, question: dict) -> list[float]:
        ids = torch.tensor([self.ids(state, question)])
        hidden = self.backbone(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).last_hidden_state
        logits = hidden[0, -1].float() @ self.readout.T
        count = len(self.keys(question))
        logits = logits.masked_fill(torch.arange(logits.shape[0]) >= count, float("-inf"))
        return (logits / self.config["temperature"]).softmax(-1)[:count].tolist()

    def check(self, answers: dict, state, questions: dict) -> None:
        """The served answers equal this read of every question (noul: P(true); score: sum(i * p_i))."""
        for qid, question in questions.items():
            want, got = self.probabilities(state, question), answers[qid]
            if question["type"] == "noul":
                assert abs(got["noul"] - want[1]) <= TOL, (qid, got, want)
                continue
            assert_probs(got["probabilities"], want, self.keys(question))
            if question["type"] == "score":
                assert abs(got["score"] - sum(i * p for i, p in enumerate(want))) <= TOL
