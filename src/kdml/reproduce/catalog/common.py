"""What the catalog's papers share: Recall@K's columns and the papers' numbers as fractions."""

from __future__ import annotations

RECALL_AT = ("recall@1", "recall@2", "recall@4", "recall@8")


def percent(*values: float) -> tuple[float, ...]:
    """A paper's percentages as the fractions kdml's metrics are (rounded off float noise)."""
    return tuple(round(value / 100, 6) for value in values)


def paper_values(metrics: tuple[str, ...], values: tuple[float, ...]) -> dict[str, float]:
    """A row of a paper's table as a cell's ``paper`` column: each metric with its value."""
    return dict(zip(metrics, values, strict=True))
