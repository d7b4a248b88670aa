"""Choosing an epoch by its validation scores: ``train.keep_best`` and ``train.patience``.

Both read the run's history (one row per epoch, with ``test/<metric>`` where the epoch was
evaluated), so a resumed run decides exactly as an uninterrupted one. Both need
``data.validation``: an epoch chosen on the test part would make the reported number one tuned
on the test classes. Higher scores are better (Recall@K, MAP@R, R-Precision, NMI, accuracy).
"""

from __future__ import annotations

import math
from typing import Any

from kdml.errors import KdmlError


def scores(history: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """``(epoch, score)`` of every evaluated epoch, in order."""
    key = f"test/{metric}"
    return [(row["epoch"], float(row[key])) for row in history if key in row]


def best_epoch(history: list[dict[str, Any]], metric: str) -> int | None:
    """The first epoch with the highest (finite) score; None before one is scored.

    >>> best_epoch([{"epoch": 1, "test/recall@1": 0.5}, {"epoch": 2},
    ...             {"epoch": 3, "test/recall@1": 0.7}, {"epoch": 4, "test/recall@1": 0.7}],
    ...            "recall@1")
    3
    """
    best, best_score = None, -math.inf
    for epoch, score in scores(history, metric):
        if score > best_score:  # NaN is never better
            best, best_score = epoch, score
    return best


def evaluations_since_best(history: list[dict[str, Any]], metric: str) -> int:
    """How many evaluations came after the best one (0 when the last one is the best)."""
    best = best_epoch(history, metric)
    return sum(epoch > best for epoch, _ in scores(history, metric)) if best is not None else 0


def patience_exhausted(history: list[dict[str, Any]], metric: str, patience: int) -> bool:
    """Early stopping: ``patience`` > 0 evaluations in a row have not beaten the best."""
    return patience > 0 and evaluations_since_best(history, metric) >= patience


def check_scored(row: dict[str, Any], metric: str) -> None:
    """A one-line error if an evaluated ``row`` lacks ``metric``."""
    scored = [key[5:] for key in row if key.startswith("test/")]
    if scored and metric not in scored:
        raise KdmlError(f"train.select_metric={metric!r} is not scored by this run; choose one "
                        f"of {', '.join(scored)}")
