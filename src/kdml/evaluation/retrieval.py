"""Retrieval metrics for metric learning: Recall@K, MAP@R, R-Precision and NMI."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from kdml.checks import is_positive_int
from kdml.errors import KdmlError
from kdml.evaluation.clustering import kmeans_nmi
from kdml.evaluation.knn import (
    DEFAULT_CHUNK_SIZE,
    Metric,
    Vectors,
    check_metric,
    check_positive_int,
    equal_values,
    prepare_pair,
    prepare_vectors,
    resolve_backend,
    search_prepared,
    search_rows,
)
from kdml.evaluation.labels import as_label_vector
from kdml.evaluation.rescoring import ExactScores, rescore_ties
from kdml.evaluation.ties import (
    continues_from_gaps,
    expected_scores,
    group_reaches_last_column,
    last_group_settled,
    row_totals,
    score_gaps,
    tie_tolerance,
)


class LabelIndex(NamedTuple):
    """Labels mapped to dense codes, plus each query's number of relevant references."""

    query_codes: np.ndarray  # (Nq,)
    reference_codes: np.ndarray  # (Nr,)
    num_relevant: np.ndarray  # (Nq,) R: references sharing the query's label, self excluded


def index_labels(query_labels: np.ndarray, reference_labels: np.ndarray | None) -> LabelIndex:
    """Count R per query; ``reference_labels=None`` means the queries are the reference."""
    if reference_labels is None:
        _, codes = np.unique(query_labels, return_inverse=True)
        codes = codes.ravel()
        num_relevant = np.bincount(codes)[codes] - 1  # the query itself is not relevant
        return LabelIndex(codes, codes, num_relevant)
    _, codes = np.unique(np.concatenate([query_labels, reference_labels]), return_inverse=True)
    codes = codes.ravel()
    query_codes, reference_codes = codes[: len(query_labels)], codes[len(query_labels) :]
    counts = np.bincount(reference_codes, minlength=int(codes.max()) + 1)
    return LabelIndex(query_codes, reference_codes, counts[query_codes])


def check_ks(ks: Sequence[int], available: int) -> tuple[int, ...]:
    """Validate the K values of Recall@K against the references available to a query."""
    if not isinstance(ks, Sequence | np.ndarray):
        raise KdmlError(f"ks must be a sequence of positive integers, got {ks!r}")
    ks = tuple(ks)
    if not ks:
        raise KdmlError("ks must name at least one K")
    for k in ks:
        if not is_positive_int(k):
            raise KdmlError(f"every K in ks must be a positive integer, got {k!r}")
        if k > available:
            raise KdmlError(f"K={k} in ks is larger than the {available} available references")
    return tuple(int(k) for k in ks)


