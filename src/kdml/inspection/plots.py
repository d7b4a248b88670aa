"""``kdml plot retrieval``, ``kdml plot embedding`` and ``kdml plot charts``: pictures of a
run's test embeddings, written to its ``plots/`` folder.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from kdml.config import RunConfig
from kdml.data.dataset import DmlDataset
from kdml.data.transforms import to_unit_float
from kdml.errors import KdmlError
from kdml.evaluation.collapse import collapse_description
from kdml.evaluation.evaluator import Embedded, chart_codes_of, embed_dataset
from kdml.evaluation.knn import as_metric, drop_self, knn_search, l2_normalize
from kdml.figure_file import check_replaceable
from kdml.inspection.parts import run_part, searches_gallery
from kdml.training.loading import TrainedRun
from kdml.training.recipes import get_recipe
from kdml.viz_charts import plot_charts
from kdml.viz_retrieval import embedding_map, plot_embedding_map, plot_retrieval_grid, short_name

_log = logging.getLogger(__name__)


def refuse_collapsed(embedded: Embedded, trained: TrainedRun, picture: str) -> None:
    """Raise :class:`KdmlError` when the test embeddings have collapsed to one point
    (:func:`~kdml.evaluation.collapse.collapse_description`): ``picture`` would show ties and
    float rounding, not the model."""
    if isinstance(embedded.values, tuple):  # an Atlas run's chart codes, as its scoring's
        coords, charts = embedded.values
        collapsed = collapse_description(coords, "euclidean", chart_index=charts)
    else:
        collapsed = collapse_description(embedded.tensor(), trained.config.eval.metric)
    if collapsed is not None:
        raise KdmlError(f"{collapsed}: {picture} would show ties and float rounding, not the "
                        "model; train the run again with lower learning rates")


def plot_retrieval(trained: TrainedRun, queries: int, k: int, seed: int = 0) -> Path:
    """``plots/retrieval.png`` (``retrieval-best.png`` with the best checkpoint): random test
    queries (with at least one same-class sample to find) and their ``k`` nearest images, hits
    and misses marked. Where the metrics search a gallery (:func:`searches_gallery`), the
    queries are searched in it; otherwise among the other test images. An Atlas run's are
    searched as its metrics search them: within the query's chart, by the Euclidean distance
    of the chart coordinates (:func:`~kdml.evaluation.charts.chart_retrieval_metrics`)."""
    check_replaceable(trained.plot_path("retrieval"))  # before minutes of embedding
    part = run_part(trained)
    if not part.dataset.is_image:
        raise KdmlError("plot retrieval draws images; this run's samples are not images")
    # an Atlas run's embedding (atlas_embedding) is a stand-in that ranks otherwise
    embed = chart_codes_of if trained.method.has_charts else embed_dataset
    embedded = embed(trained.method, part.dataset, part.embedder)
    # a tied neighbour is drawn as found, so the grid's hits would be the search's tie order
    refuse_collapsed(embedded, trained, "a grid of their nearest neighbours")
    labels = embedded.labels.numpy()
    metric = as_metric(trained.config.eval.metric)
    requested_k = k
    if not searches_gallery(trained):
        found, reference, reference_labels = part, embedded, labels
        _, codes, counts = np.unique(labels, return_inverse=True, return_counts=True)
        eligible = np.flatnonzero(counts[codes] > 1)
        k = min(k, len(labels) - 1)
    else:
        found = run_part(trained, "gallery")
        reference = embed(trained.method, found.dataset, found.embedder)
        reference_labels = reference.labels.numpy()
        eligible = np.flatnonzero(np.isin(labels, reference_labels))
        k = min(k, len(reference_labels))
    if not len(eligible):
        raise KdmlError("no test query has another sample of its class to retrieve")
    # said, not drawn smaller without a word (kdml search notes short rows alike)
    if len(eligible) < queries:
        _log.warning("the retrieval grid shows %d queries, not %d: only %d test samples have "
                     "another of their class to retrieve", len(eligible), queries,
                     len(eligible))
    if k < requested_k:
        _log.warning("the retrieval grid shows %d neighbours per query, not %d: %s", k,
                     requested_k, f"the test part holds only {k} images besides the query"
                     if found is part else f"the gallery holds only {k} images")
    chosen = np.random.default_rng(seed).choice(eligible, min(queries, len(eligible)),
                                                replace=False)
    same_set = found is part
    if trained.method.has_charts:
        neighbours = _chart_neighbours(embedded, chosen, reference, k, same_set)
        short = _short_rows(neighbours)
        if short:  # said, as the rows and columns above are (and as kdml search notes them)
            _log.warning("the retrieval grid shows fewer than %d neighbours in %d of its %d "
                         "rows (%d at the fewest): an Atlas run's queries are searched within "
                         "their chart, and those charts hold fewer %s", k, short[0], len(chosen),
                         short[1], "other test images" if same_set else "gallery images")
    elif same_set:  # each test image against the others (its own row dropped)
        chunks = knn_search(embedded.values, k=k, metric=metric, exclude_self=True)
        neighbours = np.concatenate([chunk.indices for chunk in chunks])[chosen]
    else:
        chunks = knn_search(embedded.values[chosen], reference.values, k=k, metric=metric)
        neighbours = np.concatenate([chunk.indices for chunk in chunks])
    found_any = neighbours >= 0
    hits = found_any & (reference_labels[np.maximum(neighbours, 0)] == labels[chosen][:, None])

    def loader(dataset: DmlDataset) -> tuple[Callable[[int], torch.Tensor],
                                             Callable[[int], str]]:
        def image(position: int) -> torch.Tensor:
            return to_unit_float(dataset.load(position))

        def title(position: int) -> str:
            label = int(dataset.labels[position])
            return short_name(dataset.class_name(label) or str(label))

        return image, title

    query_image, query_title = loader(part.dataset)
    positions = np.where(found_any, reference.indices.numpy()[np.maximum(neighbours, 0)], -1)
    return plot_retrieval_grid(
        embedded.indices.numpy()[chosen], positions, hits,
        # the run folder checked again (as below): moved or deleted meanwhile, it had been
        # made again at its old path, holding the picture alone
        query_image, trained.run.output(trained.plot_path("retrieval")), query_title,
        gallery=None if same_set else loader(found.dataset))


def _short_rows(neighbours: np.ndarray) -> tuple[int, int] | None:
    """How many rows of ``neighbours`` ``[Q, K]`` end in empty places (-1: the query's chart
    holds fewer than K), and the fewest neighbours a row has; None where none does."""
    found = (neighbours >= 0).sum(axis=1)
    short = found < neighbours.shape[1]
    return (int(short.sum()), int(found.min())) if short.any() else None


def _chart_neighbours(queries: Embedded, chosen: np.ndarray, reference: Embedded, k: int,
                      same_set: bool) -> np.ndarray:
    """``[Q, k]`` rows of ``reference`` nearest to the ``chosen`` rows of ``queries`` (chart
    codes), each among the references of its own chart by the Euclidean distance of their
    coordinates, nearest first (its own row dropped where ``same_set``); -1 where its chart
    holds fewer."""
    coords, charts = (part.cpu().numpy() for part in queries.values)
    reference_coords, reference_charts = (part.cpu().numpy() for part in reference.values)
    neighbours = np.full((len(chosen), k), -1, dtype=np.int64)
    for chart in np.unique(charts[chosen]):
        rows = np.flatnonzero(charts[chosen] == chart)
        members = np.flatnonzero(reference_charts == chart)
        width = min(k + int(same_set), len(members))  # one more: the query itself, dropped
        if width == 0:
            continue
        chunks = list(knn_search(coords[chosen[rows]], reference_coords[members], k=width,
                                 metric="euclidean"))
        scores = np.concatenate([chunk.scores for chunk in chunks])
        found = members[np.concatenate([chunk.indices for chunk in chunks])]
        if same_set:  # each query is among its chart's members
            scores, found = drop_self(scores, found, chosen[rows])
        neighbours[rows, :found.shape[1]] = found
    return neighbours


def plot_embedding(trained: TrainedRun, max_points: int = 5000, seed: int = 0) -> Path:
    """``plots/embedding.png`` (``embedding-best.png`` with the best checkpoint): the test
    embeddings in 2-D (UMAP, else t-SNE), by class; a validated run's validation part, which
    the title names, as its other commands take it (:func:`run_part`). Of more than
    ``max_points``, a random ``max_points`` (``seed``), which the title says with the whole
    part's counts of points and classes."""
    check_replaceable(trained.plot_path("embedding"))  # before minutes of embedding
    part = run_part(trained)
    embedded = embed_dataset(trained.method, part.dataset, part.embedder)
    # t-SNE would spread float rounding out into clusters (and crashes on exact ties)
    refuse_collapsed(embedded, trained, "a 2-D map of them")
    values = embedded.tensor().float().cpu().numpy()
    labels = embedded.labels.numpy()
    # the title says how many of how many points it draws, and of how many classes
    sample_of = (len(labels), len(np.unique(labels[labels >= 0])))
    if len(values) > max_points:
        keep = np.random.default_rng(seed).choice(len(values), max_points, replace=False)
        values, labels = values[keep], labels[keep]
    if len(values) < 3:
        raise KdmlError("a 2-D map needs at least 3 test samples")
    # the map of what the run's metric compares: directions (points of one direction had
    # been drawn apart by their lengths, which the cosine ignores)
    cosine = trained.config.eval.metric == "cosine"
    coordinates, method = embedding_map(l2_normalize(values, inplace=True) if cosine
                                        else values, seed)
    if cosine:
        method += ", of the L2-normalised embeddings (cosine metric)"
    # a validated run's "test" is its validation part (kdml plot says it on stderr; the
    # picture, looked at later, says it too)
    shown = ", validation part" if part.is_validation else ""
    if trained.checkpoint == trained.run.best_checkpoint:  # beside the last one's map, whose
        # title was the same: the file name alone told them apart, lost in a copied picture
        shown += f", best checkpoint of epoch {trained.epoch}"
    return plot_embedding_map(coordinates, labels,
                              trained.run.output(trained.plot_path("embedding")), method,
                              f"{trained.config.recipe} on {trained.config.data.dataset}{shown}",
                              part.dataset.class_names, sample_of)


