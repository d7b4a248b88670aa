"""Float64 re-scoring of float32 tie groups (kdml.evaluation.rescoring): the ranks of
``retrieval_metrics`` are those of the embeddings as given, where float32 cannot order them."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from reference_impls import enumerated_retrieval, rank_keys

from kdml.evaluation import retrieval_metrics
from kdml.evaluation.charts import chart_retrieval_metrics
from kdml.evaluation.rescoring import MAX_RESCORED, ExactScores, rescore_ties
from kdml.evaluation.transfer import source_nn_accuracy


def literal_nearness(query, reference, metric):
    """Plain loops in float64: minus the cosine similarity, or the squared distance."""
    if metric == "euclidean":
        return sum((float(a) - float(b)) ** 2 for a, b in zip(query, reference, strict=True))
    dot = sum(float(a) * float(b) for a, b in zip(query, reference, strict=True))
    norms = math.sqrt(sum(float(a) ** 2 for a in query) * sum(float(b) ** 2 for b in reference))
    return -dot / norms if norms else 0.0


def literal_keys(queries, reference, metric):
    """``[n, m]`` float64 keys by broadcasting (differences first: no |q|^2 + |r|^2 - 2 q.r
    cancellation); the loops of literal_nearness, vectorised for a thousand points."""
    queries, reference = np.asarray(queries, np.float64), np.asarray(reference, np.float64)
    if metric == "euclidean":
        return ((queries[:, None] - reference[None]) ** 2).sum(-1)
    norms = np.linalg.norm(queries, axis=1)[:, None] * np.linalg.norm(reference, axis=1)[None]
    return -(queries[:, None] * reference[None]).sum(-1) / norms


def literal_recall_at_1(points, labels, metric):
    """Leave-one-out Recall@1 (no ties in these data)."""
    keys = literal_keys(points, points, metric)
    np.fill_diagonal(keys, np.inf)
    return float((labels[keys.argmin(1)] == labels).mean())


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_nearness_is_the_literal_float64_score(metric):
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((5, 3)).astype(np.float32)
    reference = rng.standard_normal((7, 3)).astype(np.float32)
    reference[2] = 0.0  # a zero vector: similarity 0 to everything
    rows, columns = np.repeat(np.arange(5), 7), np.tile(np.arange(7), 5)
    got = ExactScores(torch.from_numpy(queries), reference, metric).nearness(rows, columns)
    expected = [literal_nearness(queries[i], reference[j], metric)
                for i, j in zip(rows, columns, strict=True)]
    assert got == pytest.approx(expected, rel=1e-14, abs=1e-15)


def test_nearness_of_values_near_float64s_limits():
    """Divided by one power of two first: no overflow at 1e300, no underflow at 1e-300."""
    for magnitude in (1e300, 1e-300):
        points = np.array([[1.0, 2.0], [2.0, 2.0], [-1.0, 0.5]]) * magnitude
        exact = ExactScores(points, None, "euclidean")
        got = exact.nearness(np.array([0, 0]), np.array([1, 2]))
        assert got[1] / got[0] == pytest.approx(6.25, rel=1e-14)  # (4 + 2.25) / 1
        cosine = ExactScores(points, None, "cosine").nearness(np.array([0]), np.array([1]))
        assert cosine[0] == pytest.approx(-6 / math.sqrt(5 * 8), rel=1e-14)


def test_neighbours_float32_cannot_order_are_ranked_in_float64():
    """A reviewer's cases. 2,000 points on a circle, classes alternating every 3: nearest
    neighbours a few float32 ulps apart had counted as ties (Recall@1 0.60 for 0.67)."""
    rng = np.random.default_rng(0)
    angles = np.sort(rng.uniform(0, 2 * np.pi, 2000))
    circle = np.stack([np.cos(angles), np.sin(angles)], 1)
    labels = (np.arange(2000) // 3) % 2
    gaps = np.abs((angles[:, None] - angles[None] + np.pi) % (2 * np.pi) - np.pi)
    np.fill_diagonal(gaps, np.inf)
    expected = float((labels[gaps.argmin(1)] == labels).mean())
    for metric in ("cosine", "euclidean"):
        got = retrieval_metrics(circle, labels, ks=(1,), metric=metric, nmi=False)
        assert got["recall@1"] == pytest.approx(expected, abs=1e-12), metric


def test_a_chain_of_close_neighbours_is_not_one_tie():
    """2,001 references whose cosines to the query step down by 3e-7 (about 5 float32 ulps):
    consecutive gaps within the float32 tolerance had chained them all into one group, so the
    nearest, a miss, was averaged with 2,000 hits (Recall@1 0.9995 for 0)."""
    cosines = 0.5 - 3e-7 * np.arange(2001)
    reference = np.stack([cosines, np.sqrt(1 - cosines**2), np.zeros(2001)], 1)
    reference_labels = np.ones(2001, dtype=int)
    reference_labels[0] = 0
    got = retrieval_metrics(np.array([[1.0, 0.0, 0.0]]), np.array([1]), ks=(1, 2),
                            reference=reference, reference_labels=reference_labels, nmi=False)
    assert got["recall@1"] == 0.0 and got["recall@2"] == 1.0


def test_a_tight_cluster_far_from_the_median_is_ranked_exactly():
    """The Euclidean search shifts every vector by one median: a cluster 1e4 away whose spread
    is 1e-5 (below float32's resolution there) had tied within itself."""
    rng = np.random.default_rng(1)
    points = np.vstack([rng.standard_normal((120, 4)), 1e4 + 1e-5 * rng.standard_normal((40, 4))])
    labels = np.r_[rng.integers(0, 3, 120), rng.integers(3, 6, 40)]
    got = retrieval_metrics(points, labels, ks=(1,), metric="euclidean", nmi=False)
    assert got["recall@1"] == pytest.approx(literal_recall_at_1(points, labels, "euclidean"),
                                            abs=1e-12)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_exact_ties_stay_tied(metric):
    """Duplicates, and scaled copies under the cosine metric, are equal in exact arithmetic
    (their float64 scores differ by rounding at most): they stay one group, and the metrics are
    the expectation over its orders, as the exact-rational literal enumerates them."""
    direction = np.array([1, 2, -1])
    points = np.vstack([direction, direction, 2 * direction, 3 * direction, -direction,
                        [4, -1, 0], [4, -1, 1], [-2, 3, 3]])
    labels = np.array([0, 1, 1, 0, 2, 2, 3, 3])
    got = retrieval_metrics(points.astype(np.float32), labels, ks=(1, 2), metric=metric,
                            nmi=False)
    expected = enumerated_retrieval(rank_keys(points, metric), labels, (1, 2))
    assert got == pytest.approx(expected, abs=1e-12)


def test_groups_beyond_the_cap_keep_their_float32_ties():
    """A collapsed embedding's tie group (every neighbour) is not re-scored past
    MAX_RESCORED members: those neighbours are tied in float64 as well."""
    width = MAX_RESCORED + 2
    indices = np.arange(width)[None].copy()
    continues = np.ones((1, width), dtype=bool)
    continues[0, 0] = False

    class Refuses(ExactScores):
        def nearness(self, query_rows, reference_rows):
            raise AssertionError("re-scored a group beyond the cap")

    got_indices, got_continues = rescore_ties(np.array([0]), indices, continues,
                                              Refuses(np.zeros((1, 1)), None, "cosine"))
    assert np.array_equal(got_indices, indices) and np.array_equal(got_continues, continues)


def test_chart_retrieval_and_source_nn_accuracy_rank_in_float64_too():
    """The same circle as chart coordinates (one chart, then two halves) and as a DTML target
    scored by its nearest source samples."""
    rng = np.random.default_rng(3)
    angles = np.sort(rng.uniform(0, 2 * np.pi, 1500))
    circle = np.stack([np.cos(angles), np.sin(angles)], 1)
    labels = (np.arange(1500) // 3) % 2
    expected = literal_recall_at_1(circle, labels, "euclidean")
    one_chart = chart_retrieval_metrics(circle, np.zeros(1500, dtype=int), labels, ks=(1,),
                                        nmi=False)
    assert one_chart["recall@1"] == pytest.approx(expected, abs=1e-12)
    source, target = circle[::2], circle[1::2]
    accuracy = source_nn_accuracy(source, labels[::2], target, labels[1::2])
    nearest = literal_keys(target, source, "euclidean").argmin(1)
    expected_accuracy = float((labels[::2][nearest] == labels[1::2]).mean())
    assert accuracy == pytest.approx(expected_accuracy, abs=1e-12)
