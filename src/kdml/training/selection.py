"""Choosing an epoch by its validation scores: ``train.keep_best`` and ``train.patience``.

Both read the run's history (one row per epoch, with ``val/<metric>`` where the epoch was
evaluated on the validation part), so a resumed run decides exactly as an uninterrupted one.
Both need ``data.validation``: an epoch chosen on the test part would make the reported number
one tuned on the test classes. A run without a validation part keys its scores ``test/``.
Higher scores are better (Recall@K, MAP@R, R-Precision, NMI, accuracy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kdml.errors import KdmlError

if TYPE_CHECKING:  # only for the annotation: plots import this module without the data code
    from kdml.data.splits import DataSplits

VALIDATION, TEST = "val", "test"
SCORED_PARTS = {VALIDATION: "validation", TEST: "test"}  # history prefix -> what it scores


def scored_prefix(splits: DataSplits) -> str:
    """The history key prefix of the scores a run records: ``val`` when it scores a
    validation part carved from its training classes, else ``test``."""
    return VALIDATION if splits.validation else TEST


def as_validation_history(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A validation run's history with every score keyed ``val/``: runs trained before the
    ``val/`` keys recorded their validation scores as ``test/``.

    >>> as_validation_history([{"epoch": 1, "train/loss": 2.0, "test/recall@1": 0.5}])
    [{'epoch': 1, 'train/loss': 2.0, 'val/recall@1': 0.5}]
    """
    prefix = f"{TEST}/"
    return [{(f"{VALIDATION}/{key[len(prefix):]}" if key.startswith(prefix) else key): value
             for key, value in row.items()} for row in history]


def part_scores(row: dict[str, Any], prefix: str = VALIDATION) -> dict[str, float]:
    """One history row's scores of a part (``val`` or ``test``), keyed by metric name.

    >>> part_scores({"epoch": 3, "train/loss": 0.2, "val/recall@1": 0.7}, "val")
    {'recall@1': 0.7}
    """
    return {key[len(prefix) + 1:]: value for key, value in row.items()
            if key.startswith(f"{prefix}/")}


def scores(history: list[dict[str, Any]], metric: str) -> list[tuple[int, float]]:
    """``(epoch, score)`` of every evaluated epoch, in order."""
    key = f"{VALIDATION}/{metric}"
    return [(row["epoch"], float(row[key])) for row in history if key in row]


def best_epoch(history: list[dict[str, Any]], metric: str) -> int | None:
    """The first epoch with the highest (finite) score; None before one is scored.

    >>> best_epoch([{"epoch": 1, "val/recall@1": 0.5}, {"epoch": 2},
    ...             {"epoch": 3, "val/recall@1": 0.7}, {"epoch": 4, "val/recall@1": 0.7}],
    ...            "recall@1")
    3
    """
    best, best_score = None, -math.inf
    for epoch, score in scores(history, metric):
        if score > best_score:  # NaN is never better
            best, best_score = epoch, score
    return best


def best_scores(history: list[dict[str, Any]], metric: str) -> dict[str, float] | None:
    """Every validation score of the best epoch by ``metric`` (the epoch ``train.keep_best``
    keeps), keyed without the ``val/`` prefix; None before one is scored.

    >>> best_scores([{"epoch": 1, "val/recall@1": 0.5, "val/map@r": 0.3},
    ...              {"epoch": 2, "val/recall@1": 0.4, "val/map@r": 0.4}], "recall@1")
    {'recall@1': 0.5, 'map@r': 0.3}
    """
    best = best_epoch(history, metric)
    if best is None:
        return None
    return part_scores(next(row for row in history if row["epoch"] == best))


def evaluations_since_best(history: list[dict[str, Any]], metric: str) -> int:
    """How many evaluations came after the best one (0 when the last one is the best)."""
    best = best_epoch(history, metric)
    return sum(epoch > best for epoch, _ in scores(history, metric)) if best is not None else 0


def patience_exhausted(history: list[dict[str, Any]], metric: str, patience: int) -> bool:
    """Early stopping: ``patience`` > 0 evaluations in a row have not beaten the best."""
    return patience > 0 and evaluations_since_best(history, metric) >= patience


def check_scored(row: dict[str, Any], metric: str) -> None:
    """A one-line error if an evaluated ``row`` lacks ``metric``."""
    scored = list(part_scores(row))
    if scored:
        check_selectable(metric, scored)


def check_selectable(metric: str, scored: Sequence[str]) -> None:
    """A one-line error if ``metric`` is not among the ``scored`` metric names: training
    checks this before its first epoch, from the names the evaluator will give
    (:func:`kdml.evaluation.evaluator.metric_names`), so a typo costs no epoch.

    >>> check_selectable("map@r", ["recall@1", "map@r"])
    """
    if metric not in scored:
        raise KdmlError(f"train.select_metric={metric!r} is not scored by this run; choose one "
                        f"of {', '.join(scored)}")