def retrieval_metrics(
    embeddings: Any,
    labels: Any,
    ks: Sequence[int] = (1, 2, 4, 8),
    metric: Metric = "cosine",
    reference: Any | None = None,
    reference_labels: Any | None = None,
    nmi: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    backend: str = "auto",
) -> dict[str, float]:
    r"""Recall@K, MAP@R, R-Precision and NMI of an embedding, by exact k-NN search.

    Each embedding is a query. Without ``reference`` the queries are searched against
    themselves with the query left out (leave-one-out); with ``reference`` they are
    searched against that separate set. For a query with label :math:`y`, let
    :math:`R` be the number of references labelled :math:`y` (the query itself
    excluded), :math:`\mathrm{rel}(i) = 1` when its :math:`i`-th nearest neighbour is
    labelled :math:`y`, and :math:`P(i) = \frac{1}{i}\sum_{j \le i} \mathrm{rel}(j)`.
    Following Musgrave et al., "A Metric Learning Reality Check", ECCV 2020:

    .. math::
        \mathrm{Recall@K} = [\textstyle\sum_{i \le K} \mathrm{rel}(i) > 0], \quad
        \mathrm{R\text{-}Precision} = \frac{1}{R}\sum_{i=1}^{R} \mathrm{rel}(i), \quad
        \mathrm{MAP@R} = \frac{1}{R}\sum_{i=1}^{R} P(i)\,\mathrm{rel}(i),

    each averaged over the queries. Queries whose label has no other sample in the
    reference set (:math:`R = 0`, "lone" queries) are left out of these averages, as
    pytorch-metric-learning's ``AccuracyCalculator`` does; if every query is lone a
    :class:`~kdml.errors.KdmlError` is raised rather than returning NaN.

    **Ties.** The search runs in float32, which cannot order neighbours whose scores differ by
    less than its rounding can move them: up to about the dimension's number of ulps of the
    query's score scale (:func:`~kdml.evaluation.ties.tie_tolerance`). Such neighbours are
    scored again in float64 from the embeddings as given and re-ordered
    (:mod:`kdml.evaluation.rescoring`), so the ranks are those of exact arithmetic on the
    given values (on 4,000 unit vectors on a circle Recall@1 is 0.666, where counting the
    float32 near-ties as ties gave 0.597). Neighbours whose float64 keys are equal within
    their rounding (duplicates, or scaled copies under the cosine metric;
    :func:`~kdml.evaluation.rescoring.key_tolerance`, from the first key of the tie) are tied,
    and each metric is its expectation over random orders of the tied neighbours
    (:mod:`kdml.evaluation.ties`): exact for Recall@K, R-Precision and MAP@R. So the scores
    never depend on the order of the samples: 500 identical embeddings in 50 classes of 10
    give Recall@1 = 9/499 and Recall@8 = 1 - C(490, 8) / C(499, 8). Queries without float32
    near-ties take the plain path, at no extra cost.

    **Scale.** Both metrics are invariant to a positive scaling of all embeddings (exactly where
    the scaling rounds no value, a power of two; otherwise the ranks are those of the rounded
    values): vectors whose largest absolute value is beyond 2^30 or below 2^-30 are divided by a
    power of two before the float32 search (:func:`~kdml.evaluation.knn.search_scale`), so
    values up to float64's range are searched without overflow. The Euclidean metric is also
    invariant to a shift: the vectors are searched relative to the reference's median
    (:func:`~kdml.evaluation.knn.search_centre`), so float32's rounding of faiss's
    :math:`|q|^2 + |r|^2 - 2 q \cdot r` follows the embeddings' spread, not their distance
    from the origin. One shift serves every query: a cluster far from the median whose spread
    is below about 1e-7 of that distance (float32's resolution there) ties in float32, and is
    ordered by the float64 re-scoring.

    NMI (``nmi=True``) clusters the query embeddings with seeded faiss k-means into as
    many clusters as there are query labels and compares clusters with labels, see
    :func:`~kdml.evaluation.clustering.clustering_nmi`. With a ``reference`` (a gallery), the
    queries and the reference are clustered together, into as many clusters as they have
    labels: queries alone, one or two of a class (In-Shop's), put each query in its own
    cluster, an NMI near 1 whatever the embedding.

    The search runs on chunks of ``chunk_size`` queries, each with
    ``k = max(max(ks), largest R in the chunk)`` neighbours; per-query values are
    reduced once at the end, so the result does not depend on ``chunk_size`` and
    memory stays ``O(chunk_size * k)`` on top of the (normalized) embeddings.

    Args:
        embeddings: ``(N, D)`` query embeddings, numpy array or torch tensor of any
            float dtype.
        labels: ``(N,)`` integer class labels of the queries (bools are the classes 0 and 1,
            as the losses and pytorch-metric-learning take them).
        ks: the K values of Recall@K; each must be at most the number of references
            available to a query (``N - 1`` without ``reference``).
        metric: ``"cosine"`` (L2-normalize, rank by inner product) or ``"euclidean"``
            (rank by squared L2 distance).
        reference: optional ``(M, D)`` reference embeddings searched instead of the
            queries themselves. The query set itself (``embeddings``, or a view of its memory
            with the same shape, such as ``x.detach()`` or ``x[:]``) is refused: each query
            would retrieve itself first. A copy with equal values and equal
            ``reference_labels`` (``x.clone()``) is warned of but searched: different samples
            can legitimately embed alike (a collapsed model's equally many gallery and query
            images in one label order, or a gallery that truly duplicates the queries), so
            equal contents do not prove the same set.
        reference_labels: ``(M,)`` integer labels of ``reference``; required exactly
            when ``reference`` is given.
        nmi: also compute NMI (slow for many classes).
        chunk_size: queries per k-NN search.
        backend: ``"faiss"`` (CPU), ``"torch"`` (a chunked matmul + topk on the embeddings'
            device) or ``"auto"``: torch for tensors on a GPU, faiss otherwise. Both give the
            same metrics (their float32 near-ties are re-scored alike).

    Returns:
        ``{"recall@K": ... for each K, "map@r": ..., "r_precision": ..., "nmi": ...}``
        as floats in ``[0, 1]``; ``"nmi"`` only when ``nmi=True``.

    Raises:
        KdmlError: on mismatched shapes, non-integer labels, non-finite or empty
            embeddings, tensors on the meta device (which hold no values), invalid ``ks``, an
            unknown ``metric``, ``reference`` without ``reference_labels`` (or the reverse), a
            ``reference`` that is the query set itself, or when every query is lone.

    Warns:
        UserWarning: when ``reference`` and ``reference_labels`` equal the queries and their
            labels (see ``reference``).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> labels = np.repeat(np.arange(10), 5)
        >>> embeddings = rng.standard_normal((10, 32))[labels] + 0.1 * rng.standard_normal(
        ...     (50, 32))
        >>> retrieval_metrics(embeddings, labels, ks=(1, 4), nmi=False)
        {'recall@1': 1.0, 'recall@4': 1.0, 'map@r': 1.0, 'r_precision': 1.0}
    """
    check_metric(metric)
    if (reference is None) != (reference_labels is None):
        raise KdmlError("reference and reference_labels must be given together")
    if reference is not None:
        refuse_query_set_as_reference(embeddings, reference, "reference",
                                      "reference and reference_labels")
    check_positive_int("chunk_size", chunk_size)
    same_set = reference is None
    backend = resolve_backend(backend, embeddings, reference)
    if same_set:
        query_vectors = reference_vectors = prepare_vectors(embeddings, metric, "embeddings",
                                                            backend)
        reference_label_vector = None
    else:
        query_vectors, reference_vectors = prepare_pair(embeddings, reference, metric,
                                                        ("embeddings", "reference"), backend)
        reference_label_vector = as_label_vector(reference_labels, "reference_labels",
                                                 len(reference_vectors), reference_vectors.shape[1])
    query_labels = as_label_vector(labels, "labels", len(query_vectors), query_vectors.shape[1])
    if (reference_label_vector is not None
            and np.array_equal(query_labels, reference_label_vector)
            and equal_values(embeddings, reference)):
        warn_of_query_copy("reference holds the same embeddings and labels",
                           "reference and reference_labels", stacklevel=2)
    available = len(reference_vectors) - int(same_set)
    ks = check_ks(ks, available)
    label_index = index_labels(query_labels, reference_label_vector)
    num_relevant = label_index.num_relevant
    is_counted = num_relevant > 0  # lone queries (R = 0) are left out, as in PML
    if not is_counted.any():
        raise KdmlError(
            "no query has another sample of its class in the reference set, so "
            "recall@K, map@r and r_precision are undefined"
        )

    def relevance(rows: np.ndarray, indices: np.ndarray) -> np.ndarray:
        return label_index.reference_codes[indices] == label_index.query_codes[rows, None]

    search = RankedSearch(query_vectors, reference_vectors, metric, same_set, chunk_size,
                          ExactScores(embeddings, reference, metric), relevance, num_relevant)
    scores = _RetrievalScores(len(query_vectors), ks)
    for rows, ranked in search.ranked(np.maximum(max(ks), num_relevant)):
        scores.add(rows, relevance(rows, ranked.indices), num_relevant[rows], ranked.continues)

    results = scores.averages(is_counted)
    if nmi and reference_label_vector is None:
        results["nmi"] = kmeans_nmi(_on_host(query_vectors), query_labels)
    elif nmi:  # the queries and the reference (a gallery) together
        results["nmi"] = kmeans_nmi(
            np.concatenate([_on_host(query_vectors), _on_host(reference_vectors)]),
            np.concatenate([query_labels, reference_label_vector]))
    return results


