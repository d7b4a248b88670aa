"""NMI of the retrieval evaluation (plain and per chart, Atlas) against a literal float64
implementation of its definition,

    NMI(Y, C) = I(Y; C) / ((H(Y) + H(C)) / 2),

with entropies and mutual information summed over the label/cluster contingency table (natural
logarithms; two one-block partitions score 1, the convention of scikit-learn, the peer kdml
uses). The clusterings are fixed by the data: tight, far-apart blobs that k-means (one cluster
per label) must recover exactly, and that do not follow the labels, so the scores are neither 0
nor 1.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from sklearn.metrics import normalized_mutual_info_score

from kdml.errors import KdmlError
from kdml.evaluation.charts import chart_clustering_nmi
from kdml.evaluation.clustering import clustering_nmi, nmi_score
from kdml.evaluation.retrieval import retrieval_metrics


def literal_nmi(labels: list[int], clusters: list[int]) -> float:
    n = len(labels)
    label_counts, cluster_counts = Counter(labels), Counter(clusters)
    if len(label_counts) == len(cluster_counts) == 1:
        return 1.0  # both partitions are one block: identical
    joint = Counter(zip(labels, clusters, strict=True))
    mutual = sum(
        c / n * math.log((c / n) / (label_counts[y] / n * cluster_counts[k] / n))
        for (y, k), c in joint.items()
    )
    h_labels = -sum(c / n * math.log(c / n) for c in label_counts.values())
    h_clusters = -sum(c / n * math.log(c / n) for c in cluster_counts.values())
    if mutual == 0.0:
        return 0.0
    return mutual / ((h_labels + h_clusters) / 2)


@pytest.mark.parametrize(
    ("n", "num_labels", "num_clusters", "seed"),
    [(1, 1, 1, 0), (5, 1, 3, 1), (5, 3, 1, 2), (12, 3, 3, 3), (40, 6, 4, 4), (60, 5, 60, 5)],
)
def test_nmi_score_matches_the_literal_definition(n, num_labels, num_clusters, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_labels, n) * 7 - 3
    clusters = (
        rng.permutation(n) % num_clusters if num_clusters == n else rng.integers(0, num_clusters, n)
    )
    expected = literal_nmi(labels.tolist(), clusters.tolist())
    assert nmi_score(labels, clusters) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert normalized_mutual_info_score(labels, clusters) == pytest.approx(
        expected, rel=1e-12, abs=1e-15
    )


def blob_data(
    blob_sizes: list[int], num_labels: int, dim: int, seed: int, offset: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Points in tight blobs 100 apart, labels drawn independently of the blobs (each label
    used), and the blob of each point."""
    rng = np.random.default_rng(seed)
    blobs = np.repeat(np.arange(len(blob_sizes)), blob_sizes)
    centres = 100.0 * rng.standard_normal((len(blob_sizes), dim)) + offset
    points = centres[blobs] + 0.01 * rng.standard_normal((len(blobs), dim))
    labels = rng.permutation(np.arange(len(blobs)) % num_labels)
    order = rng.permutation(len(blobs))
    return points[order], labels[order] * 3 + 1, blobs[order]


@pytest.mark.parametrize(
    ("blob_sizes", "dim", "seed"),
    [([4, 6, 5], 2, 0), ([10, 3, 7, 8], 3, 1), ([12, 12, 12, 12, 12], 4, 2)],
)
def test_clustering_nmi_of_recoverable_blobs_is_the_literal_nmi_of_the_blobs(blob_sizes, dim, seed):
    points, labels, blobs = blob_data(blob_sizes, len(blob_sizes), dim, seed)
    expected = literal_nmi(labels.tolist(), blobs.tolist())
    assert 0.0 < expected < 1.0
    got = clustering_nmi(points, labels, metric="euclidean")
    assert got == pytest.approx(expected, rel=1e-12)
    scores = retrieval_metrics(points, labels, ks=(1,), metric="euclidean")
    assert scores["nmi"] == pytest.approx(expected, rel=1e-12)


