"""Plots written into run folders.

matplotlib's object API with the Agg canvas, as the other plots of kdml: no display, no pyplot
(whose figures live in a global registry until closed) and no change of the backend of a
program that imports kdml (``matplotlib.use("Agg")`` here had switched a notebook's)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from kdml.errors import KdmlError
from kdml.figure_file import agg_figure, write_png
from kdml.models.method import DIAGNOSTIC_TERMS
from kdml.training.selection import SCORED_PARTS, TEST, VALIDATION


def plot_training(history: list[dict[str, Any]], folder: Path) -> list[Path]:
    """``loss.png`` (every training loss term per epoch), ``diagnostics.png`` (the logged
    terms that are not losses, such as Atlas's ``q_max``, where a recipe logs them) and
    ``recall.png`` (Recall@K and MAP@R, and a domain pair's ``source_nn_accuracy``, at the
    evaluated epochs: of the test part, or of the validation part when the run scores one).
    Returns the paths written. A plot whose path holds a file kdml did not draw is skipped and
    the others still drawn; a :class:`~kdml.errors.KdmlError` then names it."""
    folder.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    refused: list[str] = []

    def save(fig: Figure, name: str) -> None:
        try:
            written.append(save_figure(fig, folder / name))
        except KdmlError as error:
            refused.append(str(error))

    epochs = [row["epoch"] for row in history]
    # every row's keys: the last epoch may not be scored (train.eval_every) when a run stops
    keys = list(dict.fromkeys(key for row in history for key in row))
    terms = [k for k in keys if k.startswith("train/")]
    for names, name, label, title in (
            ([k for k in terms if k[6:] not in DIAGNOSTIC_TERMS], "loss.png",
             "training loss (epoch mean)", "Training loss"),
            ([k for k in terms if k[6:] in DIAGNOSTIC_TERMS], "diagnostics.png",
             "value (epoch mean)", "Training diagnostics")):
        if not names:
            continue
        fig, ax = figure_and_axes()
        for key in names:
            ax.plot(epochs, [row.get(key, math.nan) for row in history], marker="o",
                    label=key[6:])
        ax.set(xlabel="epoch", ylabel=label, title=title)
        _whole_epochs(ax, epochs)
        ax.legend()
        save(fig, name)
    prefix = VALIDATION if any(k.startswith(f"{VALIDATION}/") for k in keys) else TEST
    # with a domain pair's source_nn_accuracy, the score DTML's paper (and kdml reproduce's
    # claims) judge a transfer by
    metric_keys = [k for k in keys
                   if k.startswith(f"{prefix}/recall@")
                   or k in (f"{prefix}/map@r", f"{prefix}/source_nn_accuracy")]
    if metric_keys:
        part = SCORED_PARTS[prefix]
        fig, ax = figure_and_axes()
        for key in metric_keys:
            points = [(row["epoch"], row[key]) for row in history if key in row]
            ax.plot(*zip(*points, strict=True), marker="o", label=key.split("/", 1)[1])
        ax.set(xlabel="epoch", ylabel=f"{part} metric", title=f"{part.capitalize()} retrieval",
               ylim=(0, 1))
        _whole_epochs(ax, [row["epoch"] for row in history
                           if any(key in row for key in metric_keys)])
        ax.legend()
        save(fig, "recall.png")
    if refused:
        raise KdmlError("; ".join(refused))
    return written


def figure_and_axes(figsize: tuple[float, float] = (6, 4)) -> tuple[Figure, Axes]:
    """A figure of ``figsize`` inches on an Agg canvas, and its one axes."""
    fig = agg_figure(*figsize)
    return fig, fig.subplots()


def _whole_epochs(ax: Axes, epochs: list[int]) -> None:
    """Tick ``ax``'s x axis at whole epochs only (not 1.5). A lone epoch (a one-epoch run, or
    the scores of a run scored once) is ticked itself: matplotlib pads a single point by 5%
    (0.945 to 1.055), a range without a whole number, where the integer locator had fallen
    back to ticks such as 0.960 and 1.005."""
    if len(set(epochs)) == 1:
        ax.set_xticks(epochs[:1])
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_figure(fig: Figure, path: Path) -> Path:
    """Lay ``fig`` out and write it to ``path`` (see :func:`~kdml.figure_file.write_png`)."""
    fig.tight_layout()
    return write_png(fig, path)
