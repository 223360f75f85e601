"""The Vela 2.0 decoders' FP32 readout heads, read from the package's tensors (names as the release ships
them: `head.*` + `set_bias` and the router span head `span2.*` in the model shards, the broad span head
`span_broad.*` in `broad_head.safetensors`).

CandidateHead: c = LN_cand(option endpoint), q = LN_query(block's last token);
  logit = <K c, Q q> / sqrt(d) + v . GELU(M_c c + M_q q)              (M_c has a bias)
SpanHeadV2: words = LN_w(first sub-token of each word in the repeated target), centred over the words;
  labels = LN_l(mean over each label block) + slot[min(i, slots - 1)], centred when there are 2+;
  logit[w, l] = <K w, Q l> / sqrt(d) + v . GELU(M w + N l)            (M has a bias; `o` is unused)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from jev_common.checkpoint_files import ServingError

from ...protocols import Head

CANDIDATE = (
    "candidate_norm.weight",
    "candidate_norm.bias",
    "query_norm.weight",
    "query_norm.bias",
    "key.weight",
    "query.weight",
    "candidate_mlp.weight",
    "candidate_mlp.bias",
    "query_mlp.weight",
    "scalar.weight",
)
SPAN = (
    "wn.weight",
    "wn.bias",
    "ln.weight",
    "ln.bias",
    "slot.weight",
    "K.weight",
    "Q.weight",
    "M.weight",
    "M.bias",
    "N.weight",
    "v.weight",
)
ROUTER, BROAD = "span2.", "span_broad."
HEAD, SET_BIAS = "head.", "set_bias"
# Row kinds in a row's labels: (kind, block length, ...) -- see VelaHeads.logits.
OPTIONS, ROUTER_SPAN, BROAD_SPAN = 0, 1, 2


def _tensors(tensors: dict, prefix: str, names: tuple[str, ...], source: str) -> dict[str, torch.Tensor]:
    missing = [prefix + name for name in names if prefix + name not in tensors]
    if missing:
        raise ServingError(f"{source} has no {', '.join(missing[:4])}")
    return {name: tensors[prefix + name].to(torch.float32) for name in names}


def _layer_norm(x: torch.Tensor, t: dict, name: str) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], t[f"{name}.weight"], t[f"{name}.bias"], 1e-5)


class VelaHeads(Head):
    def __init__(self, tensors: dict, hidden: int, source: str, broad: dict | None = None):
        self.candidate = _tensors(tensors, HEAD, CANDIDATE, source)
        if SET_BIAS not in tensors:
            raise ServingError(f"{source} has no {SET_BIAS}")
        self.set_bias = float(tensors[SET_BIAS].float().reshape(-1)[0])
        self.spans = {ROUTER_SPAN: _tensors(tensors, ROUTER, SPAN, source)}
        if broad is not None:
            self.spans[BROAD_SPAN] = _tensors(broad, BROAD, SPAN, "broad_head.safetensors")
        for what, t, name in [("head", self.candidate, "key.weight")] + [
            (prefix, t, "K.weight") for prefix, t in zip((ROUTER, BROAD), self.spans.values())
        ]:
            if t[name].shape[1] != hidden:
                raise ServingError(
                    f"{source}: {what}{name} is {list(t[name].shape)}; its input must be the "
                    f"backbone's hidden size {hidden}"
                )

    def options(self, candidates: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        t = self.candidate
        c = _layer_norm(candidates, t, "candidate_norm")
        q = _layer_norm(query, t, "query_norm")
        d = t["key.weight"].shape[0]
        bilinear = (c @ t["key.weight"].T) @ (t["query.weight"] @ q) / math.sqrt(d)
        mlp = F.gelu(c @ t["candidate_mlp.weight"].T + t["candidate_mlp.bias"] + t["query_mlp.weight"] @ q)
        return bilinear + (mlp @ t["scalar.weight"].T).squeeze(-1)

    def span(self, which: int, words: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        t = self.spans[which]
        word = _layer_norm(words, t, "wn")
        word = word - word.mean(0, keepdim=True)
        slots = torch.arange(labels.shape[0]).clamp(max=t["slot.weight"].shape[0] - 1)
        label = _layer_norm(labels, t, "ln") + t["slot.weight"][slots]
        if labels.shape[0] > 1:
            label = label - label.mean(0, keepdim=True)
        d = t["K.weight"].shape[0]
        bilinear = (word @ t["K.weight"].T) @ (label @ t["Q.weight"].T).T / math.sqrt(d)
        mlp = F.gelu((word @ t["M.weight"].T + t["M.bias"])[:, None, :] + (label @ t["N.weight"].T)[None, :, :])
        return bilinear + (mlp @ t["v.weight"].T).squeeze(-1)

    def logits(self, hidden: torch.Tensor, labels: tuple[int, ...]) -> torch.Tensor:
        """A row's readout from its hidden states [prefix + block, H]. `labels` says what to read, positions
        relative to the block's first token: (OPTIONS, block length, *option ends) -> option logits [k];
        (ROUTER_SPAN | BROAD_SPAN, block length, L, *label starts, *label ends, *word starts) -> [W, L]."""
        kind, length = labels[0], labels[1]
        rows = hidden[len(hidden) - length :].to(torch.float32)
        if kind == OPTIONS:
            return self.options(rows[list(labels[2:])], rows[-1]).cpu()
        count = labels[2]
        starts, ends = labels[3 : 3 + count], labels[3 + count : 3 + 2 * count]
        words = list(labels[3 + 2 * count :])
        label_states = torch.stack([rows[s : e + 1].mean(0) for s, e in zip(starts, ends)])
        return self.span(kind, rows[words], label_states).cpu()
