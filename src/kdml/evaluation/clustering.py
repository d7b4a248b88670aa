"""Clustering NMI: seeded faiss k-means (k-means++ seeding, in an order fixed by the values)
scored against the class labels with scikit-learn's normalized mutual information."""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from kdml.checks import check_seed
from kdml.errors import KdmlError
from kdml.evaluation.knn import Metric, check_metric, check_positive_int, prepare_vectors
from kdml.evaluation.labels import as_label_vector


def clustering_nmi(
    embeddings: Any,
    labels: Any,
    metric: Metric = "cosine",
    niter: int = 20,
    seed: int = 0,
) -> float:
    r"""Normalized mutual information between k-means clusters and class labels.

    Runs faiss k-means (k-means++ seeding, seeded, one cluster per distinct label, all points
    used for training, at most ``niter`` iterations: faiss stops early once the objective no
    longer changes) on the embeddings, L2-normalized first when ``metric="cosine"``,
    assigns each sample to its nearest centroid and scores the assignment with
    :func:`sklearn.metrics.normalized_mutual_info_score`. The points are clustered in an
    order fixed by their values (:func:`canonical_order`), so the score does not depend on
    the order of the samples.

    Args:
        embeddings: ``(N, D)`` float array or tensor.
        labels: ``(N,)`` integer array or tensor.
        metric: ``"cosine"`` or ``"euclidean"``.
        niter: maximum k-means iterations.
        seed: k-means seed; the same inputs and seed give the same score.

    Returns:
        NMI in ``[0, 1]``.
    """
    check_metric(metric)
    check_positive_int("niter", niter)  # 0 or -1 had given the seeding's clusters silently
    check_seed(seed)
    # faiss's k-means holds both in C ints (its own OverflowError names neither)
    for name, value in (("niter", niter), ("seed", seed)):
        if value >= 2**31:
            raise KdmlError(f"{name} must be below 2**31 (faiss's k-means holds it in a 32-bit "
                            f"integer), got {value}")
    vectors = prepare_vectors(embeddings, metric, "embeddings")
    return kmeans_nmi(vectors, as_label_vector(labels, "labels", len(vectors), vectors.shape[1]),
                      niter, seed)


def canonical_order(vectors: np.ndarray, seed: int = 0) -> np.ndarray:
    """An order of the rows that depends on their values only, not on their positions: by two
    seeded random projections (distinct rows tie on both with probability zero; equal rows
    are interchangeable). k-means starts from rows picked by position, so clustering the rows
    in this order makes NMI invariant to a permutation of the samples."""
    projections = np.random.default_rng(seed).standard_normal((vectors.shape[1], 2))
    keys = vectors.astype(np.float64) @ projections
    return np.lexsort((keys[:, 1], keys[:, 0]))


def kmeans_plus_plus(vectors: np.ndarray, num_clusters: int,
                     rng: np.random.Generator) -> np.ndarray:
    r"""k-means++ seeding (Arthur & Vassilvitskii, 2007): each next centre drawn with
    probability proportional to the squared distance to the nearest centre so far.

    Written here because faiss seeds k-means with random points, which on well-separated
    classes often puts two centres in one class and none in another (a local optimum the
    iterations do not leave); scikit-learn's k-means++ is too slow at SOP's 11,316 clusters.
    Costs :math:`O(N K D)`, one pass over the points per centre. Each pass is one
    matrix-vector product in the vectors' float type (BLAS, every core) giving
    :math:`|x|^2 - 2 x \cdot c + |c|^2` with a bound on its rounding error; only the rows that
    bound cannot rule out as closer to the new centre are measured exactly
    (:func:`_squared_distances`), so the nearest distances, and the centres drawn from them,
    are bit for bit those of measuring every row exactly.
    (Pruning by the triangle inequality, tried, skipped almost nothing: in 512 dimensions the
    distances are too alike.)"""
    rows = kmeans_plus_plus_rows(vectors, num_clusters, rng)
    return np.ascontiguousarray(vectors[rows], dtype=np.float32)


def kmeans_plus_plus_rows(vectors: np.ndarray, num_clusters: int,
                          rng: np.random.Generator) -> list[int]:
    """The rows :func:`kmeans_plus_plus` takes as centres, in the order drawn."""
    first = int(rng.integers(len(vectors)))
    centres = [first]
    nearest = _squared_distances(vectors, vectors[first])
    norms_squared = np.einsum("ij,ij->i", vectors, vectors, dtype=np.float64)
    norms = np.sqrt(norms_squared)
    products = np.empty(len(vectors), dtype=vectors.dtype)
    float_type = np.finfo(vectors.dtype)
    unit_roundoff = float(float_type.eps) / 2  # 2**-24 for float32
    subnormal = float(float_type.smallest_subnormal)
    for _ in range(1, num_clusters):
        total = nearest.sum()
        if total <= 0:  # every point is a centre already: repeat one
            centres.append(centres[-1])
            continue
        chosen = int(np.searchsorted(np.cumsum(nearest), rng.random() * total))
        chosen = min(chosen, len(vectors) - 1)
        centres.append(chosen)
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is measured exactly
            np.dot(vectors, vectors[chosen], out=products)
            estimate = norms_squared - 2.0 * products + norms_squared[chosen]
        error = _estimate_error_bound(norms, norms[chosen], vectors.shape[1], unit_roundoff,
                                      subnormal)
        # rows whose estimate, less its error, is not above their nearest distance (NaN or an
        # overflowed product included): only these can come closer to the new centre
        maybe_closer = np.flatnonzero(~(estimate - error >= nearest))
        if len(maybe_closer):
            exact = _squared_distances(vectors[maybe_closer], vectors[chosen])
            nearest[maybe_closer] = np.minimum(nearest[maybe_closer], exact)
    return centres