def refuse_query_set_as_reference(queries: Any, reference: Any, name: str,
                                  arguments: str) -> None:
    """Refuse a ``reference`` (the argument ``name``) that is the query set itself
    (:func:`_same_memory`): each query would find itself first, Recall@1 of 1 on random data
    (PML's ``ref_includes_query``); without the reference ``arguments`` the same set is
    searched leave-one-out."""
    if _same_memory(reference, queries):
        raise KdmlError(f"{name} is the query set itself, where each query would retrieve "
                        f"itself; leave {arguments} out to search the set leave-one-out")
    if _shares_rows(queries, reference):  # x[:100] against x had scored Recall@1 of 1
        raise KdmlError(f"some queries are rows of {name} (the same memory), where each would "
                        f"retrieve itself; leave {arguments} out to search the whole set "
                        f"leave-one-out, or give a {name} without the queries")


def _shares_rows(queries: Any, reference: Any) -> bool:
    """Whether a row of ``queries`` is a row of ``reference`` in memory (a slice or other
    view of it: ``x[:100]`` or ``x[::2]`` against ``x``), for two tensors on one device or two
    NumPy arrays of one dtype and row layout; ``x[::2]`` against ``x[1::2]`` shares none."""
    if isinstance(queries, torch.Tensor) and isinstance(reference, torch.Tensor):
        if (queries.device != reference.device or queries.device.type == "meta"
                or queries.untyped_storage().data_ptr()
                != reference.untyped_storage().data_ptr()):
            return False
        size = queries.element_size()
        starts = (queries.data_ptr(), reference.data_ptr())
        strides = tuple(tuple(step * size for step in matrix.stride())
                        for matrix in (queries, reference))
    elif isinstance(queries, np.ndarray) and isinstance(reference, np.ndarray):
        if not np.may_share_memory(queries, reference):
            return False
        starts = (queries.__array_interface__["data"][0],
                  reference.__array_interface__["data"][0])
        strides = (queries.strides, reference.strides)
    else:
        return False
    if (queries.ndim != 2 or reference.ndim != 2 or queries.dtype != reference.dtype
            or queries.shape[1] != reference.shape[1] or strides[0][1] != strides[1][1]
            or 0 in queries.shape or 0 in reference.shape or strides[1][0] == 0):
        return False
    # the byte offset of each query row from the reference's first row, in reference rows
    offsets = starts[0] - starts[1] + np.arange(len(queries), dtype=np.int64) * strides[0][0]
    rows, rest = np.divmod(offsets, strides[1][0])
    return bool(((rest == 0) & (rows >= 0) & (rows < len(reference))).any())


