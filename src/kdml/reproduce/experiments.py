"""What a reproduction experiment is: trained cells, the metrics read from them, the paper's
numbers beside them, and the claims they test.

An :class:`Experiment` mirrors one table or figure of a paper on one dataset. Each of its
:class:`Cell` objects is one configuration (a recipe and ``key=value`` overrides), trained once
per seed. A :class:`Claim` compares two cells on one metric, paired by seed, and
:func:`verdict` says in one line whether the claim holds at this scale, and by how much.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from kdml.evaluation.estimate import Estimate

# How the cells of an experiment are scored beyond their run's own test metrics.
PROTOCOLS = ("test", "parts", "generalization")
# ``parts``: Recall@K within 10 disjoint parts of the test set (Chu et al. 2020, Table 2);
# ``generalization``: the same Recall@K (Table 3's, with 95% intervals) and lambda, d_H.
NUM_PARTS = 10
PARTS_KS = (1, 2, 4, 8)  # Table 2's Recall@K


@dataclass(frozen=True)
class Cell:
    """One configuration of an experiment.

    Args:
        label: its row name in the report, unique within the experiment.
        recipe: a kdml recipe.
        overrides: ``key=value`` settings on top of the recipe's defaults (and the
            experiment's ``common`` ones).
        paper: the paper's value of each metric for this row, as fractions (not percent).
        series: the line of a sweep plot this cell belongs to.
        x: its position on the sweep's x axis.
        plot_charts: draw the chart plot of its first seed (Atlas at d = 2).
    """

    label: str
    recipe: str
    overrides: tuple[str, ...] = ()
    paper: Mapping[str, float] = field(default_factory=dict)
    series: str = ""
    x: float | None = None
    plot_charts: bool = False


@dataclass(frozen=True)
class Claim:
    """The paper's claim that cell ``better`` beats cell ``worse`` on ``metric``."""

    text: str
    better: str
    worse: str
    metric: str
    lower_is_better: bool = False


@dataclass(frozen=True)
class Experiment:
    """One paper table or figure, on one dataset.

    Args:
        key: unique name, e.g. ``jrd-table2-mnist5k`` (``kdml reproduce --only``).
        paper: ``jrd``, ``atlas`` or ``dtml``.
        mirrors: the table or figure it mirrors, e.g. ``"Chu et al. 2020, Table 2"``.
        title: one line on what is compared.
        dataset: the ``data.dataset`` of every cell.
        cells: the configurations.
        metrics: the columns of the report's table.
        paper_data: what the paper's numbers were measured on.
        claims: the claims tested.
        protocol: one of :data:`PROTOCOLS`.
        common: overrides of every cell.
        sweep: x-axis label when the cells form a sweep (a PNG plot of its first metric
            only: R@1 of a Recall@K table).
        note: what the reader should know (a departure, why a number cannot match).
    """

    key: str
    paper: str
    mirrors: str
    title: str
    dataset: str
    cells: tuple[Cell, ...]
    metrics: tuple[str, ...]
    paper_data: str = ""
    claims: tuple[Claim, ...] = ()
    protocol: str = "test"
    common: tuple[str, ...] = ()
    sweep: str = ""
    note: str = ""

    def cell(self, label: str) -> Cell:
        for cell in self.cells:
            if cell.label == label:
                return cell
        raise KeyError(f"{self.key} has no cell {label!r}")


# How the report's tables and plots head each metric (Recall@K as R@K).
METRIC_NAMES = {
    "map@r": "MAP@R", "r_precision": "R-Prec.", "nmi": "NMI", "linear_accuracy": "linear acc.",
    "source_nn_accuracy": "source-NN acc.", "lambda": "lambda", "h_divergence": "d_H",
    "bound": "lambda + d_H", "lfw_accuracy": "LFW acc.",
}


def metric_name(name: str) -> str:
    """A metric's heading in the report and its plots: ``"R@1"``, ``"MAP@R"``."""
    if name.startswith("recall@"):
        return "R@" + name.split("@")[1]
    return METRIC_NAMES.get(name, name)


# Per-seed differences that vary by less than this are the same: scores are shares of
# thousands of queries, so real differences are 1e-4 or more, and float rounding 1e-12 or less
SAME = 1e-6


def finished(values: Sequence[float]) -> list[float]:
    """A cell's per-seed values without those of diverged runs (NaN)."""
    return [value for value in values if np.isfinite(value)]


