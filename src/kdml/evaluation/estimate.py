"""A mean with the half-width of its 95% confidence interval (Student t), for results
repeated over random splits, test parts or seeds."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats


@dataclass(frozen=True)
class Estimate:
    """Mean over repeats and the half-width of its 95% confidence interval (Student t;
    ``nan`` for a single value)."""

    mean: float
    ci95: float
    values: tuple[float, ...]

    @classmethod
    def of(cls, values: list[float]) -> Estimate:
        array = np.asarray(values, dtype=np.float64)
        if len(array) < 2:
            return cls(float(array.mean()), float("nan"), tuple(values))
        sem = array.std(ddof=1) / np.sqrt(len(array))
        return cls(float(array.mean()), float(stats.t.ppf(0.975, len(array) - 1) * sem),
                   tuple(float(v) for v in values))

    def to_dict(self) -> dict[str, object]:
        return {"mean": self.mean, "ci95": self.ci95, "values": list(self.values)}
