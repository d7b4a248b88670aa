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
from kdml.evaluation.rescoring import ExactScores, key_tolerance, rescore_ties
from kdml.evaluation.transfer import source_nn_accuracy


def literal_nearness(query, reference, metric):
    """Plain loops in float64: the squared distance, or 2 - 2 cos (2 for a zero vector:
    similarity 0)."""
    if metric == "euclidean":
        return sum((float(a) - float(b)) ** 2 for a, b in zip(query, reference, strict=True))
    dot = sum(float(a) * float(b) for a, b in zip(query, reference, strict=True))
    norms = math.sqrt(sum(float(a) ** 2 for a in query) * sum(float(b) ** 2 for b in reference))
    return 2 - 2 * dot / norms if norms else 2.0


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


@pytest.mark.parametrize("scattered", [False, True])
@pytest.mark.parametrize("duplicated", [False, True])
@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_nearness_is_the_literal_float64_score(metric, duplicated, scattered):
    """Pair by pair, and (``duplicated``: fewer distinct combinations than pairs) through the
    table of distinct queries and reference rows; for every pair, or (``scattered``) for
    pairs of some rows only, in no order, so that a row's place among those touched is not its
    number."""
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((5, 3)).astype(np.float32)
    reference = rng.standard_normal((7, 3)).astype(np.float32)
    reference[2] = 0.0  # a zero vector: similarity 0 to everything
    if duplicated:
        reference[5] = reference[6] = reference[1]
    rows, columns = np.repeat(np.arange(5), 7), np.tile(np.arange(7), 5)
    if scattered:  # queries 0 and 3 and reference row 0 untouched
        rows, columns = rng.choice([1, 2, 4], 40), rng.choice(np.arange(1, 7), 40)
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
        assert cosine[0] == pytest.approx(2 - 12 / math.sqrt(5 * 8), rel=1e-14)


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


@pytest.mark.parametrize(("count", "step", "dtype"), [
    (5001, 3e-7, np.float32), (5001, 3e-7, np.float64), (2001, 2e-13, np.float64)])
def test_long_chains_and_float64_chains_are_not_ties(count, step, dtype):
    """A reviewer's cases: a float32 group beyond 4,096 neighbours had been left tied (a cap
    meant for collapsed embeddings), and float64 keys stepping by 2e-13 chained into one tie
    as the float32 ones had. The nearest reference, a miss, comes first."""
    cosines = 0.5 - step * np.arange(count)
    reference = np.stack([cosines, np.sqrt(1 - cosines**2), np.zeros(count)], 1).astype(dtype)
    reference_labels = np.ones(count, dtype=int)
    reference_labels[0] = 0
    keys = literal_keys(np.array([[1.0, 0.0, 0.0]]), reference, "cosine")[0]
    assert np.argmin(keys) == 0 and np.all(np.diff(keys) > 0)
    got = retrieval_metrics(np.array([[1.0, 0.0, 0.0]], dtype), np.array([1]), ks=(1, 2),
                            reference=reference, reference_labels=reference_labels, nmi=False)
    assert got["recall@1"] == 0.0 and got["recall@2"] == 1.0


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_float32_values_whose_exact_keys_differ_by_2_to_the_minus_42_are_ordered(metric):
    """[1, 0] and [1, 2^-21] in float32: squared distances from the origin 1 and 1 + 2^-42, and
    cosines to [1, 0] 1 and 1 - 2^-43 (about): distinct in exact arithmetic, and in float64."""
    reference = np.array([[1, 2.0**-21], [1, 0]], np.float32)
    query = np.zeros((1, 2), np.float32) if metric == "euclidean" else np.array([[1, 0]],
                                                                               np.float32)
    got = retrieval_metrics(query, np.array([1]), ks=(1,), reference=reference,
                            reference_labels=np.array([1, 0]), metric=metric, nmi=False)
    assert got["recall@1"] == 0.0


