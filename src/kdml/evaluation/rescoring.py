r"""Float64 re-scoring of the neighbours that a float32 search could not order.

The k-NN search runs in float32 (faiss, or a matmul on a GPU), which cannot order scores
closer than its rounding can move them (:func:`kdml.evaluation.ties.tie_tolerance`): on dense
low-dimensional embeddings many true neighbours are that close (4,000 unit vectors on a circle:
Recall@1 0.597 with such neighbours counted as ties, 0.666 exactly). The neighbours of a float32
tie group are therefore scored again in float64, from the embeddings as given, and re-ordered
within their group. The keys are computed from differences, which keep their accuracy however
close the neighbours are: :math:`|q - r|^2` (Euclidean) and :math:`|\hat q - \hat r|^2 = 2 - 2
\cos` of the L2-normalised vectors (cosine; a zero vector has similarity 0, key 2).

Neighbours stay tied only where their keys are equal within the float64 rounding of the keys
(:func:`key_tolerance`), measured from the first key of their tie: so distances equal in exact
arithmetic (duplicates, scaled copies under the cosine metric) tie, and a chain of close but
distinct neighbours does not. Keys closer than that rounding are the one limit: float64 inputs
whose exact keys differ by a few float64 ulps are tied.

The float32 groups' bounds are kept: a neighbour outside a group was ordered by a float32 gap
larger than the tie tolerance. Duplicated reference rows are scored once per query, so a
collapsed embedding (every neighbour in one group) costs one key per query.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kdml.evaluation.knn import host_array, l2_normalize, search_scale
from kdml.evaluation.ties import tied_positions

EPS64 = float(np.finfo(np.float64).eps)
# Pairs gathered at once, times the dimension: 2 MB of float64 a side, which stays in the
# cache while it is subtracted and summed; at 32 MB the keys took twice as long (6.5 million
# pairs of 64-d rows: 1.65 s against 0.81, before the in-place difference; docs/benchmarks.md).
GATHER_BUDGET = 2**18


def key_tolerance(keys: np.ndarray, dim: int, metric: str) -> np.ndarray:
    r"""The rounding bound of float64 keys of ``dim``-dimensional vectors: keys this close may
    be equal in exact arithmetic.

    Euclidean: :math:`a\,k` with :math:`a = (D + 2)\,\epsilon` (a sum of :math:`D` squares,
    from differences rounded once). Cosine: :math:`a\,(k + 2\sqrt{k} + a)`, which adds the
    rounding of the normalised vectors (each off by at most :math:`a` in norm) to that of the
    sum.
    """
    a = (dim + 2) * EPS64
    if metric == "euclidean":
        return a * keys
    return a * (keys + 2 * np.sqrt(keys) + a)


class ExactScores:
    """Float64 keys of chosen (query, reference) pairs, from the embeddings as given.

    Args:
        queries: ``(N, D)`` query embeddings (NumPy or torch, any float dtype).
        reference: ``(M, D)`` reference embeddings, or ``None`` when the queries are searched
            against themselves.
        metric: ``"cosine"`` or ``"euclidean"``.

    For the Euclidean metric both sides are divided by one power of two
    (:func:`~kdml.evaluation.knn.search_scale`, exact), so that the largest values neither
    overflow nor underflow when squared (rows far smaller than the largest may still underflow
    there); for the cosine each row by its own (:func:`~kdml.evaluation.knn.row_powers_of_two`),
    before it is normalised.
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

    @property
    def dim(self) -> int:
        return int(self._arrays()[0].shape[1])

    def nearness(self, query_rows: np.ndarray, reference_rows: np.ndarray) -> np.ndarray:
        """``[P]`` float64 keys of the pairs ``(query_rows[p], reference_rows[p])``, smaller
        is nearer: :math:`|q - r|^2`, or :math:`|\\hat q - \\hat r|^2` for cosine."""
        queries, reference = self._arrays()
        # Duplicated reference rows share their keys: where the distinct queries times the
        # distinct row contents are fewer than the pairs (a collapsed embedding: one content),
        # each combination is scored once. Rows are found by marking (P can be 2^24), and only
        # the rows touched here are compared by content.
        query_slot, distinct_queries = _slots(query_rows, len(queries))
        touched_slot, touched = _slots(reference_rows, len(reference))
        rows = np.ascontiguousarray(reference[touched])
        as_bytes = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel()
        _, first_of_content, content = np.unique(as_bytes, return_index=True,
                                                  return_inverse=True)
        num_contents = len(first_of_content)
        if len(distinct_queries) * num_contents >= len(query_rows):
            return self._keys(distinct_queries, query_slot, touched, touched_slot)
        table = self._keys(distinct_queries,
                           np.repeat(np.arange(len(distinct_queries)), num_contents),
                           touched[first_of_content],
                           np.tile(np.arange(num_contents), len(distinct_queries)))
        content_slot = content.ravel()[touched_slot]
        return table.reshape(len(distinct_queries), num_contents)[query_slot, content_slot]

    def _keys(self, query_rows: np.ndarray, query_slots: np.ndarray,
              reference_rows: np.ndarray, reference_slots: np.ndarray) -> np.ndarray:
        """``[P]`` keys of the pairs ``(query_rows[query_slots[p]],
        reference_rows[reference_slots[p]])``, each row given once."""
        queries, reference = self._arrays()
        # Each row is converted (and normalised) once, not once for each of its pairs: a
        # nearly collapsed embedding pairs every query with every reference.
        q_rows, q_zero = self._converted(queries[query_rows])
        r_rows, r_zero = self._converted(reference[reference_rows])
        keys = np.empty(len(query_slots), dtype=np.float64)
        step = max(1, GATHER_BUDGET // queries.shape[1])
        any_zero = bool(q_zero.any() or r_zero.any())
        for start in range(0, len(query_slots), step):
            part = slice(start, start + step)
            difference = np.take(q_rows, query_slots[part], axis=0)
            difference -= np.take(r_rows, reference_slots[part], axis=0)
            keys[part] = np.einsum("pd,pd->p", difference, difference)
            if any_zero:  # similarity 0, as in the float32 search
                keys[part][q_zero[query_slots[part]] | r_zero[reference_slots[part]]] = 2.0
        return keys

    def _converted(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` in float64 divided by the scale, L2-normalised for cosine, and ``[n]``
        bool: the row is zero (cosine only; all False otherwise)."""
        if self.metric != "cosine":
            return rows.astype(np.float64) / self._scale, np.zeros(len(rows), dtype=bool)
        # l2_normalize divides each row by its own power of two (exact), not the shared
        # scale: a row of 1e-200 beside one of 1e200 had underflowed to a zero vector; zero
        # rows stay zero, and a normalised row is all zeros only if it was
        normalised = l2_normalize(rows.astype(np.float64), inplace=True)
        return normalised, np.logical_not(normalised.any(axis=1))


def _slots(values: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """``(slot of each value among the distinct ones, the distinct values)`` for integers in
    ``[0, size)``, in linear time."""
    present = np.zeros(size, dtype=bool)
    present[values] = True
    distinct = np.flatnonzero(present)
    slot_of = np.zeros(size, dtype=np.int64)
    slot_of[distinct] = np.arange(len(distinct))
    return slot_of[values], distinct


def rescore_ties(rows: np.ndarray, indices: np.ndarray, continues: np.ndarray,
                 exact: ExactScores, is_hit: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Re-order each float32 tie group by its float64 keys and keep only float64 ties.

    Args:
        rows: ``[n]`` query rows of ``indices``.
        indices: ``[n, w]`` ranked reference rows, every tie group complete.
        continues: ``[n, w]`` bool, neighbour ``j`` tied with ``j - 1`` in float32
            (:func:`~kdml.evaluation.ties.continues_group`).
        exact: the float64 keys.
        is_hit: ``[n, w]`` bool, the neighbour is relevant to its query, where only the
            retrieval metrics read the result: a group all relevant or all irrelevant scores
            the same in any order and split (its expectation over orders is its one value,
            :mod:`kdml.evaluation.ties`), so only the groups that mix both are re-scored.

    Returns:
        ``(indices, continues)`` of the same shapes: within each group the neighbours sorted by
        their float64 key (stable), and ``continues`` true only where a neighbour's key is
        within :func:`key_tolerance` of the first key of its tie.
    """
    if not continues.any():
        return indices, continues
    group_rows, columns, opens = tied_positions(continues)
    starts = np.flatnonzero(opens)
    # flat positions: indexing by (row, column) pairs took nearly twice as long
    flat = group_rows * indices.shape[1] + columns
    if is_hit is not None:
        sizes = np.diff(np.append(starts, len(flat)))
        relevant = np.add.reduceat(is_hit.ravel()[flat].astype(np.int64), starts)
        mixed = np.repeat((relevant > 0) & (relevant < sizes), sizes)
        if not mixed.any():
            return indices, continues
        group_rows, flat, opens = group_rows[mixed], flat[mixed], opens[mixed]
        starts = np.flatnonzero(opens)
    keys = exact.nearness(rows[group_rows], indices.ravel()[flat])
    dim = exact.dim
    # Groups whose keys all lie within the rounding of their largest are left as they are
    # (a collapsed embedding's, duplicates'): only the others are sorted.
    largest = np.maximum.reduceat(keys, starts)
    spread = largest - np.minimum.reduceat(keys, starts)
    sizes = np.diff(np.append(starts, len(keys)))
    uneven = np.repeat(spread > key_tolerance(largest, dim, exact.metric), sizes)
    if not uneven.any():
        return indices, continues
    flat, keys, opens = flat[uneven], keys[uneven], opens[uneven]
    order = _sorted_within_groups(keys, opens)
    indices, continues = indices.copy(order="C"), continues.copy(order="C")  # ravel: views
    indices.ravel()[flat] = indices.ravel()[flat[order]]
    continues.ravel()[flat] = _ties_from_anchor(keys[order], opens, dim, exact.metric)
    return indices, continues


def _sorted_within_groups(keys: np.ndarray, opens: np.ndarray) -> np.ndarray:
    """``[P]`` positions ordered by group, then key, then position, for the groups of
    consecutive positions that ``opens`` starts (a group's positions are its float32 order).

    The groups of each size are sorted together as the rows of a matrix with a stable sort,
    which gives ``lexsort``'s order about five times faster (docs/benchmarks.md): a nearly
    collapsed embedding's groups are whole rows, of one size; a concentrated one's number
    millions, of a few members each.
    """
    starts = np.flatnonzero(opens)
    sizes = np.diff(np.append(starts, len(keys)))
    if (sizes == sizes[0]).all():  # no gather needed
        within = np.argsort(keys.reshape(len(starts), sizes[0]), axis=1, kind="stable")
        return (within + starts[:, None]).ravel()
    order = np.arange(len(keys))
    by_size = np.argsort(sizes, kind="stable")
    bounds = np.flatnonzero(np.diff(sizes[by_size])) + 1
    for groups in np.split(by_size, bounds):
        positions = starts[groups][:, None] + np.arange(sizes[groups[0]])
        within = np.argsort(keys[positions], axis=1, kind="stable")
        order[positions] = np.take_along_axis(positions, within, axis=1)
    return order


def _ties_from_anchor(keys: np.ndarray, opens: np.ndarray, dim: int, metric: str) -> np.ndarray:
    """``[P]`` bool: sorted key ``p`` is tied with the first key of its tie, where ``opens``
    marks the first position of each float32 group (never tied to the one before)."""
    tied = np.zeros(len(keys), dtype=bool)
    if len(keys) < 2:
        return tied
    steps = keys[1:] - keys[:-1]
    # The tolerance grows with the key, so only steps within the largest key's can be ties:
    # their own tolerances are computed, not those of every key (float64 ties are usually few).
    candidates = np.flatnonzero(steps <= key_tolerance(keys.max(keepdims=True), dim, metric)) + 1
    candidates = candidates[~opens[candidates]]
    tied_at = candidates[steps[candidates - 1] <= key_tolerance(keys[candidates], dim, metric)]
    if not len(tied_at):
        return tied
    tied[tied_at] = True
    # A run of steps each within the tolerance is one tie only if it spans no more than that
    # from its first key; the rare longer runs are cut again from each anchor, in order.
    breaks = np.flatnonzero(np.diff(tied_at) != 1) + 1
    run_starts = tied_at[np.concatenate(([0], breaks))] - 1
    run_ends = tied_at[np.concatenate((breaks - 1, [len(tied_at) - 1]))]
    too_long = keys[run_ends] - keys[run_starts] > key_tolerance(keys[run_ends], dim, metric)
    for start, end in zip(run_starts[too_long], run_ends[too_long], strict=True):
        anchor = keys[start]
        tolerance = key_tolerance(keys[start:end + 1], dim, metric)
        for position in range(start + 1, end + 1):
            tied[position] = keys[position] - anchor <= tolerance[position - start]
            if not tied[position]:
                anchor = keys[position]
    return tied
