r"""Cross-domain evaluation: classify target samples by their nearest labelled source samples.

This is how DTML (Hu, Lu & Tan, CVPR 2015) is scored in the transfer setting: the metric is
learned with labelled source and unlabelled target data, and target samples are recognised
against the labelled source set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kdml.checks import is_positive_int
from kdml.errors import KdmlError
from kdml.evaluation.knn import (
    Metric,
    as_float_matrix,
    check_metric,
    host_array,
    prepare_pair,
    search_rows,
)
from kdml.evaluation.labels import as_label_vector
from kdml.evaluation.rescoring import ExactScores
from kdml.evaluation.retrieval import RankedSearch, retrieval_metrics


def _labelled(labels: np.ndarray, name: str) -> np.ndarray:
    """Mask of the labelled samples (label >= 0); -1 marks an unknown target label."""
    mask = labels >= 0
    if not mask.any():
        raise KdmlError(f"{name} has no labelled sample (all < 0); nothing to evaluate")
    return mask


def source_nn_accuracy(source: Any, source_labels: Any, target: Any, target_labels: Any,
                       k: int = 1, metric: Metric = "euclidean") -> float:
    r"""Accuracy of the :math:`k`-NN classifier of target samples against the source samples.

    Each labelled target sample gets the majority label of its :math:`k` nearest source samples
    (exact brute-force search, :func:`~kdml.evaluation.knn.knn_search`); a tie between labels
    goes to the tied label with the nearest neighbour. With :math:`k = 1`, the nearest source
    samples that float32 cannot order are re-scored in float64 (as in ``retrieval_metrics``),
    and those tied in float64 count as their expectation: the share of them with the
    target's label, so the accuracy does not depend on the order of the samples. (For
    :math:`k > 1` the vote takes the float32 search's :math:`k` nearest, in index order among
    float32 ties: nothing is re-scored.) Source and target are rescaled together, so the
    accuracy is invariant to a positive scaling of both (a power of two exactly). Target
    samples labelled ``-1`` (unknown) are left out of the accuracy.

    .. math::
        \mathrm{acc} = \frac{1}{N_t} \sum_{i=1}^{N_t}
            \left[\hat y(t_i) = y_i\right], \qquad
        \hat y(t) = \operatorname{mode}\{y_s(j) : j \in \mathrm{NN}_k(t)\}

    Args:
        source: :math:`(N_s, D)` embeddings of the labelled source samples.
        source_labels: :math:`(N_s,)` integer labels, all >= 0.
        target: :math:`(N_t, D)` embeddings of the target samples.
        target_labels: :math:`(N_t,)` integer labels (-1 = unknown, not scored).
        k: neighbours, between 1 and :math:`N_s`. Default: 1.
        metric: ``"euclidean"`` (DTML's metric) or ``"cosine"``. Default: ``"euclidean"``.

    Returns:
        Accuracy in [0, 1].

    Example::

        >>> source = np.array([[0.0], [10.0]])
        >>> source_nn_accuracy(source, [0, 1], np.array([[1.0], [9.0], [4.0]]), [0, 1, 1])
        0.6666666666666666
    """
    check_metric(metric)
    target_vectors, source_vectors = prepare_pair(target, source, metric, ("target", "source"))
    source_y = as_label_vector(source_labels, "source_labels", len(source_vectors),
                               source_vectors.shape[1])
    target_y = as_label_vector(target_labels, "target_labels", len(target_vectors),
                               target_vectors.shape[1])
    if (source_y < 0).any():
        raise KdmlError("source_labels must all be >= 0 (the source domain is labelled)")
    scored = _labelled(target_y, "target_labels")
    if not (is_positive_int(k) and k <= len(source_y)):
        raise KdmlError(f"k must be an integer from 1 to {len(source_y)}, got {k!r}")
    if k == 1:
        exact = ExactScores(host_array(target)[scored], source, metric)
        return _nearest_neighbour_accuracy(target_vectors[scored], target_y[scored],
                                           source_vectors, source_y, exact)
    neighbour_labels = source_y[voters(target_vectors[scored], source_vectors, int(k), metric)]
    predictions = _majority_vote(neighbour_labels)
    return float((predictions == target_y[scored]).mean())


def _nearest_neighbour_accuracy(targets: np.ndarray, target_y: np.ndarray,
                                sources: np.ndarray, source_y: np.ndarray,
                                exact: ExactScores) -> float:
    """1-NN accuracy with ties for the nearest source sample counted as their expectation
    (float32 ties re-scored in float64: ``exact``)."""
    search = RankedSearch(targets, sources, exact.metric, False, len(targets) or 1, exact)
    correct = np.zeros(len(targets))
    for rows, ranked in search.ranked(np.ones(len(targets), dtype=np.int64)):
        first_group = np.cumsum(~ranked.continues, axis=1) == 1  # the nearest tie group
        hits = source_y[ranked.indices] == target_y[rows, None]
        correct[rows] = (hits & first_group).sum(axis=1) / first_group.sum(axis=1)
    return float(correct.mean())


# Widened searches of voters(): at most this many (query, neighbour) results at once.
VOTER_BUDGET = 2**24


def voters(targets: np.ndarray, sources: np.ndarray, k: int, metric: str) -> np.ndarray:
    """``(n, k)`` indices of each target's ``k`` nearest sources (prepared vectors), nearest
    first, equal float32 scores in index order.

    A target whose ``k``-th score ties the next one is searched again, twice as wide, until the
    tie group ends or every source is retrieved, so that the group is whole before its first
    members by index are taken: faiss's heap keeps an arbitrary part of a group that crosses
    rank ``k`` and returns the inner-product search's ties last index first (4 equal source
    rows labelled 0, 1, 1, 0 had voted 1 at ``k = 2`` under the cosine metric, 0 under the
    Euclidean one)."""
    chosen = np.empty((len(targets), k), dtype=np.int64)
    pending = {min(k + 1, len(sources)): np.arange(len(targets))}
    while pending:
        width = min(pending)
        rows_to_search = pending.pop(width)
        batch = max(1, VOTER_BUDGET // width)
        for start in range(0, len(rows_to_search), batch):
            rows = rows_to_search[start:start + batch]
            scores, indices = search_rows(targets, rows, sources, width, metric, False)
            whole = (scores[:, -1] != scores[:, k - 1]) | (width == len(sources))
            nearness = -scores[whole] if metric == "cosine" else scores[whole]
            chosen[rows[whole]] = _first_by_index(nearness, indices[whole], k)
            # every retrieved source tied (a collapsed embedding): all of them at once, where
            # doubling would search them log2(N / width) times
            all_tied = ~whole & (scores[:, 0] == scores[:, -1])
            for next_width, these in ((len(sources), all_tied),
                                      (min(2 * width, len(sources)), ~whole & ~all_tied)):
                if these.any():
                    pending[next_width] = np.concatenate(
                        [pending.get(next_width, np.empty(0, dtype=np.int64)), rows[these]])
    return chosen


def _first_by_index(nearness: np.ndarray, indices: np.ndarray, k: int) -> np.ndarray:
    """``(n, k)``: of neighbours ranked by ``nearness`` (ascending, ``(n, w)``, ``w >= k``,
    holding the whole tie group at rank ``k``), the ``k`` nearest, equal nearness in index
    order. The group at rank ``k`` gives its lowest indices (a partition: a collapsed
    embedding's group is every source); those before it, fewer than ``k``, are sorted."""
    at_k = nearness[:, k - 1:k]
    group = nearness == at_k
    missing = np.iinfo(np.int64).max
    lowest = np.sort(np.partition(np.where(group, indices, missing), k - 1, axis=1)[:, :k],
                     axis=1)
    # candidates: the first k (the group's among them set aside) and the group's k lowest
    candidates = np.concatenate([indices[:, :k], lowest], axis=1)
    keys = np.concatenate([np.where(group[:, :k], np.inf, nearness[:, :k]),
                           np.where(lowest == missing, np.inf, at_k)], axis=1)
    order = np.lexsort((candidates, keys), axis=-1)[:, :k]
    return np.take_along_axis(candidates, order, axis=1)


def _majority_vote(neighbour_labels: np.ndarray) -> np.ndarray:
    """Per row of ``(n, k)`` labels ordered nearest first: the most frequent label; ties go to
    the label whose first occurrence is nearest (``argmax`` returns the first maximum)."""
    votes = (neighbour_labels[:, :, None] == neighbour_labels[:, None, :]).sum(axis=2)
    winner = votes.argmax(axis=1)
    return neighbour_labels[np.arange(len(neighbour_labels)), winner]


def target_metrics(source_emb: Any, source_labels: Any, target_emb: Any, target_labels: Any,
                   ks: Sequence[int] = (1, 2, 4, 8), metric: Metric = "euclidean",
                   nmi: bool = False) -> dict[str, float]:
    """Retrieval metrics within the target domain plus the source-NN accuracy.

    - ``recall@K``, ``map@r``, ``r_precision`` (and ``nmi``): the labelled target samples
      searched against each other, leave-one-out
      (:func:`~kdml.evaluation.retrieval.retrieval_metrics`);
    - ``source_nn_accuracy``: :func:`source_nn_accuracy` with :math:`k = 1`.

    Target samples labelled ``-1`` are left out of both.

    Args:
        source_emb, source_labels: labelled source embeddings :math:`(N_s, D)` and labels.
        target_emb, target_labels: target embeddings :math:`(N_t, D)` and evaluation labels.
        ks: the K of Recall@K (each at most :math:`N_t - 1`).
        metric: ``"euclidean"`` or ``"cosine"``, for both. Default: ``"euclidean"``.
        nmi: also cluster the target embeddings (NMI). Default: ``False``.

    Returns:
        ``{"recall@K": ..., "map@r": ..., "r_precision": ..., "source_nn_accuracy": ...}``.
    """
    # validated, as given: the searches below shift and scale their own copies
    target_vectors = as_float_matrix(target_emb, "target_emb")
    target_y = as_label_vector(target_labels, "target_labels", len(target_vectors),
                               target_vectors.shape[1])
    scored = _labelled(target_y, "target_labels")
    results = retrieval_metrics(target_vectors[scored], target_y[scored], ks=ks, metric=metric,
                                nmi=nmi)
    results["source_nn_accuracy"] = source_nn_accuracy(source_emb, source_labels, target_vectors,
                                                       target_y, k=1, metric=metric)
    return results