def test_cosine_nmi_clusters_directions():
    """Under the cosine metric blobs of one direction at different norms are one cluster."""
    rng = np.random.default_rng(3)
    directions = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    blobs = np.repeat(np.arange(3), [5, 7, 6])
    norms = rng.uniform(0.5, 20.0, len(blobs))[:, None]
    points = norms * (directions[blobs] + 1e-4 * rng.standard_normal((len(blobs), 3)))
    labels = rng.permutation(np.arange(len(blobs)) % 3)
    expected = literal_nmi(labels.tolist(), blobs.tolist())
    assert clustering_nmi(points, labels, metric="cosine") == pytest.approx(expected, rel=1e-12)


def test_chart_nmi_clusters_each_chart_apart_literally():
    """Charts 0 and 3 (6 and 12 points) and 4 labels: largest-remainder allocation gives the
    charts 1 and 3 clusters (4 * 6/18 = 1.33, 4 * 12/18 = 2.67). Chart 3's points sit in three
    tight blobs k-means must find; chart 0 is one cluster although its points are spread, and
    although its coordinates coincide with chart 3's first blob (other charts are infinitely
    far, whatever the coordinates)."""
    rng = np.random.default_rng(4)
    chart_three_blobs = np.repeat(np.arange(3), [3, 4, 5])
    centres = np.array([[0.0, 0.0], [100.0, 0.0], [0.0, 100.0]])
    chart_three = centres[chart_three_blobs] + 0.01 * rng.standard_normal((12, 2))
    chart_zero = 0.01 * rng.standard_normal((6, 2))
    chart_zero[:3] += [[30.0, 30.0]]  # spread, but one cluster
    coords = np.concatenate([chart_zero, chart_three])
    charts = np.array([0] * 6 + [3] * 12)
    clusters = np.concatenate([np.zeros(6, dtype=np.int64), 1 + chart_three_blobs])
    labels = rng.permutation(np.arange(18) % 4) * 2
    order = rng.permutation(18)
    expected = literal_nmi(labels[order].tolist(), clusters[order].tolist())
    assert 0.0 < expected < 1.0
    got = chart_clustering_nmi(coords[order], charts[order], labels[order])
    assert got == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("offset", [64.0, 1024.0])
def test_chart_nmi_does_not_depend_on_where_a_charts_codes_sit(offset):
    """k-means is shift-invariant; faiss's float32 distances are not, and pre-sigmoid codes are
    not centred. Overlapping blobs (the clustering is a close call) on a grid where ``x +
    offset`` is exact in float32, so the two inputs differ by the shift alone."""
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(10), 100)
    codes = 0.1 * (rng.standard_normal((10, 8))[labels] + rng.standard_normal((1000, 8)))
    codes = np.round(codes * 2.0**12) / 2.0**12
    shifted = (codes + offset).astype(np.float32)
    assert np.array_equal(shifted.astype(np.float64) - offset, codes)
    charts = np.zeros(len(codes), dtype=np.int64)
    at_origin = chart_clustering_nmi(codes.astype(np.float32), charts, labels)
    assert 0.3 < at_origin < 0.9
    assert chart_clustering_nmi(shifted, charts, labels) == at_origin


@pytest.mark.parametrize("niter", [0, -1, 2.5])
def test_clustering_nmi_refuses_a_count_of_iterations_that_is_not_one_or_more(niter):
    """niter=0 or -1 had scored the k-means++ seeding's clusters without a word."""
    from kdml.errors import KdmlError

    x = np.random.default_rng(0).standard_normal((20, 3)).astype(np.float32)
    with pytest.raises(KdmlError, match=f"niter must be a positive integer, got {niter}"):
        clustering_nmi(x, np.arange(20) % 2, niter=niter)


def test_k_means_plus_plus_distances_are_those_of_the_whole_array_at_once():
    """The seeding's squared distances, taken in blocks of rows to stay in the CPU's cache,
    are bit for bit those of the whole (N, D) array at once, across block edges, and the float64
    literal's to float32 rounding."""
    from kdml.evaluation.clustering import SQUARED_DISTANCE_ROWS, _squared_distances

    rng = np.random.default_rng(0)
    vectors = (rng.standard_normal((2 * SQUARED_DISTANCE_ROWS + 5, 9)) * 30).astype(np.float32)
    for centre in (vectors[0], vectors[-1], np.zeros(9, dtype=np.float32)):
        got = _squared_distances(vectors, centre)
        assert np.array_equal(got, ((vectors - centre) ** 2).sum(axis=1, dtype=np.float64))
        literal = [sum((float(a) - float(b)) ** 2 for a, b in zip(row, centre, strict=True))
                   for row in vectors[::97]]
        assert np.allclose(got[::97], literal, rtol=1e-6, atol=1e-3)



