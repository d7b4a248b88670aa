r"""Float64 re-scoring of the neighbours that a float32 search could not order.

The k-NN search runs in float32 (faiss, or a matmul on a GPU), which cannot order scores
closer than a few units in their last place (:mod:`kdml.evaluation.ties`): on dense
low-dimensional embeddings many true neighbours are that close (4,000 unit vectors on a circle:
Recall@1 0.597 with such neighbours counted as ties, 0.666 exactly). The neighbours of a float32
tie group are therefore scored again in float64, from the embeddings as given (cosine:
:math:`q \cdot r / (|q|\,|r|)`; Euclidean: :math:`|q - r|^2` from the differences, which has no
cancellation however far the points lie from the origin), and re-ordered within their group.
Only scores equal to :data:`EXACT_TIE` of their scale stay tied: equal in exact arithmetic,
apart from float64 rounding.

The float32 groups' bounds are kept: a neighbour outside a group was ordered by a float32 gap
larger than the tie tolerance. A group of more than :data:`MAX_RESCORED` neighbours (a collapsed
embedding, whose neighbours are tied in float64 too) keeps its float32 ties, which bounds the
work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kdml.evaluation.knn import host_array, search_scale

# Scores within this share of their scale are tied in float64: far above the rounding of a
# float64 dot product of a few thousand dimensions (about 1e-13 at worst for 512), far below
# what float32 resolves (6e-8).
EXACT_TIE = 2.0**-40
# Tie groups larger than this keep their float32 ties (see the module docstring).
MAX_RESCORED = 4096
# Rows of float64 gathered at once, times the dimension: about 32 MB for each of the two sides.
GATHER_BUDGET = 2**22


class ExactScores:
    """Float64 scores of chosen (query, reference) pairs, from the embeddings as given.

    Args:
        queries: ``(N, D)`` query embeddings (NumPy or torch, any float dtype).
        reference: ``(M, D)`` reference embeddings, or ``None`` when the queries are searched
            against themselves.
        metric: ``"cosine"`` or ``"euclidean"``.

    Both sides are divided by one power of two (:func:`~kdml.evaluation.knn.search_scale`,
    exact), so values up to float64's range neither overflow nor underflow here.
    """

    def __init__(self, queries: Any, reference: Any | None, metric: str) -> None:
        self.metric = metric
        self._inputs = (queries, reference)
        self._host: tuple[np.ndarray, np.ndarray] | None = None
        self._scale = 1.0

    def _arrays(self) -> tuple[np.ndarray, np.ndarray]:
        # Brought to the host once, when a first tie needs them: most evaluations have none.
        if self._host is None:
            queries = host_array(self._inputs[0])
            reference = queries if self._inputs[1] is None else host_array(self._inputs[1])
            self._host = queries, reference
            self._scale = search_scale(queries, reference)
        return self._host

    def nearness(self, query_rows: np.ndarray, reference_rows: np.ndarray) -> np.ndarray:
        """``[P]`` float64 keys of the pairs ``(query_rows[p], reference_rows[p])``, smaller
        is nearer: minus the cosine similarity, or the squared Euclidean distance."""
        queries, reference = self._arrays()
        keys = np.empty(len(query_rows), dtype=np.float64)
        step = max(1, GATHER_BUDGET // queries.shape[1])
        for start in range(0, len(query_rows), step):
            part = slice(start, start + step)
            q = queries[query_rows[part]].astype(np.float64) / self._scale
            r = reference[reference_rows[part]].astype(np.float64) / self._scale
            if self.metric == "cosine":
                norms = np.sqrt(np.einsum("pd,pd->p", q, q) * np.einsum("pd,pd->p", r, r))
                dots = np.einsum("pd,pd->p", q, r)
                # a zero vector has similarity 0 to everything, as in the float32 search
                keys[part] = -np.divide(dots, norms, out=np.zeros_like(dots), where=norms > 0)
            else:
                difference = q - r
                keys[part] = np.einsum("pd,pd->p", difference, difference)
        return keys


def rescore_ties(rows: np.ndarray, indices: np.ndarray, continues: np.ndarray,
                 exact: ExactScores) -> tuple[np.ndarray, np.ndarray]:
    """Re-order each float32 tie group by its float64 scores and keep only float64 ties.

    Args:
        rows: ``[n]`` query rows of ``indices``.
        indices: ``[n, w]`` ranked reference rows, every tie group complete.
        continues: ``[n, w]`` bool, neighbour ``j`` tied with ``j - 1`` in float32
            (:func:`~kdml.evaluation.ties.continues_group`).
        exact: the float64 scores.

    Returns:
        ``(indices, continues)`` of the same shapes: within each group the neighbours sorted by
        their float64 score (stable), and ``continues`` true only where a neighbour's score is
        within :data:`EXACT_TIE` of the previous one's scale.
    """
    if not continues.any():
        return indices, continues
    starts = continues.copy()
    starts[:, :-1] |= continues[:, 1:]  # tied positions: a group's first member and the rest
    group_rows, columns = np.nonzero(starts)
    opens = ~continues[group_rows, columns]
    group = np.cumsum(opens) - 1
    sizes = np.bincount(group)
    rescored = sizes[group] <= MAX_RESCORED
    group_rows, columns, opens, group = (a[rescored] for a in (group_rows, columns, opens, group))
    if not len(group_rows):
        return indices, continues
    keys = exact.nearness(rows[group_rows], indices[group_rows, columns])
    order = np.lexsort((columns, keys, group))  # by group, then key, then the float32 order
    indices, continues = indices.copy(), continues.copy()
    indices[group_rows, columns] = indices[group_rows[order], columns[order]]
    sorted_keys = keys[order]
    previous = np.roll(sorted_keys, 1)
    scale = np.maximum(np.abs(sorted_keys), np.abs(previous))
    if exact.metric == "cosine":
        scale = np.ones_like(scale)  # similarities of unit vectors: scale 1
    tied = np.abs(sorted_keys - previous) <= EXACT_TIE * scale
    continues[group_rows, columns] = tied & ~opens  # a group's first position opens it
    return indices, continues