def warn_of_query_copy(what: str, arguments: str, stacklevel: int) -> None:
    """Warn that a reference equals the queries (``what`` says in which parts): searched as
    given, since a gallery can legitimately duplicate them. ``stacklevel`` as the calling
    function's own ``warnings.warn`` would take it."""
    warnings.warn(f"{what} as the queries, so each query retrieves its own copy first "
                  f"(Recall@1 of 1 on random data); leave {arguments} out to search the set "
                  "leave-one-out, unless the gallery truly duplicates the queries",
                  UserWarning, stacklevel=stacklevel + 1)


def _same_memory(reference: Any, embeddings: Any) -> bool:
    """Whether ``reference`` is ``embeddings`` or a view of the same memory with the same
    shape, strides and dtype (``x.detach()``, ``x[:]``, ``x.view(x.shape)``): the query set
    itself, whatever the object. Tensors against tensors and NumPy arrays against arrays;
    an empty or meta tensor has no memory to share."""
    if reference is embeddings:
        return True
    if isinstance(reference, torch.Tensor) and isinstance(embeddings, torch.Tensor):
        return (reference.device == embeddings.device and reference.device.type != "meta"
                and reference.numel() > 0 and reference.dtype == embeddings.dtype
                and reference.shape == embeddings.shape
                and reference.stride() == embeddings.stride()
                and reference.data_ptr() == embeddings.data_ptr())
    if isinstance(reference, np.ndarray) and isinstance(embeddings, np.ndarray):
        return (reference.size > 0 and reference.dtype == embeddings.dtype
                and reference.shape == embeddings.shape
                and reference.strides == embeddings.strides
                and reference.__array_interface__["data"][0]
                == embeddings.__array_interface__["data"][0])
    return False


def _on_host(vectors: np.ndarray | torch.Tensor) -> np.ndarray:
    return vectors.cpu().numpy() if isinstance(vectors, torch.Tensor) else vectors