def _literal_seeding(vectors: np.ndarray, num_clusters: int, seed: int) -> list[int]:
    """k-means++ measuring every row's squared distance to each new centre exactly (the float32
    differences and squares summed in float64, as kdml's exact route), drawing as kdml does."""
    rng = np.random.default_rng(seed)
    centres = [int(rng.integers(len(vectors)))]
    nearest = ((vectors - vectors[centres[0]]) ** 2).sum(axis=1, dtype=np.float64)
    for _ in range(1, num_clusters):
        if nearest.sum() <= 0:
            centres.append(centres[-1])
            continue
        drawn = rng.random() * nearest.sum()
        chosen = min(int(np.searchsorted(np.cumsum(nearest), drawn)), len(vectors) - 1)
        centres.append(chosen)
        nearest = np.minimum(nearest, ((vectors - vectors[chosen]) ** 2).sum(axis=1,
                                                                           dtype=np.float64))
    return centres


@pytest.mark.parametrize(("case", "dim", "dtype"), [
    ("blobs", 64, np.float32), ("blobs", 512, np.float32), ("far", 16, np.float32),
    ("duplicates", 8, np.float32), ("huge", 4, np.float32), ("tiny", 64, np.float32),
    ("far", 16, np.float64), ("tiny", 64, np.float64), ("huge", 4, np.float64)])
def test_k_means_plus_plus_draws_the_centres_of_measuring_every_row_exactly(case, dim, dtype):
    """The seeding estimates each pass's distances with one float32 matrix-vector product and
    measures exactly only the rows its error bound cannot rule out: the centres must be those
    of measuring every row, also where the estimate is poor (rows far from the origin: most
    rows measured), where rows repeat (zero distances, ties), where the float32 product
    overflows or underflows (products below the smallest normal number, off by up to half a
    subnormal whatever their size), and in float64."""
    from kdml.evaluation.clustering import kmeans_plus_plus, kmeans_plus_plus_rows

    rng = np.random.default_rng(dim)
    labels = rng.integers(0, 40, 1500)
    vectors = rng.standard_normal((40, dim))[labels] + 0.3 * rng.standard_normal((1500, dim))
    if case == "far":  # |x|^2 - 2 x.c + |c|^2 cancels nearly all its digits
        vectors = vectors + (3e3 if dtype == np.float32 else 1e11)
    elif case == "duplicates":
        vectors = np.round(vectors)[rng.integers(0, 300, 1500)]
    elif case == "huge":  # products overflow, differences do not; in float64 the norms
        # overflow too, and their estimate is inf - inf: NaN, measured exactly
        vectors = vectors * 1e17 + 1e19 if dtype == np.float32 else vectors * 1e150 + 1e155
    elif case == "tiny":  # products and squares subnormal
        vectors = vectors * (1e-22 if dtype == np.float32 else 1e-162)
    vectors = vectors.astype(dtype)
    for seed in (0, 1):
        expected = _literal_seeding(vectors, 60, seed)
        assert kmeans_plus_plus_rows(vectors, 60, np.random.default_rng(seed)) == expected
        if case == "huge" and dtype == np.float64:
            continue  # beyond float32, whose centres kmeans_plus_plus returns
        got = kmeans_plus_plus(vectors, 60, np.random.default_rng(seed))
        assert got.dtype == np.float32
        assert np.array_equal(got, vectors[expected].astype(np.float32))


@pytest.mark.parametrize("name", ["niter", "seed"])
def test_clustering_nmi_refuses_counts_faiss_cannot_hold(name):
    """faiss keeps niter and the seed in C ints: 2**31 had stopped clustering_nmi with faiss's
    OverflowError, naming neither."""
    x, labels = np.eye(4), np.array([0, 0, 1, 1])
    with pytest.raises(KdmlError, match=rf"^{name} must be below 2\*\*31 \(faiss's k-means "
                                        rf"holds it in a 32-bit integer\), got 2147483648$"):
        clustering_nmi(x, labels, **{name: 2**31})
    assert clustering_nmi(x, labels, **{name: 2**31 - 1}) == clustering_nmi(
        x, labels, **{name: 2**31 - 1})