def check_chartable(config: RunConfig) -> None:
    """Refuse a run whose charts ``kdml plot charts`` cannot draw (a recipe without charts, or
    charts of d != 2), from its config alone: before its data and model are loaded."""
    if not get_recipe(config.recipe).has_charts:
        raise KdmlError(f"{config.recipe!r} has no charts; plot charts needs an Atlas "
                        "recipe (mtriplet, msimclr)")
    dim = getattr(config.method, "dim", 2)
    if dim != 2:  # as plot_charts says it, before minutes of embedding
        raise KdmlError(f"kdml plot charts draws 2-D charts only (d = 2), but this run's charts "
                        f"are {dim}-D (method.dim={dim}); train with method.dim=2 to draw them")


def draw_charts(trained: TrainedRun, thumbnails: int = 100) -> Path:
    """``plots/charts.png`` (``charts-best.png`` with the best checkpoint): the test samples in
    each chart of an Atlas run, by class (named in the legend), with up to ``thumbnails``
    images drawn in each chart's panel (Korman, Sec. A.2)."""
    check_chartable(trained.config)
    check_replaceable(trained.plot_path("charts"))  # before minutes of embedding
    test = trained.splits.test
    codes = chart_codes_of(trained.method, test, trained.embedder)
    coords, index = codes.values

    def thumbnail(row: int) -> torch.Tensor:
        return to_unit_float(test.load(int(codes.indices[row])))

    return plot_charts(coords, index, codes.labels,
                       trained.run.output(trained.plot_path("charts")),
                       images=thumbnail if test.is_image else None, max_thumbnails=thumbnails,
                       class_names=test.class_names)