class GivenKeys(ExactScores):
    """Keys drawn by the test, one per (query row, reference row)."""

    def __init__(self, table: np.ndarray, metric: str, dim: int) -> None:
        super().__init__(np.zeros((1, 1)), None, metric)  # dim is given: no D-wide rows
        self.table, self._dim = table, dim

    @property
    def dim(self) -> int:
        return self._dim

    def nearness(self, query_rows, reference_rows):
        return self.table[query_rows, reference_rows]


@pytest.mark.parametrize("seed", range(40))
def test_rescore_ties_is_the_literal_sort_and_anchored_ties_per_group(seed):
    """Random float32 groups and float64 keys (duplicates, near-duplicates within and beyond
    the rounding bound, both metrics) against a per-group loop: sort each group by key (float32
    order among equal keys), then a tie runs while a key stays within key_tolerance of the
    first key of its tie. Every fourth seed ties whole rows (groups of one size, sorted as
    the rows of a matrix); the others draw groups of many sizes."""
    rng = np.random.default_rng(seed)
    metric = ("euclidean", "cosine")[seed % 2]
    n, width, dim = 3, 12, int(rng.integers(1, 600))
    scale = 10.0 ** rng.integers(-12, 12)
    base = rng.choice([1.0, 1.5, 2.0], size=(n, 40)) * scale
    near = base * (1 + rng.choice([0, 1, 3, 1e4], size=base.shape) * (dim + 2) * 2.0**-53 / 3)
    table = np.where(rng.random(base.shape) < 0.5, base, near)
    indices = np.stack([rng.permutation(40)[:width] for _ in range(n)])
    continues = rng.random((n, width)) < 0.6
    if seed % 4 == 3:
        continues[:] = True
    continues[:, 0] = False
    exact = GivenKeys(table, metric, dim)
    got_indices, got_continues = rescore_ties(np.arange(n), indices, continues, exact)
    for row in range(n):
        starts = [j for j in range(width) if not continues[row, j]] + [width]
        for start, end in zip(starts, starts[1:], strict=False):
            members = list(indices[row, start:end])
            if end - start == 1:
                assert got_indices[row, start] == members[0]
                assert not got_continues[row, start]
                continue
            keys = [table[row, m] for m in members]
            ordered = [m for _, _, m in sorted(zip(keys, range(len(keys)), members,
                                                   strict=True))]
            spread = max(keys) - min(keys)
            bound = key_tolerance(np.array([max(keys)]), dim, metric)[0]
            if spread <= bound:  # left as it came: one tie
                assert list(got_indices[row, start:end]) == members
                assert not got_continues[row, start] and got_continues[row,
                                                                         start + 1:end].all()
                continue
            assert list(got_indices[row, start:end]) == ordered
            anchor = None
            for position, member in enumerate(ordered):
                key = table[row, member]
                if anchor is None:
                    expected = False
                else:
                    tolerance = key_tolerance(np.array([key]), dim, metric)[0]
                    expected = key - anchor <= tolerance
                if not expected:
                    anchor = key
                assert got_continues[row, start + position] == expected, (row, position)


def test_chart_retrieval_and_source_nn_accuracy_rank_in_float64_too():
    """The same circle as chart coordinates (one chart) and as a DTML target scored by its
    nearest source samples."""
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


def test_key_tolerance_is_the_documented_rounding_bound():
    """Literal values of the docstring's bounds, a = (D + 2) 2^-52: Euclidean a k, cosine
    a (k + 2 sqrt(k) + a); too tight a bound splits exact ties, too loose one ties neighbours."""
    ulp = 2.0**-52
    euclidean = key_tolerance(np.array([1.0, 2.5, 0.0]), 4, "euclidean")  # a = 6 ulp
    assert euclidean.tolist() == [6 * ulp, 15 * ulp, 0.0]
    assert key_tolerance(np.array([3.0]), 126, "euclidean").tolist() == [3 * 2.0**-45]
    # D = 2: a = 2^-50; key 0 (a duplicate) keeps only a^2; key 4: a (4 + 4 + a)
    cosine = key_tolerance(np.array([0.0, 4.0]), 2, "cosine")
    assert cosine.tolist() == [2.0**-100, 2.0**-50 * (8 + 2.0**-50)]
    # D = 6: a = 2^-49; key 1/4: a (1/4 + 1 + a)
    assert key_tolerance(np.array([0.25]), 6, "cosine").tolist() == [
        2.0**-49 * (1.25 + 2.0**-49)]


