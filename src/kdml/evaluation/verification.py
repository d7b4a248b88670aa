r"""Face verification on pair lists, LFW style (Huang et al., 2007; used by DTML on LFW).

Each pair has a score and a same/different label. The pairs come in folds (LFW's View 2: 10
folds of 300 same + 300 different pairs). For every fold a threshold is chosen on the other
folds, maximising their accuracy, and the held-out fold is classified with it; the protocol
reports the mean accuracy over folds with its spread.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from kdml.checks import is_positive_int
from kdml.errors import KdmlError
from kdml.evaluation.knn import host_array, row_powers_of_two, search_scale

PairMetric = Literal["cosine", "euclidean"]


@dataclass(frozen=True)
class VerificationResult:
    """Outcome of :func:`verification_accuracy`.

    Attributes:
        mean: mean held-out accuracy over the folds.
        std: sample standard deviation of the fold accuracies (``ddof=1``; 0 for one fold).
        standard_error: ``std / sqrt(num_folds)``, the figure LFW asks to report next to mean.
        fold_accuracies: held-out accuracy of each fold, in sorted fold-id order.
        thresholds: the threshold applied to each fold (chosen on the other folds), in the
            score convention of the input (a distance threshold when ``scores_are_distances``).
        fold_ids: the sorted fold ids.
    """

    mean: float
    std: float
    standard_error: float
    fold_accuracies: tuple[float, ...]
    thresholds: tuple[float, ...]
    fold_ids: tuple[int, ...]


def best_threshold(similarities: np.ndarray, same: np.ndarray) -> tuple[float, float]:
    r"""The threshold :math:`t` maximising the accuracy of "same iff similarity :math:`\ge t`".

    Candidates are the midpoints between consecutive distinct sorted similarities (the upper
    one of two adjacent floats, whose midpoint does not exist), plus
    :math:`-\infty` (every pair "same") and :math:`+\infty` (every pair "different"): every
    distinct decision on these pairs is reached by exactly one candidate, and the two extreme
    decisions stay extreme on any held-out pair, however far outside this range its score
    lies. Ties in accuracy go to the smallest candidate, i.e. the rule that calls the most
    pairs "same" (for distances, given negated, that is the *largest* distance threshold).

    Returns:
        ``(threshold, accuracy on these pairs)``.
    """
    values = np.unique(similarities)
    # halves summed: (a + b) / 2 overflows near float64's largest value, and between two
    # adjacent floats rounds onto the lower one, which would not separate them: take the upper
    midpoints = values[:-1] / 2 + values[1:] / 2
    midpoints = np.where(midpoints > values[:-1], midpoints, values[1:])
    candidates = np.concatenate([[-np.inf], midpoints, [np.inf]])
    # pairs strictly below each candidate are called "different"
    order = np.argsort(similarities, kind="stable")
    sorted_sims, sorted_same = similarities[order], same[order]
    num_below = np.searchsorted(sorted_sims, candidates, side="left")
    same_below = np.concatenate([[0], np.cumsum(sorted_same)])[num_below]
    different_below = num_below - same_below
    correct = different_below + (sorted_same.sum() - same_below)
    best = int(np.argmax(correct))  # first maximum = smallest candidate
    return float(candidates[best]), float(correct[best] / len(similarities))


def _default_folds(num_pairs: int, num_folds: int) -> np.ndarray:
    """LFW's pairs.txt order: consecutive, (nearly) equal folds."""
    return np.concatenate([np.full(len(chunk), fold) for fold, chunk in
                           enumerate(np.array_split(np.arange(num_pairs), num_folds))])


