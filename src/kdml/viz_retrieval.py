"""Pictures of a trained embedding: a grid of queries and their nearest test images (hits and
misses marked, as DML papers show retrieval) and a 2-D map of the test embeddings by class.

matplotlib's object API with the Agg canvas: no display, no global backend change.
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
from matplotlib.figure import Figure

from kdml.errors import KdmlError
from kdml.evaluation.knn import as_float32_matrix
from kdml.evaluation.labels import as_label_vector
from kdml.figure_file import agg_figure, literal_text, missing_glyphs_named, write_png

HIT, MISS = "#1a9850", "#d73027"

# Characters of the embedding map's title to a line: its 6-inch figure fits about 60 at
# matplotlib's default 12-point title.
TITLE_WIDTH = 56


# Floats this far outside [0, 1] are rounding (a resize's overshoot), drawn clipped.
PIXEL_ROUNDING = 1e-3


def pixel_array(images: Any) -> np.ndarray:
    """Images (a NumPy array or a torch tensor, of any dtype) as a NumPy array: uint8 kept as
    uint8 (0-255), anything else as float32."""
    if hasattr(images, "detach"):  # a tensor: torch's half and bfloat16 have no NumPy dtype
        images = images.detach().cpu()
        images = images if images.dtype == torch.uint8 else images.float()
    array = np.asarray(images)
    return array if array.dtype == np.uint8 else array.astype(np.float32)


def unit_pixels(image: np.ndarray) -> np.ndarray:
    """One image's pixels in [0, 1], for imshow's fixed range (vmin 0, vmax 1): uint8 divided
    by 255, floats in [0, 1] as they are, and other floats (0-255 values, or normalised
    inputs, in a user's npz, which kdml trains on as they come) scaled by their own minimum
    and maximum, as imshow scales a grayscale image by default. Clipping them to [0, 1] had
    drawn 0-255 images white, without a word. A flat image is clipped."""
    if image.dtype == np.uint8:
        return image.astype(np.float32) / 255.0
    finite = image[np.isfinite(image)]
    low, high = (finite.min(), finite.max()) if finite.size else (0.0, 1.0)
    if (low >= -PIXEL_ROUNDING and high <= 1.0 + PIXEL_ROUNDING) or high == low:
        return np.clip(image, 0.0, 1.0)  # a flat image has no range of its own: clipped
    return ((image - low) / (high - low)).astype(np.float32)


def _picture(image: Any) -> tuple[np.ndarray, str | None]:
    """[C, H, W] or [H, W] (:func:`unit_pixels`) -> an array imshow takes, and its colour
    map."""
    array = pixel_array(image)
    if array.ndim == 3 and array.shape[0] in (1, 3):
        array = array.transpose(1, 2, 0)
    if array.ndim == 3 and array.shape[2] == 1:
        array = array[..., 0]
    if not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] == 3)):
        raise KdmlError(f"cannot draw a sample of shape {tuple(np.shape(image))} as an image "
                        "([C, H, W] or [H, W, C] with 1 or 3 channels, or [H, W])")
    return unit_pixels(array), "gray" if array.ndim == 2 else None


def plot_retrieval_grid(queries: np.ndarray, neighbours: np.ndarray, hits: np.ndarray,
                        image: Callable[[int], Any], path: Path,
                        titles: Callable[[int], str] | None = None,
                        gallery: tuple[Callable[[int], Any], Callable[[int], str] | None]
                        | None = None) -> Path:
    """One row per query: the query image, then its nearest neighbours, each framed green
    (same class) or red (another class).

    Args:
        queries: ``[Q]`` dataset positions of the queries.
        neighbours: ``[Q, K]`` dataset positions of their nearest neighbours, nearest first;
            -1 where a query has fewer (an Atlas chart of fewer images), drawn empty.
        hits: ``[Q, K]`` bool, the neighbour has the query's class.
        image: position -> image ``[C, H, W]`` or ``[H, W]`` in [0, 1] (:func:`unit_pixels`).
        path: the PNG to write.
        titles: position -> a short caption (e.g. the class).
        gallery: ``(image, titles)`` of the neighbours where they are positions of another
            set than the queries (a gallery); by default the queries' own.
    """
    queries, neighbours, hits = _grid_arrays(queries, neighbours, hits)
    with missing_glyphs_named(path):  # the captions may hold class or file names
        figure = _retrieval_grid_figure(queries, neighbours, hits, (image, titles),
                                        gallery or (image, titles))
        return write_png(figure, path)


def _grid_arrays(queries: Any, neighbours: Any, hits: Any
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The grid's arrays, checked: ``[Q]`` and ``[Q, K]`` integer positions, ``[Q, K]`` hits
    (a mismatch had stopped in an IndexError, an empty grid in Pillow's ValueError)."""
    queries, neighbours, hits = np.asarray(queries), np.asarray(neighbours), np.asarray(hits)
    if queries.ndim != 1 or not len(queries) or queries.dtype.kind not in "iu":
        raise KdmlError(f"queries must be a non-empty [Q] array of integer positions, got "
                        f"shape {queries.shape} of {queries.dtype}")
    if neighbours.ndim != 2 or len(neighbours) != len(queries) or (
            neighbours.dtype.kind not in "iu"):
        raise KdmlError(f"neighbours must be [Q, K] integer positions with Q = {len(queries)}, "
                        f"got shape {neighbours.shape} of {neighbours.dtype}")
    if hits.shape != neighbours.shape:
        raise KdmlError(f"hits must have the neighbours' shape {neighbours.shape}, got "
                        f"{hits.shape}")
    return queries, neighbours, hits.astype(bool)


@literal_text()  # class names and paths, drawn as written
def _retrieval_grid_figure(queries: np.ndarray, neighbours: np.ndarray, hits: np.ndarray,
                           own: tuple[Callable[[int], Any], Callable[[int], str] | None],
                           gallery: tuple[Callable[[int], Any], Callable[[int], str] | None]
                           ) -> Figure:
    """The figure of :func:`plot_retrieval_grid`: ``own`` loads and captions the queries,
    ``gallery`` their neighbours."""
    (image, titles), (neighbour_image, neighbour_titles) = own, gallery
    rows, columns = neighbours.shape[0], neighbours.shape[1] + 1
    figure = agg_figure(1.3 * columns, 1.45 * rows)
    for row, query in enumerate(queries):
        for column, position in enumerate([query, *neighbours[row]]):
            load, caption_of = (image, titles) if column == 0 else (neighbour_image,
                                                                    neighbour_titles)
            axes = figure.add_subplot(rows, columns, row * columns + column + 1)
            if position < 0:  # nothing more to find: its chart holds no more images
                axes.axis("off")
                continue
            pixels, colour_map = _picture(load(int(position)))
            axes.imshow(pixels, cmap=colour_map, vmin=0.0, vmax=1.0)
            axes.set_xticks([])
            axes.set_yticks([])
            colour, width = "black", 1.0
            if column:
                colour, width = (HIT if hits[row, column - 1] else MISS), 3.0
            for spine in axes.spines.values():
                spine.set_edgecolor(colour)
                spine.set_linewidth(width)
            caption = "query" if column == 0 else f"{column}"
            if caption_of is not None:
                caption = f"{caption}: {caption_of(int(position))}"
            axes.set_title(caption, fontsize=7)
    figure.tight_layout()
    return figure


def embedding_map(embeddings: np.ndarray, seed: int = 0) -> tuple[np.ndarray, str]:
    """2-D coordinates of ``embeddings`` [N, d]: UMAP when ``umap-learn`` is installed, else
    scikit-learn's t-SNE; and the method's name. At least 3 points (t-SNE's perplexity)."""
    if embeddings.ndim != 2 or len(embeddings) < 3:
        raise KdmlError(f"embedding_map needs embeddings [N, d] with N >= 3, got shape "
                        f"{tuple(embeddings.shape)}")
    if embeddings.shape[1] == 2:
        return embeddings, "the embedding itself (d = 2)"
    try:
        import umap  # optional: not a dependency of kdml
    except ImportError:
        from sklearn.manifold import TSNE

        perplexity = float(min(30.0, max(2.0, (len(embeddings) - 1) / 3)))
        coordinates = TSNE(n_components=2, init="pca", perplexity=perplexity,
                           random_state=seed).fit_transform(embeddings)
        return coordinates, "t-SNE"
    return umap.UMAP(n_components=2, random_state=seed).fit_transform(embeddings), "UMAP"


def short_name(name: str, width: int = 16) -> str:
    """``name`` cut to ``width`` characters (an ellipsis marks a cut), for captions.

    >>> short_name("Black footed Albatross", 12)
    'Black foote…'
    """
    return name if len(name) <= width else name[: width - 1] + "…"


def plot_embedding_map(coordinates: np.ndarray, labels: np.ndarray, path: Path,
                       method: str, title: str,
                       class_names: dict[int, str] | None = None,
                       sample_of: tuple[int, int] | None = None) -> Path:
    """Scatter of 2-D ``coordinates`` ``[N, 2]``, coloured by class (``labels`` ``[N]``); the
    legend, drawn for up to 20 classes, names them by ``class_names`` (label -> name) or by
    their numbers. ``sample_of``: ``(points, classes)`` of the whole set where the points are
    a random sample of it, which the title then says (:func:`counted_points`)."""
    coordinates, _ = as_float32_matrix(coordinates, "coordinates")  # NaN: a blank picture
    if coordinates.shape[1] != 2:
        raise KdmlError(f"coordinates must be [N, 2], got {coordinates.shape}; map them to 2-D "
                        "first (embedding_map)")
    labels = as_label_vector(labels, "labels", len(coordinates))
    with missing_glyphs_named(path):  # the legend may hold class names
        figure = _embedding_map_figure(coordinates, labels, method, title, class_names,
                                       sample_of)
        return write_png(figure, path)


def counted_points(labels: np.ndarray, sample_of: tuple[int, int] | None = None) -> str:
    """The map title's count of what it draws: its classes (``labels`` ``[N]``; -1, a domain
    pair's unlabelled sample, is no class) and, where the points are a random sample of a set
    of ``sample_of`` = ``(points, classes)``, how many of how many, as the classes would
    otherwise be counted among the drawn points alone.

    >>> counted_points(np.array([5, 6, 6]), (896, 5))
    'a random 3 of 896 points, 2 of 5 classes'
    """
    classes = len(np.unique(labels[labels >= 0]))
    if sample_of is None or sample_of[0] <= len(labels):
        return f"{classes:,} class{'' if classes == 1 else 'es'}"
    points, total = sample_of
    of_classes = f"{classes:,} of {total:,}" if classes < total else f"{total:,}"
    return (f"a random {len(labels):,} of {points:,} points, {of_classes} "
            f"class{'' if total == 1 else 'es'}")


@literal_text()  # class names and paths, drawn as written
def _embedding_map_figure(coordinates: np.ndarray, labels: np.ndarray, method: str,
                          title: str, class_names: dict[int, str] | None,
                          sample_of: tuple[int, int] | None = None) -> Figure:
    """The figure of :func:`plot_embedding_map`: a domain pair's unlabelled target samples
    (label -1) are drawn grey, as no class."""
    unlabelled = labels < 0
    classes = np.unique(labels[~unlabelled])
    figure = agg_figure(6, 6)
    axes = figure.add_subplot(1, 1, 1)
    if unlabelled.any():
        axes.scatter(coordinates[unlabelled, 0], coordinates[unlabelled, 1], s=6,
                     linewidths=0, color="0.75", label="unlabelled")
    if len(classes) <= 20:  # one colour and legend entry per class
        colours = matplotlib.colormaps["tab10" if len(classes) <= 10 else "tab20"]
        for number, label in enumerate(classes):
            members = labels == label
            axes.scatter(coordinates[members, 0], coordinates[members, 1], s=6, linewidths=0,
                         color=colours(number),
                         label=short_name((class_names or {}).get(int(label), str(label)), 24))
        axes.legend(title="class", fontsize=7, markerscale=2, loc="best")
    else:  # too many classes for a legend: colours only tell neighbours apart
        labelled = ~unlabelled
        axes.scatter(coordinates[labelled, 0], coordinates[labelled, 1],
                     c=np.searchsorted(classes, labels[labelled]), s=6, cmap="tab20",
                     linewidths=0)
    # wrapped: a cosine run's method note alone nearly fills the 6-inch width, and a title
    # on one line had run past both edges, cutting off what it says
    counted = counted_points(labels, sample_of)
    axes.set(xticks=[], yticks=[], title=textwrap.fill(f"{title} ({method}, {counted})",
                                                       TITLE_WIDTH))
    figure.tight_layout()
    return figure