def test_ties_are_anchored_at_their_first_key_not_chained():
    """Keys 1 + 4j ulps (j = 0..4) against a tolerance of about 6 ulps: each step is within it,
    but a tie spans at most 6 ulps from its first key, so the ties are {0, 1}, {2, 3}, {4}.
    Chaining step by step would tie all five, however far the chain runs."""
    ulp = 2.0**-52
    keys = 1.0 + ulp * np.array([0.0, 4.0, 8.0, 12.0, 16.0])
    indices = np.array([[3, 0, 4, 1, 2]])  # reference rows, given out of key order
    table = keys[None, :]
    continues = np.array([[False, True, True, True, True]])  # one float32 group
    got_indices, got_continues = rescore_ties(np.array([0]), indices, continues,
                                              GivenKeys(table, "euclidean", 4))
    assert got_indices.tolist() == [[0, 1, 2, 3, 4]]
    assert got_continues.tolist() == [[False, True, False, True, False]]


# Boundaries of the float64 re-scoring (a mutation audit): keys exactly at the rounding bound,
# the scale of a separate reference, and the caller's arrays left as given.


def one_group(keys: list[float], dim: int, metric: str = "euclidean"):
    """rescore_ties on one float32 group holding reference rows 0..n-1 in that order."""
    table = np.array([keys])
    indices = np.arange(len(keys))[None, :]
    continues = np.ones((1, len(keys)), dtype=bool)
    continues[0, 0] = False
    return rescore_ties(np.array([0]), indices, continues, GivenKeys(table, metric, dim))


def test_a_group_whose_spread_is_exactly_the_rounding_bound_is_left_as_it_came():
    """D = 2: a = 2^-50, so the bound of key 1 is 2^-50, exactly the spread of 1, 1 - 2^-50 and
    1 - 2^-51: "within the rounding of the largest" includes the bound itself."""
    keys = [1.0, 1 - 2.0**-50, 1 - 2.0**-51]
    assert max(keys) - min(keys) == key_tolerance(np.array([1.0]), 2, "euclidean")[0]
    indices, continues = one_group(keys, 2)
    assert indices.tolist() == [[0, 1, 2]]
    assert continues.tolist() == [[False, True, True]]


def test_a_step_exactly_at_the_bound_of_the_larger_key_is_a_tie():
    """Sorted keys 0.5, 1 - 2^-50, 1 (D = 2): the last step is 2^-50, the bound of key 1
    (a k = 2^-50) but more than that of 1 - 2^-50; the tie is measured at the larger key."""
    indices, continues = one_group([1.0, 0.5, 1 - 2.0**-50], 2)
    assert indices.tolist() == [[1, 2, 0]]
    assert continues.tolist() == [[False, False, True]]


def test_a_long_run_is_cut_with_each_keys_own_bound():
    """D = 2^26 - 2: a = 2^-26, large enough that the bounds of neighbouring keys differ in
    float64. Keys 1, 1 + 2^-26 + 2^-52, 1 + 2^-25 + 2^-52: each step is within the bound of
    its upper key, the run is not (so it is cut from its anchor, key by key), and the second
    key is within its own bound of the anchor (2^-26 + 2^-52 + 2^-78) but not within the
    anchor's (2^-26). Ties {0, 1}, {2}."""
    dim = 2**26 - 2
    keys = [1.0, 1 + 2.0**-26 + 2.0**-52, 1 + 2.0**-25 + 2.0**-52]
    bound = key_tolerance(np.array(keys), dim, "euclidean")
    assert keys[1] - keys[0] <= bound[1] and keys[1] - keys[0] > bound[0]
    assert keys[2] - keys[1] <= bound[2] and keys[2] - keys[0] > bound[2]
    indices, continues = one_group([keys[2], keys[0], keys[1]], dim)
    assert indices.tolist() == [[1, 2, 0]]
    assert continues.tolist() == [[False, True, False]]