def verification_accuracy(scores: Any, same: Any, folds: Any | None = None, num_folds: int = 10,
                          scores_are_distances: bool = False) -> VerificationResult:
    r"""Cross-validated verification accuracy (the LFW View 2 protocol).

    For each fold :math:`f`: choose the threshold on the pairs of all other folds with
    :func:`best_threshold` (maximum accuracy; candidates are midpoints of sorted scores), call
    a held-out pair "same" iff its similarity is :math:`\ge` the threshold (for distances: iff
    its distance is :math:`\le` it), and record the accuracy on fold :math:`f`. Equally good
    thresholds are broken towards calling more pairs "same": the lowest similarity threshold,
    or the highest distance threshold. A threshold can be :math:`\pm\infty` (all pairs "same"
    or all "different").

    .. math::
        \mathrm{mean} = \frac{1}{F}\sum_f \mathrm{acc}_f, \qquad
        \mathrm{std} = \sqrt{\frac{1}{F-1}\sum_f (\mathrm{acc}_f - \mathrm{mean})^2}

    Args:
        scores: :math:`(P,)` float scores, similarities (higher = more alike) unless
            ``scores_are_distances``.
        same: :math:`(P,)` bool or 0/1, whether the pair shows the same identity.
        folds: :math:`(P,)` integer fold ids; ``None`` cuts the pairs, in order, into
            ``num_folds`` consecutive folds (LFW's pairs.txt layout). At least 2 folds.
        num_folds: folds when ``folds`` is ``None``. Default: 10.
        scores_are_distances: the scores are distances (lower = more alike). Default: False.

    Returns:
        :class:`VerificationResult`.

    Example::

        >>> scores = np.array([0.9, 0.8, 0.2, 0.1, 0.7, 0.3])
        >>> same = np.array([1, 1, 0, 0, 1, 0])
        >>> verification_accuracy(scores, same, folds=[0, 0, 0, 1, 1, 1]).mean
        1.0
    """
    raw_scores = np.asarray(host_array(scores))
    if raw_scores.dtype.kind not in "iuf":
        raise KdmlError(f"scores must be numbers, got dtype {raw_scores.dtype}")
    score_array = raw_scores.astype(np.float64)
    same_array = host_array(same)
    if score_array.ndim != 1 or same_array.shape != score_array.shape:
        raise KdmlError(f"scores and same must be 1-D of one length, got {score_array.shape} "
                        f"and {same_array.shape}")
    if not np.isfinite(score_array).all():
        raise KdmlError("scores contain NaN or infinite values")
    if not np.isin(same_array, (0, 1)).all():
        raise KdmlError("same must hold booleans or 0/1")
    same_array = same_array.astype(bool)
    if folds is None:
        if not is_positive_int(num_folds) or not 2 <= num_folds <= len(score_array):
            raise KdmlError(f"num_folds must be an integer from 2 to the number of pairs "
                            f"({len(score_array)}), got {num_folds!r}")
        fold_array = _default_folds(len(score_array), num_folds)
    else:
        fold_array = np.asarray(folds)
        if fold_array.shape != score_array.shape or fold_array.dtype.kind not in "iu":
            raise KdmlError(f"folds must be integers of shape {score_array.shape}")
    fold_ids = np.unique(fold_array)
    if len(fold_ids) < 2:
        raise KdmlError("the protocol needs at least 2 folds")
    # one convention inside: similarities, "same" iff similarity >= threshold
    similarities = -score_array if scores_are_distances else score_array
    accuracies, thresholds = [], []
    for fold in fold_ids:
        held_out = fold_array == fold
        threshold, _ = best_threshold(similarities[~held_out], same_array[~held_out])
        predicted_same = similarities[held_out] >= threshold
        accuracies.append(float((predicted_same == same_array[held_out]).mean()))
        thresholds.append(-threshold if scores_are_distances else threshold)
    accuracy_array = np.array(accuracies)
    std = float(accuracy_array.std(ddof=1)) if len(accuracies) > 1 else 0.0
    return VerificationResult(float(accuracy_array.mean()), std, std / math.sqrt(len(accuracies)),
                              tuple(accuracies), tuple(thresholds),
                              tuple(int(f) for f in fold_ids))


def pair_scores(embeddings_a: Any, embeddings_b: Any, metric: PairMetric = "cosine") -> np.ndarray:
    r"""Similarity of each pair :math:`(a_i, b_i)` of embeddings; higher = more alike.

    ``"cosine"``: :math:`a_i^\top b_i / (\|a_i\| \|b_i\|)` (0 for a zero vector);
    ``"euclidean"``: :math:`-\|a_i - b_i\|_2` (negative distance, so the protocol's
    "same iff score :math:`\ge` threshold" applies to both).

    Args:
        embeddings_a, embeddings_b: :math:`(P, D)` arrays or tensors, row :math:`i` of each
            forming pair :math:`i`.
        metric: ``"cosine"`` or ``"euclidean"``. Default: ``"cosine"``.

    Returns:
        float64 :math:`(P,)` scores for :func:`verification_accuracy`.
    """
    a, b = host_array(embeddings_a), host_array(embeddings_b)
    if a.dtype.kind not in "biuf" or b.dtype.kind not in "biuf":
        raise KdmlError(f"pair embeddings must be numbers, got dtypes {a.dtype} and {b.dtype}")
    a, b = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    if a.ndim != 2 or a.shape != b.shape:
        raise KdmlError(f"pair embeddings must both be (P, D), got {a.shape} and {b.shape}")
    if metric not in ("cosine", "euclidean"):
        raise KdmlError(f"metric must be cosine or euclidean, got {metric!r}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise KdmlError("pair embeddings contain NaN or infinite values")
    if metric == "euclidean":
        # both divided by one power of two (exact; 1 at ordinary sizes), as the searches do:
        # squares of 1e200 overflow float64
        units = search_scale(a, b) if a.size else 1.0
        a, b = a / units, b / units
        return -units * np.sqrt(((a - b) ** 2).sum(axis=1))
    # a cosine is each pair's alone: each row divided by its own power of two (exact), so
    # that a row of 1e-200 beside one of 1e200 keeps its direction (one shared power of two
    # had made it a zero vector, scored 0)
    a, b = a / row_powers_of_two(a)[:, None], b / row_powers_of_two(b)[:, None]
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.where(norms > 0, norms, 1.0)