def _estimate_error_bound(norms: np.ndarray, centre_norm: float, dim: int,
                          unit_roundoff: float, subnormal: float) -> np.ndarray:
    r"""How far :math:`|x|^2 - 2 x \cdot c + |c|^2`, its product summed in the vectors' float
    type (unit roundoff :math:`u`) in any order, and :func:`_squared_distances`' differences
    and squares in that type can each be from
    :math:`|x - c|^2`: :math:`2 \gamma_D |x| |c|` for the product (Higham, Accuracy and
    Stability of Numerical Algorithms, Eq. 3.5, with Cauchy-Schwarz; :math:`\gamma_D = D u /
    (1 - D u)`) and :math:`3u` of the squared distance, at most :math:`(|x| + |c|)^2`, for the
    exact route; :math:`3u` more for the estimate's own sums, and :math:`2 \gamma_D` of
    float64 for the sums both routes take in float64 (the norms, the exact route's sum). A
    product or square below the smallest normal number is off by up to half the smallest
    subnormal :math:`\eta` whatever its size, which no relative bound covers: :math:`(2D + 4)
    \eta` more (an underflow in each of the D products, squares and float64 norms)."""
    gamma = dim * unit_roundoff / (1.0 - dim * unit_roundoff)
    float64_unit = 2.0**-53
    gamma64 = dim * float64_unit / (1.0 - dim * float64_unit)
    return ((2.0 * gamma * centre_norm) * norms
            + (6.0 * unit_roundoff + 2.0 * gamma64) * (norms + centre_norm) ** 2
            + (2 * dim + 4) * subnormal)


SQUARED_DISTANCE_ROWS = 1024  # rows per block: the block's differences stay in the CPU's cache


def _squared_distances(vectors: np.ndarray, centre: np.ndarray) -> np.ndarray:
    """``((vectors - centre) ** 2).sum(axis=1)`` summed in float64, the same values, computed
    block by block in one reused buffer: the whole ``(N, D)`` difference and its square, two
    passes through memory, took twice as long (SOP's 60,502 x 512: 80 ms a centre)."""
    distances = np.empty(len(vectors), dtype=np.float64)
    block = np.empty((min(SQUARED_DISTANCE_ROWS, len(vectors)), vectors.shape[1]),
                     dtype=np.result_type(vectors, centre))
    for start in range(0, len(vectors), SQUARED_DISTANCE_ROWS):
        rows = vectors[start:start + SQUARED_DISTANCE_ROWS]
        difference = block[:len(rows)]
        np.subtract(rows, centre, out=difference)
        np.square(difference, out=difference)
        difference.sum(axis=1, dtype=np.float64, out=distances[start:start + len(rows)])
    return distances


def centred_float32(vectors: np.ndarray) -> np.ndarray:
    """The rows less their mean, as float32: subtracted in float64 element by element and
    rounded into float32, with no ``(N, D)`` float64 copy (250 MB at SOP's size)."""
    centred = np.empty_like(vectors, dtype=np.float32)
    np.subtract(vectors, vectors.mean(axis=0, dtype=np.float64), out=centred, casting="unsafe")
    return centred


def kmeans_assign(vectors: np.ndarray, num_clusters: int, niter: int = 20,
                  seed: int = 0) -> np.ndarray:
    """Seeded faiss k-means (k-means++ seeding) cluster of each row, computed in
    :func:`canonical_order`, on the rows less their mean: k-means does not depend on a shift,
    but faiss's float32 distances (``|x|^2 - 2 x.c + |c|^2``) lose the spread's digits when
    the rows sit far from the origin, as one chart's codes do (chart_clustering_nmi)."""
    vectors = centred_float32(vectors)
    order = canonical_order(vectors, seed)
    kmeans = faiss.Kmeans(
        vectors.shape[1],
        num_clusters,
        # Python ints: faiss's SWIG setters refuse NumPy integers, which the checks take
        niter=int(niter),
        seed=int(seed),
        # Train on every point (no subsampling) and skip faiss's "too few points per
        # centroid" warning, which fires for any retrieval data set.
        max_points_per_centroid=max(1, -(-len(vectors) // num_clusters)),
        min_points_per_centroid=1,
    )
    ordered = np.ascontiguousarray(vectors[order])
    kmeans.train(ordered, init_centroids=kmeans_plus_plus(ordered, num_clusters,
                                                          np.random.default_rng(seed)))
    _, assigned = kmeans.index.search(ordered, 1)
    assignments = np.empty(len(vectors), dtype=np.int64)
    assignments[order] = assigned.ravel()
    return assignments


def nmi_score(labels: np.ndarray, clusters: np.ndarray) -> float:
    """scikit-learn's NMI, kept within [0, 1] (its float rounding can give 1 + 2e-16)."""
    # imported here, not at the top: scikit-learn (which brings scipy.stats and pandas)
    # takes seconds to import, and every kdml command would pay that to start
    from sklearn.metrics import normalized_mutual_info_score

    return float(np.clip(normalized_mutual_info_score(labels, clusters), 0.0, 1.0))


def kmeans_nmi(vectors: np.ndarray, labels: np.ndarray, niter: int = 20, seed: int = 0) -> float:
    """:func:`clustering_nmi` on already prepared float32 vectors and int64 labels."""
    return nmi_score(labels, kmeans_assign(vectors, len(np.unique(labels)), niter, seed))
