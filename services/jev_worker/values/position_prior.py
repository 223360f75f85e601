"""PriDe's prior over option positions: estimated once from all cyclic shifts of a fixed calibration set's choices,
then used to debias every single-pass choice answer (the request's x_coherence `prior`).

Zheng, Zhou, Meng, Zhou, Huang, "Large Language Models Are Not Robust Multiple Choice Selectors", ICLR 2024, Sec. 3
(PriDe). The observed distribution over the option codes (positions) d_i of a question q with options x is read as
P_obs(d_i | q, x) = P_prior(d_i | q) * P_debiased(o_{f(i)} | q, x) / Z. For one question asked under every cyclic
shift I of its n options:

    P_prior(d_i | q) = softmax_i( (1/n) * sum_I log P_obs(d_i | q, x^I) )           (the paper's Eq. 4)

(the content term sum_I log P_debiased(o_{f_I(i)} | q, x) is the same for every i, because each option stands at
each position exactly once, so the softmax cancels it); the model's prior for n options is the mean over the
calibration set's n-option questions (Eq. 5), and each later single-pass answer is

    P_debiased(o at position i | q, x) = P_obs(d_i | q, x) / P_prior(d_i), renormalised        (Eq. 6),

that is softmax(logits - log P_prior). A prior exists only for the option counts the calibration set covers with
all of their shifts (2..MAX_SHIFTS: past it cyclic uses a subset of shifts and the content term no longer cancels).

The set is fixed and committed, never live traffic: answers do not drift over time, do not differ between
replicas, and carry no tenant's requests into another's answers. `python -m tools.calibrate_prior` computes the
block through the worker's own engine; it is stored with the calibration (the checkpoint's decision_config.json,
or the file a recipe names when its checkpoint folder is read-only) and checked against what it was estimated
under (the checkpoint and the prompt layout), so a stale prior is not applied.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

import torch

SUM_TOLERANCE = 1e-4  # a stored prior's entries must sum to 1 within this


def question_prior(log_probs: list[list[float]]) -> list[float]:
    """Eq. 4 for one question: `log_probs[s][i]` = log P_obs(position i) with the options shifted by s, for every
    one of the n shifts; -> softmax over positions of the mean log-probability."""
    n = len(log_probs)
    if n < 2 or any(len(row) != n for row in log_probs):
        raise ValueError(f"PriDe's prior needs every cyclic shift of the options: {n} rows of {n} positions")
    mean = [sum(row[i] for row in log_probs) / n for i in range(n)]
    top = max(mean)
    weights = [math.exp(m - top) for m in mean]
    total = sum(weights)
    return [w / total for w in weights]


def estimate(questions: list[list[list[float]]]) -> dict[int, list[float]]:
    """Eq. 5: per option count, the mean over the calibration questions of their Eq. 4 priors."""
    by_count: dict[int, list[list[float]]] = {}
    for log_probs in questions:
        by_count.setdefault(len(log_probs), []).append(question_prior(log_probs))
    return {n: [sum(p[i] for p in priors) / len(priors) for i in range(n)] for n, priors in sorted(by_count.items())}


def layout_digest(readout: str, recipe: Any, calibration: Any) -> str:
    """What a prior was estimated under, beside the checkpoint: the readout, the prompt, the verbalizer (option
    codes) and the choice calibration applied before the softmax. A prior whose digest differs is not applied."""
    blob = json.dumps(
        {
            "readout": readout,
            "prompt": recipe.prompt.model_dump(mode="json"),
            "verbalizer": recipe.verbalizer.model_dump(mode="json"),
            "choice_calibration": calibration.describe_type("choice"),
        },
        sort_keys=True,
    )
    return "sha256:" + hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class PositionPrior:
    priors: dict[int, tuple[float, ...]]  # option count -> prior over positions (code order)
    calibration_set: dict[str, Any] = field(default_factory=dict)  # name, sha256 of the JSONL, questions
    checkpoint: str | None = None  # the identity it was estimated on (checked for a prior kept outside the checkpoint)
    layout: str | None = None  # layout_digest() it was estimated under
    source: str | None = None

    @classmethod
    def from_config(cls, block: object, source: str) -> PositionPrior:
        from jev_common.checkpoint_files import ServingError

        if not isinstance(block, dict) or not isinstance(block.get("priors"), dict) or not block["priors"]:
            raise ServingError(f"{source}: position_prior must be an object with `priors` {{option count: [p, ...]}}")
        priors = {}
        for key, values in block["priors"].items():
            n = int(key) if str(key).isdigit() else 0
            if (
                n < 2
                or not isinstance(values, list)
                or len(values) != n
                or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                    for v in values
                )
                or abs(sum(values) - 1) > SUM_TOLERANCE
            ):
                raise ServingError(
                    f"{source}: position_prior.priors[{key!r}] must be {key} positive numbers summing "
                    f"to 1 (an option count of at least 2)"
                )
            priors[n] = tuple(float(v) for v in values)
        calibration_set = block.get("calibration_set") or {}
        if not isinstance(calibration_set, dict) or not calibration_set.get("sha256"):
            raise ServingError(
                f"{source}: position_prior.calibration_set must name the set it was estimated on (its sha256)"
            )
        return cls(priors, dict(calibration_set), block.get("checkpoint"), block.get("layout"), source)

    def to_config(self) -> dict[str, Any]:
        return {
            "method": "PriDe (Zheng et al., ICLR 2024), Eq. 4-5: every cyclic shift of each calibration choice",
            "priors": {str(n): [round(p, 6) for p in prior] for n, prior in sorted(self.priors.items())},
            "calibration_set": self.calibration_set,
            "checkpoint": self.checkpoint,
            "layout": self.layout,
        }

    def covers(self, n: int) -> bool:
        return n in self.priors

    def counts(self) -> str:
        counts = sorted(self.priors)
        contiguous = counts == list(range(counts[0], counts[-1] + 1))
        return f"{counts[0]}..{counts[-1]}" if contiguous and len(counts) > 2 else ", ".join(map(str, counts))

    def debias(self, logits: torch.Tensor) -> torch.Tensor:
        """Eq. 6 in logit space: softmax(logits - log prior) = P_obs / prior, renormalised."""
        prior = torch.tensor(self.priors[logits.shape[-1]], dtype=torch.float32, device=logits.device)
        return logits.to(torch.float32) - prior.log()

    def mismatch(self, checkpoint: str | None, layout: str) -> str | None:
        """Why this prior does not fit what is served (None: it fits). `checkpoint` None: not checked (the prior is
        stored inside the checkpoint, whose content digest would include the prior itself)."""
        if checkpoint is not None and self.checkpoint != checkpoint:
            return f"it was estimated on {self.checkpoint!r}, this worker serves {checkpoint!r}"
        if self.layout != layout:
            return "it was estimated under another prompt layout or calibration (its layout digest differs)"
        return None

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "option_counts": self.counts(),
            "calibration_set": self.calibration_set,
            "priors": {str(n): [round(p, 4) for p in prior] for n, prior in sorted(self.priors.items())},
        }
