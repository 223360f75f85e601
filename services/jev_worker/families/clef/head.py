"""Clef's joint schema head, FP32, computed from the tensors of `joint_head.safetensors` (their names are
the published module's parameter names; nothing of the checkpoint's code is imported or run).

Over one request's final hidden states h [n, hidden] (after `hidden_norm`):
- memory = h @ memory_projection; global g = h[-1]; each question q = mean of h over its instructions;
  each option: context = mean of h over its JSON tokens, lexical = mean of the LM-head rows of those tokens;
- option queries = context/lexical/question projections, through the evidence-routing layers
  (pre-norm cross-attention to the memory + GELU feed-forward);
- fields = question projection + the normed, question-weighted summary of its routed options + global
  projection + type embedding, through the decoder layers (pre-norm self-attention, cross-attention to
  the memory, GELU feed-forward), then `field_norm`;
- each option's logit = prior + sigmoid(residual_gate) * (joint_scale * cos(field, option) + residual MLP),
  prior = prior_scale * cos(lexical, q + g); both scales exp(min(s, ln 100)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ...protocols import RequestHead

CONFIG_KEYS = ("hidden_size", "width", "routing_layers", "layers", "heads", "feedforward")
SCALARS = ("prior_logit_scale", "joint_logit_scale", "residual_gate")
PROJECTIONS = (
    "memory_projection",
    "question_projection",
    "option_question_projection",
    "global_projection",
    "option_context_projection",
    "option_lexical_projection",
)
NORMS = ("hidden_norm", "option_summary_norm", "field_norm", "option_norm")
MAX_LOG_SCALE = math.log(100.0)


def _attention_shapes(prefix: str, width: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.in_proj_weight": (3 * width, width),
        f"{prefix}.in_proj_bias": (3 * width,),
        f"{prefix}.out_proj.weight": (width, width),
        f"{prefix}.out_proj.bias": (width,),
    }


def _norm_shapes(prefix: str, size: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (size,), f"{prefix}.bias": (size,)}


def _linear_shapes(prefix: str, out: int, inp: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.weight": (out, inp), f"{prefix}.bias": (out,)}


def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
    """Every tensor `joint_head.safetensors` holds for `config` (joint_head_config.json), with its shape."""
    hidden, width, ff = config["hidden_size"], config["width"], config["feedforward"]
    shapes = {name: () for name in SCALARS}
    shapes.update(_norm_shapes("hidden_norm", hidden))
    for name in NORMS[1:]:
        shapes.update(_norm_shapes(name, width))
    shapes.update({f"{name}.weight": (width, hidden) for name in PROJECTIONS})
    shapes["type_embedding.weight"] = (3, width)
    for i in range(config["routing_layers"]):
        p = f"evidence_layers.{i}"
        for norm in ("query_norm", "memory_norm", "feedforward_norm"):
            shapes.update(_norm_shapes(f"{p}.{norm}", width))
        shapes.update(_attention_shapes(f"{p}.attention", width))
        shapes.update(_linear_shapes(f"{p}.feedforward.0", ff, width) | _linear_shapes(f"{p}.feedforward.3", width, ff))
    for i in range(config["layers"]):
        p = f"layers.{i}"
        for attention in ("self_attn", "multihead_attn"):
            shapes.update(_attention_shapes(f"{p}.{attention}", width))
        for norm in ("norm1", "norm2", "norm3"):
            shapes.update(_norm_shapes(f"{p}.{norm}", width))
        shapes.update(_linear_shapes(f"{p}.linear1", ff, width) | _linear_shapes(f"{p}.linear2", width, ff))
    shapes.update(_linear_shapes("residual_scorer.0", width, 4 * width) | _linear_shapes("residual_scorer.3", 1, width))
    return shapes


class ClefJointHead(RequestHead):
    """The head over one request's sequence; `request_logits` is what the causal-lm-joint engine calls."""

    def __init__(self, tensors: dict[str, torch.Tensor], config: dict, lm_head: torch.Tensor):
        self.t = tensors
        self.heads = config["heads"]
        self.routing_layers, self.layers = config["routing_layers"], config["layers"]
        self.lm_head = lm_head  # [vocab, hidden], rows gathered per option (the lexical prior), model dtype

    # ----- building blocks ----------------------------------------------------------------------
    def norm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        weight = self.t[f"{name}.weight"]
        return F.layer_norm(x, weight.shape, weight, self.t[f"{name}.bias"], 1e-5)

    def linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.t[f"{name}.weight"], self.t.get(f"{name}.bias"))

    def attend(self, name: str, queries: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        """Multi-head attention of queries [m, w] over memory [n, w] (packed in-projection, as torch's)."""
        wq, wk, wv = self.t[f"{name}.in_proj_weight"].chunk(3)
        bq, bk, bv = self.t[f"{name}.in_proj_bias"].chunk(3)
        width = queries.shape[-1]
        split = lambda x: x.reshape(x.shape[0], self.heads, width // self.heads).transpose(0, 1)  # noqa: E731
        q, k, v = split(F.linear(queries, wq, bq)), split(F.linear(memory, wk, bk)), split(F.linear(memory, wv, bv))
        weights = torch.softmax(q @ k.transpose(1, 2) / math.sqrt(width // self.heads), dim=-1)
        return self.linear(f"{name}.out_proj", (weights @ v).transpose(0, 1).reshape(queries.shape[0], width))

    def route(self, i: int, queries: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        p = f"evidence_layers.{i}"
        memory = self.norm(f"{p}.memory_norm", memory)
        queries = queries + self.attend(f"{p}.attention", self.norm(f"{p}.query_norm", queries), memory)
        hidden = F.gelu(self.linear(f"{p}.feedforward.0", self.norm(f"{p}.feedforward_norm", queries)))
        return queries + self.linear(f"{p}.feedforward.3", hidden)

    def decode(self, i: int, fields: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        p = f"layers.{i}"
        x = self.norm(f"{p}.norm1", fields)
        fields = fields + self.attend(f"{p}.self_attn", x, x)
        fields = fields + self.attend(f"{p}.multihead_attn", self.norm(f"{p}.norm2", fields), memory)
        return fields + self.linear(
            f"{p}.linear2", F.gelu(self.linear(f"{p}.linear1", self.norm(f"{p}.norm3", fields)))
        )

    def scale(self, name: str) -> torch.Tensor:
        return self.t[name].clamp(max=MAX_LOG_SCALE).exp()

    # ----- the request --------------------------------------------------------------------------
    def request_logits(self, hidden: torch.Tensor, prepared) -> list[torch.Tensor]:
        """One FP32 logit vector per question (its options in Clef's order), from the request's final
        hidden states [n, hidden] and its one sequence's ids."""
        ids = torch.tensor(prepared.prefix_ids + prepared.rows[0], dtype=torch.long, device=hidden.device)
        fields_layout = prepared.plan.fields
        h = self.norm("hidden_norm", hidden.to(torch.float32))
        memory = self.linear("memory_projection", h)
        g = h[-1]
        mean = lambda span: h[span[0] : span[1]].mean(0)  # noqa: E731
        questions = torch.stack([mean(f.question) for f in fields_layout])
        contexts = torch.stack([mean(s) for f in fields_layout for s in f.options])
        lexical = torch.stack(
            [self.lm_head[ids[s[0] : s[1]]].to(torch.float32).mean(0) for f in fields_layout for s in f.options]
        )
        counts = [len(f.options) for f in fields_layout]
        owner = torch.repeat_interleave(
            torch.arange(len(counts), device=h.device), torch.tensor(counts, device=h.device)
        )
        routed = (
            self.linear("option_context_projection", contexts)
            + self.linear("option_lexical_projection", lexical)
            + self.linear("option_question_projection", questions)[owner]
        )
        for i in range(self.routing_layers):
            routed = self.route(i, routed, memory)
        base = self.linear("question_projection", questions)
        summaries = []
        for field, options in zip(base, routed.split(counts)):
            weights = torch.softmax(options @ field / math.sqrt(options.shape[-1]), dim=0)
            summaries.append((weights[:, None] * options).sum(0))
        types = torch.tensor([f.type_id for f in fields_layout], device=h.device)
        fields = (
            base
            + self.norm("option_summary_norm", torch.stack(summaries))
            + self.linear("global_projection", g)
            + self.t["type_embedding.weight"][types]
        )
        for i in range(self.layers):
            fields = self.decode(i, fields, memory)
        fields = self.norm("field_norm", fields)[owner]
        options = self.norm("option_norm", routed)
        prior = self.scale("prior_logit_scale") * (
            F.normalize(lexical, dim=-1) * F.normalize(questions + g, dim=-1)[owner]
        ).sum(-1)
        cosine = F.cosine_similarity(fields, options, dim=-1)
        features = torch.cat([fields, options, fields * options, (fields - options).abs()], dim=-1)
        residual = self.linear("residual_scorer.3", F.gelu(self.linear("residual_scorer.0", features))).squeeze(-1)
        logits = prior + torch.sigmoid(self.t["residual_gate"]) * (self.scale("joint_logit_scale") * cosine + residual)
        return [piece.cpu() for piece in logits.split(counts)]