class Ranked(NamedTuple):
    """Ranked neighbours of some queries: ``indices`` and ``continues`` (tie flags: float32's,
    :func:`~kdml.evaluation.ties.continues_group`, or float64's after
    :func:`~kdml.evaluation.rescoring.rescore_ties`), both ``(n, w)``."""

    indices: np.ndarray
    continues: np.ndarray


# How many tie tolerances past the last rank scored a neighbour may still rank there in exact
# arithmetic: each float32 score is within half a tolerance of its exact one (RankedSearch)
REACH = 2.0


class RankedSearch:
    """Exact k-NN in query chunks that also returns tie groups, complete where they matter.

    For each query it retrieves one neighbour more than the ranks scored, so it can see
    whether the tie group holding the last scored rank goes on; when it does (and more
    references exist), that query is searched again with twice as many neighbours, until the
    group ends, its end is out of reach of the last rank scored (no neighbour beyond can rank
    there in exact arithmetic), or every reference is retrieved; with every reference at once
    when all its neighbours are tied within reach of the first. A collapsed embedding of N
    points therefore costs one N x N search after the first; without ties nothing is
    searched twice.
    """

    # Widened searches run in batches of at most this many (query, neighbour) results.
    WIDEN_BUDGET = 2**24

    def __init__(self, query_vectors: Vectors, reference_vectors: Vectors, metric: str,
                 exclude_self: bool, chunk_size: int, exact: ExactScores | None = None,
                 relevance: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                 num_relevant: np.ndarray | None = None) -> None:
        self.queries, self.reference, self.exact = query_vectors, reference_vectors, exact
        # (rows, indices [n, w]) -> [n, w] bool, and each query's number of relevant
        # references: where only the retrieval metrics read the ranks, only tie groups of
        # relevant and irrelevant neighbours are re-scored, and a group running past the
        # retrieved neighbours is searched further only where its other members may change a
        # score
        self.relevance, self.num_relevant = relevance, num_relevant
        self.metric, self.exclude_self, self.chunk_size = metric, exclude_self, chunk_size
        self.dim = int(reference_vectors.shape[1])
        self.available = len(reference_vectors) - int(exclude_self)
        self.reference_norms = _norms(reference_vectors)
        self.query_norms = self.reference_norms if exclude_self else _norms(query_vectors)
        self.largest_reference_norm = np.full((1, 1), self.reference_norms.max(initial=0.0))

    def _largest_tolerance(self, rows: np.ndarray) -> np.ndarray:
        """``[n, 1]`` the tie tolerance of each query with a neighbour at the largest reference
        norm: an upper bound of its tolerances with every neighbour."""
        return tie_tolerance(self.query_norms[rows], self.largest_reference_norm, self.metric,
                             self.dim)

    def _continues(self, rows: np.ndarray, scores: np.ndarray, indices: np.ndarray,
                   needed: np.ndarray) -> np.ndarray:
        """``[n, w]`` float32 tie flags (:func:`~kdml.evaluation.ties.continues_group`), none
        among the neighbours out of reach of rank ``needed``.

        A neighbour ranked after ``needed`` whose float32 score is more than twice the tie
        tolerance (at the largest reference norm) from the score at rank ``needed`` is out of
        reach: each float32 score is within half a tolerance of its exact one, so in exact
        arithmetic it, and every neighbour not retrieved, ranks after the ``needed`` nearest
        retrieved ones. Its ties decide no score, and are cut: the group holding rank
        ``needed`` ends before it. On dense embeddings (a model early in training, where every
        gap is under the tolerance) the chain of float32 ties had run to the last reference:
        every query had been searched again, wider and wider, up to all of them, and each
        chain re-scored in float64 whole.
        """
        # Most queries have no tie at all. Their gaps exceed even the tolerance with every
        # neighbour at the largest reference norm, an upper bound of the exact one, which
        # gathers [n, w] norms: only queries with a gap under the bound need it. Same result.
        bound = self._largest_tolerance(rows)
        gaps = score_gaps(scores)
        maybe = (gaps <= bound).any(axis=1)
        continues = np.zeros(scores.shape, dtype=bool)
        if maybe.any():
            tolerance = tie_tolerance(self.query_norms[rows[maybe]],
                                      self.reference_norms[indices[maybe]], self.metric,
                                      self.dim)
            tied = continues_from_gaps(gaps[maybe], tolerance)
            # only the columns after the first rank scored are compared; in float32 (its
            # rounding of a difference is nothing beside the factor 2 of the reach)
            tied_scores, after = scores[maybe], needed[maybe]
            first = int(after.min())
            at_needed = np.take_along_axis(tied_scores, (after - 1)[:, None], axis=1)
            out_of_reach = (np.abs(tied_scores[:, first:] - at_needed)
                            > (REACH * bound[maybe]).astype(tied_scores.dtype))
            out_of_reach &= np.arange(first, scores.shape[1]) >= after[:, None]  # after it
            tied[:, first:] &= ~out_of_reach
            continues[maybe] = tied
        return continues

    def ranked(self, needed: np.ndarray) -> Iterator[tuple[np.ndarray, Ranked]]:
        """``(rows, Ranked)`` covering every query once, in chunks; ``needed[i]`` ranks of
        query ``i`` are scored, so its tie groups up to that rank are complete."""
        searched = np.minimum(needed + 1, self.available)
        # Widened at the end, all in one search: each search reads the whole reference, so
        # a few rows per chunk searched chunk by chunk cost a full pass each.
        pending: dict[int, list[np.ndarray]] = {}
        for chunk in search_prepared(self.queries, self.reference, searched, self.metric,
                                     self.exclude_self, self.chunk_size):
            rows = np.arange(chunk.start, chunk.stop)
            continues = self._continues(rows, chunk.scores, chunk.indices, needed[rows])
            incomplete = np.zeros(len(rows), dtype=bool)
            if continues.any() and chunk.indices.shape[1] < self.available:
                incomplete = self._incomplete(rows, chunk.indices, continues, needed[rows])
            done = ~incomplete
            if done.any():
                yield rows[done], self._ranked(rows[done], chunk.indices[done], continues[done])
            if incomplete.any():
                self._queue(pending, rows[incomplete], chunk.scores[incomplete],
                            continues[incomplete])
        yield from self._widen(pending, needed)

    def _incomplete(self, rows: np.ndarray, indices: np.ndarray, continues: np.ndarray,
                    needed: np.ndarray) -> np.ndarray:
        """``[n]`` bool: the tie group holding rank ``needed`` runs past the retrieved
        neighbours, and (where relevance is known) its unretrieved members could change a score
        (:func:`~kdml.evaluation.ties.last_group_settled`)."""
        incomplete = group_reaches_last_column(continues, needed)
        if self.relevance is not None and self.num_relevant is not None and incomplete.any():
            these = np.flatnonzero(incomplete)
            incomplete[these] = ~last_group_settled(
                self.relevance(rows[these], indices[these]), continues[these],
                self.num_relevant[rows[these]])
        return incomplete

    def _ranked(self, rows: np.ndarray, indices: np.ndarray, continues: np.ndarray) -> Ranked:
        """Complete tie groups, re-ordered in float64 when ``exact`` is given."""
        if self.exact is not None:
            is_hit = None if self.relevance is None else self.relevance(rows, indices)
            indices, continues = rescore_ties(rows, indices, continues, self.exact, is_hit)
        return Ranked(indices, continues)

    def _queue(self, pending: dict[int, list[np.ndarray]], rows: np.ndarray,
               scores: np.ndarray, continues: np.ndarray) -> None:
        """Queue rows whose last group is incomplete at twice their width; at every
        reference when all their neighbours are tied with the first and within reach of it
        (twice the tie tolerance, as :meth:`_continues` reaches), which is a collapsed
        embedding's case: doubling would search it log2(N / w) times before the end. A dense
        embedding's chain of ties, whose ends are farther apart, doubles: its end is soon out
        of reach of the ranks scored."""
        width = continues.shape[1]
        spread = np.abs(scores[:, -1] - scores[:, 0].astype(np.float64))
        everything_tied = (continues[:, 1:].all(axis=1)
                           & (spread <= REACH * self._largest_tolerance(rows)[:, 0]))
        for next_width, these in ((self.available, everything_tied),
                                  (min(2 * width, self.available), ~everything_tied)):
            if these.any():
                pending.setdefault(next_width, []).append(rows[these])

    def _widen(self, pending: dict[int, list[np.ndarray]],
               needed: np.ndarray) -> Iterator[tuple[np.ndarray, Ranked]]:
        """Search the queued rows again, narrowest width first, until each group ends."""
        while pending:
            width = min(pending)
            rows = np.concatenate(pending.pop(width))
            batch = max(1, self.WIDEN_BUDGET // width)
            for start in range(0, len(rows), batch):
                part = rows[start:start + batch]
                scores, indices = search_rows(self.queries, part, self.reference, width,
                                              self.metric, self.exclude_self)
                continues = self._continues(part, scores, indices, needed[part])
                done = np.ones(len(part), dtype=bool)
                if width < self.available:
                    done = ~self._incomplete(part, indices, continues, needed[part])
                if done.any():
                    yield part[done], self._ranked(part[done], indices[done], continues[done])
                if not done.all():
                    self._queue(pending, part[~done], scores[~done], continues[~done])


def _norms(vectors: np.ndarray | torch.Tensor) -> np.ndarray:
    """L2 norms of the rows, float64, on the host (the tie tolerances use them)."""
    if isinstance(vectors, torch.Tensor):
        return torch.linalg.vector_norm(vectors.double(), dim=1).cpu().numpy()
    return np.sqrt(np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64))


