"""Boundaries of the float64 re-scoring (kdml.evaluation.rescoring): keys exactly at the
rounding bound, the scale of a separate reference, and the caller's arrays left as given."""

from __future__ import annotations

import numpy as np
import pytest

from kdml.evaluation import retrieval_metrics
from kdml.evaluation.rescoring import ExactScores, key_tolerance, rescore_ties


class GivenKeys(ExactScores):
    """Keys chosen by the test, one per (query row, reference row)."""

    def __init__(self, table: np.ndarray, metric: str, dim: int) -> None:
        super().__init__(np.zeros((1, 1)), None, metric)  # dim is given: no D-wide rows
        self.table, self._dim = table, dim

    @property
    def dim(self) -> int:
        return self._dim

    def nearness(self, query_rows, reference_rows):
        return self.table[query_rows, reference_rows]


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