def verdict(claim: Claim, better: Sequence[float], worse: Sequence[float]) -> str:
    """One line: does ``better`` beat ``worse`` (per-seed values, paired by seed)?

    The difference is paired by seed (the two runs of a seed share their data order and
    initial weights where the recipes allow) and judged by its 95% confidence interval: it
    holds when the interval lies above 0, does not hold when it lies below, and is not shown
    when it contains 0. A seed whose run diverged in either cell (NaN) is left out, and the
    line says so. One seed, or a difference the same in every seed (a degenerate interval of
    width 0), cannot be judged: the line gives the observed difference only.
    """
    if len(better) != len(worse):
        raise ValueError(f"one value per seed in each cell: {len(better)} against {len(worse)}")
    better_values, worse_values = np.asarray(better, float), np.asarray(worse, float)
    paired = np.isfinite(better_values) & np.isfinite(worse_values)
    left_out = _left_out(claim, better_values, worse_values, paired)
    sign = -1.0 if claim.lower_is_better else 1.0
    difference = sign * (better_values[paired] - worse_values[paired])
    count = len(difference)
    if not count:
        return "not testable: in every seed, one of the two runs diverged"
    estimate = Estimate.of(list(difference))
    direction = "lower" if claim.lower_is_better else "higher"
    opposite = "higher" if claim.lower_is_better else "lower"
    moved = direction if estimate.mean >= 0 else opposite
    if count < 2:  # the plain observed difference, in the direction it went
        observed = ("the two are equal" if abs(estimate.mean) <= SAME
                    else f"{claim.better} {moved} by {abs(estimate.mean):.3f}")
        return f"not testable with one seed ({observed}){left_out}"
    if np.ptp(difference) <= SAME:  # a t interval of width 0 is no evidence
        if abs(estimate.mean) <= SAME:
            return f"not shown: the two are equal in all {count} seeds{left_out}"
        return (f"not testable: {claim.better} is {moved} by the same "
                f"{abs(estimate.mean):.3f} in all {count} seeds, no spread to judge it "
                f"by{left_out}")
    if estimate.mean - estimate.ci95 > 0:
        # "higher by +0.031" keeps the sign of the difference it measures; "lower by +0.020"
        # read as a difference above 0 in the metric, so lower-is-better prints the amount
        shown = _interval(estimate.mean, estimate.ci95, not claim.lower_is_better)
        return f"holds: {claim.better} is {direction} by {shown}, {count} seeds{left_out}"
    if estimate.mean + estimate.ci95 < 0:
        return (f"does not hold: {claim.better} is {opposite} by "
                f"{_interval(-estimate.mean, estimate.ci95)}, {count} seeds{left_out}")
    # as measured (better minus worse): a sign flipped for lower-is-better would read wrongly
    measured = _interval(sign * estimate.mean, estimate.ci95, True)
    return (f"not shown: {claim.better} minus {claim.worse} is {measured}, {count} seeds, "
            f"within the seeds' spread{left_out}")


def _interval(mean: float, half_width: float, signed: bool = False) -> str:
    """``mean +- half_width`` at 3 decimals, or more (up to 6) where 3 would print the two
    equal, hiding on which side of 0 the interval ends, or either of them as 0."""
    def shown(value: float, digits: int) -> str:
        return f"{abs(value):.{digits}f}"

    if abs(mean) < 1e-9:  # differences summing to 0 leave float rounding, no difference
        mean = 0.0
    digits = 3
    while digits < 6 and (shown(mean, digits) == shown(half_width, digits)
                          or float(shown(mean, digits)) == 0 < abs(mean)
                          or float(shown(half_width, digits)) == 0 < half_width):
        digits += 1
    if float(shown(mean, digits)) == 0:
        mean = 0.0  # no "-0.000"
    return f"{mean:{'+' if signed else ''}.{digits}f} +- {half_width:.{digits}f}"


def _left_out(claim: Claim, better: np.ndarray, worse: np.ndarray, paired: np.ndarray) -> str:
    """``"; N seeds left out, where X diverged"`` for the seeds not ``paired``, or ``""``."""
    lost = ~paired
    if not lost.any():
        return ""
    diverged = [label for label, values in ((claim.better, better), (claim.worse, worse))
                if not np.isfinite(values[lost]).all()]
    count = int(lost.sum())
    return (f"; {count} seed{'s' if count > 1 else ''} left out, where "
            f"{' and '.join(diverged)} diverged")