def test_a_long_run_is_cut_with_the_bound_of_each_key_not_of_its_last():
    """D = 2^50 - 2: a = 1/4, bound k / 4. Keys 1, 1.2, 1.4, 1.6, 1.9: every step is within
    the bound of its upper key, the run is not. From anchor 1: 1.2 ties (0.2 <= 0.3), 1.4 does
    not (0.4 > 0.35, though within the last key's 0.475) and anchors the next tie: 1.6 ties,
    1.9 does not (0.5 > 0.475)."""
    indices, continues = one_group([1.9, 1.0, 1.4, 1.6, 1.2], 2**50 - 2)
    assert indices.tolist() == [[1, 4, 2, 3, 0]]
    assert continues.tolist() == [[False, True, False, True, False]]


def test_ties_are_measured_with_the_embedding_dimension_not_the_number_of_rows():
    """2,048 queries of dimension 2 at the origin, references [1, 2^-21] and [1, 0] in float32:
    squared distances 1 + 2^-42 and 1, apart by far more than the bound (2 + 2) 2^-52 of the
    dimension, though within (2,048 + 2) 2^-52: the nearest, a miss, is ranked first."""
    queries = np.zeros((2048, 2), np.float32)
    reference = np.array([[1, 2.0**-21], [1, 0]], np.float32)
    got = retrieval_metrics(queries, np.ones(2048, dtype=int), ks=(1,), reference=reference,
                            reference_labels=np.array([1, 0]), metric="euclidean", nmi=False)
    assert got["recall@1"] == 0.0


def test_rescore_ties_leaves_the_callers_arrays_as_given():
    """The result is a new ordering: the indices and continues passed in are not rewritten."""
    table = np.array([[3.0, 1.0, 2.0, 0.5]])
    indices = np.array([[0, 1, 2, 3]])
    continues = np.array([[False, True, True, False]])
    got_indices, got_continues = rescore_ties(np.array([0]), indices, continues,
                                              GivenKeys(table, "euclidean", 3))
    assert got_indices.tolist() == [[1, 2, 0, 3]]
    assert got_continues.tolist() == [[False, False, False, False]]
    assert indices.tolist() == [[0, 1, 2, 3]]
    assert continues.tolist() == [[False, True, True, False]]


def test_a_reference_far_larger_than_the_queries_is_scaled_too():
    """The power of two is that of both sides: a reference of 1e300 beside queries of 1 had
    squared differences of 1e600 (inf) if only the queries set it."""
    queries = np.array([[0.0, 1.0]])
    reference = np.array([[1e300, 0.0], [2e300, 0.0], [3e300, 4e300]])
    with np.errstate(over="raise"):
        got = ExactScores(queries, reference, "euclidean").nearness(np.zeros(3, dtype=int),
                                                                    np.arange(3))
    assert np.isfinite(got).all()  # |q - r|^2 is |r|^2 to float64's precision here
    assert got[1] / got[0] == pytest.approx(4.0, rel=1e-14)
    assert got[2] / got[0] == pytest.approx(25.0, rel=1e-14)


def test_a_zero_vector_is_scored_without_a_floating_point_warning():
    """Zero rows are not divided by their zero norm (similarity 0, key 2)."""
    with np.errstate(all="raise"):
        got = ExactScores(np.array([[0.0, 0.0], [1.0, 0.0]]), None, "cosine").nearness(
            np.array([0, 1]), np.array([1, 0]))
    assert got.tolist() == [2.0, 2.0]