class _RetrievalScores:
    """Per-query scores filled chunk by chunk, averaged once at the end.

    Keeping per-query values (a few floats per query) rather than running sums makes
    the averages bit-identical whatever the chunk size. Queries with tied neighbours get the
    expected scores of :func:`~kdml.evaluation.ties.expected_scores`; the others (all of them,
    usually) take the plain path.
    """

    def __init__(self, num_queries: int, ks: tuple[int, ...]) -> None:
        self.ks = ks
        self.recall_hit = np.zeros((len(ks), num_queries))
        self.average_precision = np.zeros(num_queries)
        self.r_precision = np.zeros(num_queries)

    def add(self, rows: np.ndarray | slice, is_hit: np.ndarray, num_relevant: np.ndarray,
            continues: np.ndarray | None = None) -> None:
        """Score some queries: ``is_hit`` is ``(n, k)``, neighbours' label == query label;
        ``continues`` flags tied neighbours (``None``: no ties)."""
        if continues is not None and continues.any():
            tied = continues.any(axis=1)
            rows = np.arange(self.r_precision.size)[rows]
            recall, average_precision, r_precision = expected_scores(
                is_hit[tied], continues[tied], self.ks, num_relevant[tied])
            self.recall_hit[:, rows[tied]] = recall
            self.average_precision[rows[tied]] = average_precision
            self.r_precision[rows[tied]] = r_precision
            rows, is_hit, num_relevant = rows[~tied], is_hit[~tied], num_relevant[~tied]
        self._add_untied(rows, is_hit, num_relevant)

    def _add_untied(self, rows: np.ndarray | slice, is_hit: np.ndarray,
                    num_relevant: np.ndarray) -> None:
        if not len(num_relevant):
            return
        for position, k in enumerate(self.ks):
            self.recall_hit[position, rows] = is_hit[:, :k].any(axis=1)
        width = int(num_relevant.max())
        if width == 0:  # only lone queries in this chunk
            return
        # rel(i) for i <= R; later columns are beyond each query's R and do not count.
        relevant = is_hit[:, :width] & (np.arange(width) < num_relevant[:, None])
        hits_so_far = np.cumsum(relevant, axis=1)
        precision_at_i = hits_so_far / np.arange(1, width + 1)
        r = np.maximum(num_relevant, 1)  # lone rows score 0 and are masked out later
        self.r_precision[rows] = hits_so_far[:, -1] / r
        self.average_precision[rows] = row_totals(precision_at_i * relevant) / r

    def averages(self, is_counted: np.ndarray) -> dict[str, float]:
        results = {
            f"recall@{k}": float(self.recall_hit[position, is_counted].mean())
            for position, k in enumerate(self.ks)
        }
        results["map@r"] = float(self.average_precision[is_counted].mean())
        results["r_precision"] = float(self.r_precision[is_counted].mean())
        return results
