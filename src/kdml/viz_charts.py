"""Plots of a 2-D atlas (Korman, Sec. A.2): one panel per chart, each point at its chart
coordinates, optionally drawn as its image thumbnail.

Uses matplotlib's object API with the Agg canvas (no pyplot, no display, no global backend
change).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle
from matplotlib.transforms import Bbox
from scipy.special import expit

from kdml.errors import KdmlError
from kdml.evaluation.knn import as_float32_matrix
from kdml.evaluation.labels import as_label_vector
from kdml.figure_file import literal_text, missing_glyphs_named, write_png
from kdml.viz_retrieval import pixel_array, short_name, unit_pixels

__all__ = ["chart_figure", "plot_charts"]

LEGEND_MAX_CLASSES = 20  # beyond, colours only tell neighbouring classes apart
THUMBNAIL_HALF_SIZE = 0.05  # at zoom 1 a thumbnail spans a tenth of the chart's side
BORDER = 0.06  # margin around [0, 1]^2, so that thumbnails of border points show whole


def _as_images(images: Any, num_points: int) -> Callable[[int], np.ndarray]:
    """Image ``i`` as a float array [H, W] (grayscale) or [H, W, 3] in [0, 1]
    (:func:`~kdml.viz_retrieval.unit_pixels`), from an array of all images or from a function
    that loads one (only the drawn ones are loaded)."""
    if callable(images):
        return lambda index: unit_pixels(_as_picture(images(index)[None], 1)[0])
    array = _as_picture(images, num_points)
    return lambda index: unit_pixels(array[index])


def _as_picture(images: Any, num_points: int) -> np.ndarray:
    array = pixel_array(images)
    if array.ndim == 4 and array.shape[1] in (1, 3):  # [N, C, H, W] -> [N, H, W, C]
        array = array.transpose(0, 2, 3, 1)
    if array.ndim == 4 and array.shape[-1] == 1:
        array = array[..., 0]
    # [N, H, W] grayscale or [N, H, W, 3]: 2 or 4 channels had been drawn as RGB(A) tiles, or
    # stopped in matplotlib with a traceback
    if len(array) != num_points or not (array.ndim == 3 or (array.ndim == 4
                                                            and array.shape[-1] == 3)):
        raise KdmlError(
            f"images must be [N, C, H, W] or [N, H, W] with N = {num_points} and 1 or 3 "
            f"channels, got shape {tuple(np.shape(images))}"
        )
    return array


def plot_charts(
    chart_coords: Any,
    chart_index: Any,
    labels: Any,
    path: str | Path,
    images: Any | None = None,
    max_thumbnails: int = 100,
    thumbnail_zoom: float = 1.0,
    seed: int = 0,
    class_names: dict[int, str] | None = None,
) -> Path:
    r"""Draw every non-empty chart of a :math:`d = 2` atlas as a panel (Sec. A.2).

    Each point is drawn in the panel of its argmax chart at
    :math:`\phi(x) = \sigma(\text{chart\_coords}) \in [0, 1]^2`, coloured by class. With
    ``images``, up to ``max_thumbnails`` points per panel (a seeded random choice) are also
    drawn as their image thumbnails, like the paper's figures.

    Args:
        chart_coords: :math:`(N, 2)` pre-sigmoid coordinates of the argmax charts.
        chart_index: :math:`(N,)` integer charts.
        labels: :math:`(N,)` integer labels (colours).
        path: the PNG to write (parent folders are created).
        images: optional :math:`(N, C, H, W)` or :math:`(N, H, W)` images in :math:`[0, 1]`
            (uint8 images in 0-255; other floats are drawn scaled to their own range),
            or a function ``index -> image`` (:math:`(C, H, W)` or :math:`(H, W)`) that loads
            only the images drawn.
        max_thumbnails: thumbnails per panel at most.
        thumbnail_zoom: size factor of the thumbnails; at 1 a thumbnail spans a tenth of
            the chart's side.
        seed: seed of the thumbnail choice.
        class_names: label -> name for the legend, drawn for up to 20 classes (by their
            numbers without it).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Raises:
        KdmlError: when the codes are not 2-D (:math:`d \ne 2`) or shapes disagree.

    Example::

        >>> import tempfile
        >>> codes = np.random.default_rng(0).standard_normal((30, 2))
        >>> charts, labels = np.arange(30) % 3, np.arange(30) % 5
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     plot_charts(codes, charts, labels, Path(folder) / "charts.png").name
        'charts.png'
    """
    with missing_glyphs_named(Path(path)):
        figure = chart_figure(chart_coords, chart_index, labels, images, max_thumbnails,
                              thumbnail_zoom, seed, class_names)
        return write_png(figure, Path(path))


@literal_text()  # class names, drawn as written
def chart_figure(
    chart_coords: Any,
    chart_index: Any,
    labels: Any,
    images: Any | None = None,
    max_thumbnails: int = 100,
    thumbnail_zoom: float = 1.0,
    seed: int = 0,
    class_names: dict[int, str] | None = None,
) -> Figure:
    """The figure :func:`plot_charts` saves, with the same arguments but ``path``: one panel
    (``Axes``) per non-empty chart, its limits ``[0, 1]^2`` plus a margin."""
    coords, _ = as_float32_matrix(chart_coords, "chart_coords")
    if coords.shape[1] != 2:
        raise KdmlError(
            f"plot_charts draws 2-D charts only (d = 2), got d = {coords.shape[1]}; "
            "train with method.dim=2"
        )
    charts = as_label_vector(chart_index, "chart_index", len(coords))
    label_vector = as_label_vector(labels, "labels", len(coords))
    if isinstance(max_thumbnails, bool) or not isinstance(max_thumbnails, numbers.Integral) or (
            max_thumbnails < 0):  # a negative one had sliced off all but |m| thumbnails
        raise KdmlError(f"max_thumbnails must be an integer >= 0, got {max_thumbnails!r}")
    if not (isinstance(thumbnail_zoom, numbers.Real) and math.isfinite(thumbnail_zoom)
            and thumbnail_zoom > 0):
        raise KdmlError(f"thumbnail_zoom must be a finite number > 0, got {thumbnail_zoom!r}")
    thumbnails = None if images is None else _as_images(images, len(coords))
    # phi in [0, 1]^2; scipy's sigmoid: exp(-c) overflowed (a warning) for c below -709
    points = expit(coords.astype(np.float64))

    classes = np.unique(label_vector)
    colour_map = "tab10" if len(classes) <= 10 else "tab20"
    colour_of = {label: position for position, label in enumerate(classes)}
    colour_scale = Normalize(0, max(len(classes) - 1, 1))
    shown = np.unique(charts)
    columns = math.ceil(math.sqrt(len(shown)))
    rows = math.ceil(len(shown) / columns)
    figure = Figure(figsize=(3.2 * columns, 3.2 * rows))
    canvas = FigureCanvasAgg(figure)
    legend: Legend | None = None
    rng = np.random.default_rng(seed)
    for position, chart in enumerate(shown):
        axes = figure.add_subplot(rows, columns, position + 1)
        members = np.flatnonzero(charts == chart)
        colours = [colour_of[label] for label in label_vector[members]]
        axes.scatter(points[members, 0], points[members, 1], c=colours, cmap=colour_map,
                     norm=colour_scale, s=8)
        if thumbnails is not None:
            chosen = rng.permutation(members)[:max_thumbnails]
            half = THUMBNAIL_HALF_SIZE * thumbnail_zoom
            for index in chosen:
                pixels = thumbnails(int(index))
                x, y = points[index]
                # imshow in data coordinates is clipped to the panel, so thumbnails of points
                # on the border (sigmoids saturate) cannot cover the title or the next panel
                axes.imshow(pixels, cmap="gray" if pixels.ndim == 2 else None, vmin=0.0,
                            vmax=1.0, extent=(x - half, x + half, y - half, y + half),
                            interpolation="nearest", zorder=3)
        axes.add_patch(Rectangle((0, 0), 1, 1, fill=False, edgecolor="0.6", linewidth=0.8))
        axes.set(xlim=(-BORDER, 1 + BORDER), ylim=(-BORDER, 1 + BORDER), xticks=[],
                 yticks=[], aspect="equal", title=f"chart {chart} ({len(members)} "
                 f"point{'s' * (len(members) != 1)})")
        if position == min(columns, len(shown)) - 1 and len(classes) <= LEGEND_MAX_CLASSES:
            # beside the first row's last panel, left out of the layout (which shrank the
            # panels to fit a long one, or gave up): the figure is widened for it below
            palette = matplotlib.colormaps[colour_map]
            names = class_names or {}
            handles = [Line2D([], [], marker="o", linestyle="", markersize=5,
                              color=palette(colour_scale(colour_of[label])),
                              label=short_name(names.get(int(label), str(label)), 24))
                       for label in classes]
            legend = axes.legend(handles=handles, title="class", fontsize=7, loc="upper left",
                                 bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
                                 ncols=2 if len(classes) > 12 else 1)
            legend.set_in_layout(False)
    figure.tight_layout()
    if legend is not None:
        _widen_for(figure, legend.get_window_extent(canvas.get_renderer()))
    return figure


def _widen_for(figure: Figure, box: Bbox) -> None:
    """Widen ``figure`` (and heighten it, for a legend taller than its panels) by the width of
    the legend's ``box`` (pixels), outside the panels on their right, so it is drawn whole."""
    width, height = figure.get_size_inches()
    params = figure.subplotpars
    wider = width + box.width / figure.dpi + 0.15
    # the legend hangs from the first panel's top, which stays this far below the figure's
    above = (1 - params.top) * height
    taller = max(height, above + box.height / figure.dpi + 0.1)
    # the panels keep the sizes and places in inches that tight_layout gave them
    figure.set_size_inches(wider, taller)
    figure.subplots_adjust(left=params.left * width / wider, right=params.right * width / wider,
                           bottom=1 - (1 - params.bottom) * height / taller,
                           top=1 - (1 - params.top) * height / taller)
