"""The Vela 2.0 packages' optional Noul calibration: `calibration.json` `noul_calibration` {T, b, default}.

P(yes) becomes sigmoid(logit(p) / T + b), p clipped to [1e-12, 1 - 1e-12], when the package's `default` is true or
the recipe's `serving.options.noul_calibration` turns it on (false turns it off); without the block, P(yes) as is
(vLLM Semantic Router `families/vela2/calibration.py` @ 4ac45f7c `Calibration.noul` / `noul_default`, and
`family.py` @ 054fada1: the model option `noul_calibration`, else the package's default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from jev_common.checkpoint_files import ServingError

BLOCK = "noul_calibration"


@dataclass(frozen=True)
class NoulFit:
    temperature: float
    bias: float

    @classmethod
    def read(cls, calibration: dict, option: bool | None) -> NoulFit | None:
        """The fit to apply (None: P(yes) as is), from calibration.json and the recipe's option."""
        if option is not None and not isinstance(option, bool):
            raise ServingError(f"serving.options.noul_calibration must be true, false or unset, got {option!r}")
        block = calibration.get(BLOCK)
        if not block:
            return None
        temperature, bias, default = block.get("T"), block.get("b"), block.get("default", False)
        for name, value in (("T", temperature), ("b", bias)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ServingError(f"calibration.json: {BLOCK}.{name} must be a finite number, got {value!r}")
        if temperature <= 0 or not isinstance(default, bool):
            raise ServingError(f"calibration.json: {BLOCK} needs a positive T and a boolean default, got {block!r}")
        on = default if option is None else option
        return cls(float(temperature), float(bias)) if on else None

    def apply(self, probability: float) -> float:
        p = min(max(probability, 1e-12), 1.0 - 1e-12)
        logit = math.log(p) - math.log1p(-p)
        return 1.0 / (1.0 + math.exp(-(logit / self.temperature + self.bias)))

    def describe(self) -> dict:
        return {"T": self.temperature, "b": self.bias}
