"""OmniJev's trained heads (OmniJev `mso/head.py` as exported to `heads.safetensors`), in FP32.

`head.*` is the OptionScorer with softmax normalisation: gated option and question MLPs
(Linear -> exact GELU -> Linear, `head.opt.{0,2}`, `head.que.{0,2}`), the six LM features entering
both the gated representation (`head.feat`) and the logit (`head.feat_lin`), `head.score`, a per-type
temperature `head.log_tau` [3] (noul 0, choice 1, score 2) and, for choice and score, the abstain
logit `head.abstain` from the gate. `ord.*` is the cumulative-link OrdinalScoreHead
(`ord.z.{0,2}`, `ord.cut.{0,2}`): P(Y <= l) = sigmoid(theta_l - z), theta_0 = cut(u_0),
theta_l = theta_0 + sum softplus(cut(u_1..l)). Widths are read from the tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from jev_common.checkpoint_files import ServingError

TYPE_IDS = {"noul": 0, "choice": 1, "score": 2}
FEATURES = 6
MLPS = ("head.opt", "head.que", "ord.z", "ord.cut")
LINEARS = ("head.score", "head.abstain", "head.feat", "head.feat_lin")
TENSORS = (
    tuple(f"{m}.{i}.{p}" for m in MLPS for i in (0, 2) for p in ("weight", "bias"))
    + tuple(f"{m}.{p}" for m in LINEARS for p in ("weight", "bias"))
    + ("head.log_tau",)
)


def lm_features(picked: list[torch.Tensor], first: list[float | None]) -> torch.Tensor:
    """[K, 6] from each option's text-token log-probabilities: sum / 10, mean, count / 10, the sums'
    log-softmax across the question's options (an option without text counts -1e4), the first
    token's log-probability from the question's last position, has-text."""
    sums = torch.stack([p.sum() if p.numel() else torch.zeros(()) for p in picked]).float()
    masked = torch.where(torch.tensor([p.numel() > 0 for p in picked]), sums, torch.full_like(sums, -1e4))
    share = masked - torch.logsumexp(masked, 0)
    rows = []
    for p, s, sh, f in zip(picked, sums, share, first):
        n = p.numel()
        rows.append(
            torch.stack(
                [
                    s / 10,
                    s / n if n else torch.zeros(()),
                    torch.tensor(n / 10),
                    sh,
                    torch.tensor(0.0 if f is None else f),
                    torch.tensor(float(n > 0)),
                ]
            )
        )
    return torch.stack(rows).float()


class OmniJevHeads:
    def __init__(self, tensors: dict[str, torch.Tensor], hidden: int):
        missing = [name for name in TENSORS if name not in tensors]
        if missing:
            raise ServingError(f"heads.safetensors has no {', '.join(missing[:4])}")
        self.t = {name: tensors[name].to(torch.float32) for name in TENSORS}
        for mlp in MLPS:
            if self.t[f"{mlp}.0.weight"].shape[1] != hidden:
                raise ServingError(
                    f"heads.safetensors: {mlp}.0.weight is {list(self.t[f'{mlp}.0.weight'].shape)}, "
                    f"its input must be the backbone's hidden size {hidden}"
                )
        if tuple(self.t["head.log_tau"].shape) != (3,) or self.t["head.feat.weight"].shape[1] != FEATURES:
            raise ServingError("heads.safetensors: head.log_tau must be [3] and head.feat take 6 features")

    def _linear(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.t[f"{name}.weight"], self.t[f"{name}.bias"])

    def _mlp(self, name: str, x: torch.Tensor) -> torch.Tensor:
        return self._linear(f"{name}.2", F.gelu(self._linear(f"{name}.0", x)))

    def option_logits(self, u: torch.Tensor, zq: torch.Tensor, type_id: int, feats: torch.Tensor) -> torch.Tensor:
        """[K option logits, abstain] (choice, score) or [logit, 0] (noul), over the type's temperature."""
        gate = torch.tanh(self._mlp("head.que", zq))
        h = self._mlp("head.opt", u) * gate[None, :] + self._linear("head.feat", feats)
        tau = torch.exp(self.t["head.log_tau"][type_id])
        logits = (self._linear("head.score", h).squeeze(-1) + self._linear("head.feat_lin", feats).squeeze(-1)) / tau
        last = self._linear("head.abstain", gate) / tau if type_id != 0 else torch.zeros(1)
        return torch.cat([logits, last.reshape(1)])

    def ordinal(self, zq: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """The levels' probabilities (caller's order), each at least 1e-8."""
        z = self._mlp("ord.z", zq).squeeze(-1)
        raw = self._mlp("ord.cut", u).squeeze(-1)
        theta = raw[0] + torch.cat([torch.zeros(1), torch.cumsum(F.softplus(raw[1:]), 0)])
        cdf = torch.sigmoid(theta - z)
        cdf = torch.cat([cdf[:-1], torch.ones(1)])
        return torch.cat([cdf[:1], cdf[1:] - cdf[:-1]]).clamp(min=1e-8)
