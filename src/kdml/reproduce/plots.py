"""The report's sweep plots: one metric over a swept setting, a line per series, with 95%
confidence bars over seeds (matplotlib's object API, Agg canvas)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from kdml.errors import counted
from kdml.evaluation.estimate import Estimate
from kdml.reproduce.experiments import Experiment, finished, metric_name
from kdml.viz import figure_and_axes, save_figure


def plot_sweep(experiment: Experiment, values: dict[str, list[float]], metric: str,
               path: Path) -> Path:
    """``values[cell label]``: the per-seed values of ``metric``; cells without an ``x`` are
    left out. A cell whose series is ``""`` joins every series (a shared baseline)."""
    series: dict[str, list[tuple[float, Estimate]]] = {}
    shared = []
    for cell in experiment.cells:
        scores = finished(values.get(cell.label, []))
        if cell.x is None or not scores:  # no x, or every seed's run diverged
            continue
        point = (cell.x, Estimate.of(scores))
        if cell.series:
            series.setdefault(cell.series, []).append(point)
        else:
            shared.append(point)
    fig, ax = figure_and_axes()
    for name, points in series.items():
        points = sorted(points + shared, key=lambda point: point[0])
        x = [point[0] for point in points]
        mean = np.array([point[1].mean for point in points])
        # NaN (one seed: no interval) draws no bar, where 0 would draw a bar of no spread
        error = np.array([point[1].ci95 for point in points])
        ax.errorbar(x, mean, yerr=error, marker="o", capsize=3, label=name)
    # a tick at each swept value (d = 2, 4, 8 read off the axis, not 2.25, 2.5, ...)
    swept = sorted({point[0] for points in (*series.values(), shared) for point in points})
    ax.set_xticks(swept, [f"{x:g}" for x in swept])
    # kdml's runs, not the paper's figure, which its title alone had read as (the PNG is also
    # seen without the report); wrapped: a long one ran past the figure's edges
    title = "\n".join(textwrap.wrap(
        f"kdml's runs as {experiment.mirrors}: {experiment.dataset}", 60))
    ax.set(xlabel=experiment.sweep, title=title, ylabel=_value_label(metric, values))
    if len(series) > 1:
        ax.legend()
    return save_figure(fig, path)


def _value_label(metric: str, values: dict[str, list[float]]) -> str:
    """The y axis: the metric and what its points and bars are (one seed has no interval)."""
    seeds = max((len(finished(scores)) for scores in values.values()), default=0)
    spread = "mean" if seeds == 1 else "mean +- 95% CI"
    return f"{metric_name(metric)} ({spread} over {counted(seeds, 'seed')})"
