"""Behaviours of the evaluation metrics that a mutation audit found no test pinned down: each
test is small, fast, and checks kdml against an independent computation (plain float64 loops,
scikit-learn's NMI or the definitions written out)."""

from __future__ import annotations

import numpy as np
import pytest

from kdml.evaluation.knn import knn_search, search_scale


def _float64_neighbours(queries: np.ndarray, reference: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` nearest reference rows of each query by float64 squared distance, in plain
    loops (no ties in the data these tests use)."""
    return np.array([np.argsort([float(((q - r) ** 2).sum()) for r in reference],
                                kind="stable")[:k] for q in queries])


# ----------------------------------------------------------------------------- knn


@pytest.mark.parametrize("largest", [3.0e10, 5.0e-12, 1.0e300])
def test_the_search_scale_is_a_power_of_two(largest):
    """Dividing by the scale must be exact (documented): a power of two, not the largest value
    itself, whose division rounds every value."""
    scale = search_scale(np.array([[largest, -0.5 * largest]]))
    mantissa, _ = np.frexp(scale)
    assert mantissa == 0.5
    assert 0.5 <= largest / scale <= 2.0


def test_queries_far_larger_than_the_reference_are_searched_without_overflow():
    """Queries and reference share one scale: queries of 1e20 beside a unit-scale reference
    (scaled by the reference alone their squared distances overflow float32) still find the
    float64 nearest neighbours."""
    rng = np.random.default_rng(0)
    reference = rng.standard_normal((30, 4))
    queries = 1e20 * rng.standard_normal((5, 4))
    chunks = list(knn_search(queries, reference, k=3, metric="euclidean"))
    found = np.concatenate([chunk.indices for chunk in chunks])
    np.testing.assert_array_equal(found, _float64_neighbours(queries, reference, 3))


def test_one_far_point_does_not_move_the_euclidean_search_off_the_bulk():
    """The shift is the reference's median (robust, documented), not its mean: one point at
    1e6 beside 1,100 unit-scale points put a mean shift ~900 from the bulk, where the
    whole-row search's float32 |q|^2 + |r|^2 - 2 q.r (k of 1,024 takes it) lost the
    unit-scale gaps; with the median the bulk's nearest neighbours are float64's."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1101, 3))
    x[1100] = 1e6
    chunks = list(knn_search(x, k=1024, metric="euclidean", exclude_self=True))
    found = np.concatenate([chunk.indices for chunk in chunks])[:1100, 0]
    distances = ((x[:1100, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    distances[np.arange(1100), np.arange(1100)] = np.inf
    np.testing.assert_array_equal(found, distances.argmin(axis=1))


# ----------------------------------------------------------------------- retrieval


@pytest.mark.parametrize(("gap", "tied"), [(5e-5, True), (2e-4, False)])
def test_a_separate_query_s_tie_tolerance_is_its_own_norm_s(gap, tied):
    """A query searched against a separate reference is tied with two neighbours whose
    squared distances differ by at most (TIE_ULPS + 2 (d + 2)) float32 ulps of
    |q|^2 + max |r|^2 (the documented tolerance), computed here by hand: at |q| = 8, a gap of
    5e-5 is within it (9.3e-5) and one of 2e-4 is not (the query's norm taken twice too small,
    or its square taken for the norm, moved the bound past one or the other)."""
    from kdml.evaluation.retrieval import RankedSearch
    from kdml.evaluation.ties import TIE_ULPS

    queries = np.array([[8.0, 0.0]], dtype=np.float32)
    reference = np.array([[0.0, 0.0], [0.0, np.sqrt(gap)]], dtype=np.float32)
    norms = np.linalg.norm(reference.astype(np.float64), axis=1)
    tolerance = ((TIE_ULPS + 2 * (2 + 2)) * float(np.finfo(np.float32).eps)
                 * (64.0 + norms.max() ** 2))
    assert (gap <= tolerance) == tied  # the case is what its name says
    search = RankedSearch(queries, reference, "euclidean", False, 1)
    [(_, ranked)] = list(search.ranked(np.array([1])))
    assert bool(ranked.continues[0, 1]) == tied


# ------------------------------------------------------------------------------ ties


def test_choose_ratio_beyond_exact_taken_is_the_exact_fraction_to_1e_10():
    """Beyond EXACT_TAKEN draws the chance of no hit comes from log-gamma: still
    C(misses, taken) / C(total, taken), against Python's exact integers (a Recall@K of a tie
    group of a collapsed embedding reads it)."""
    from fractions import Fraction
    from math import comb

    from kdml.evaluation.ties import EXACT_TAKEN, _choose_ratio

    cases = [(1000, 1200, EXACT_TAKEN + 1), (5000, 5100, 400), (600, 900, 300)]
    misses, total, taken = (np.array(column) for column in zip(*cases, strict=True))
    expected = [float(Fraction(comb(m, t), comb(n, t))) for m, n, t in cases]
    np.testing.assert_allclose(_choose_ratio(misses, total, taken), expected, rtol=1e-10,
                               atol=0)


# ------------------------------------------------------------------------- rescoring


@pytest.mark.parametrize("metric", ["euclidean", "cosine"])
def test_float64_keys_of_more_pairs_than_one_gather_block_are_each_the_literal_key(metric):
    """The keys are gathered in blocks of GATHER_BUDGET // D pairs: 6,000 pairs of 64-d rows
    span two blocks, and every key, the last of each block included, is |q - r|^2 (of the
    L2-normalised rows for cosine) computed in plain float64."""
    from kdml.evaluation.rescoring import GATHER_BUDGET, ExactScores

    rng = np.random.default_rng(3)
    queries, reference = rng.standard_normal((100, 64)), rng.standard_normal((120, 64))
    query_rows, reference_rows = rng.integers(0, 100, 6000), rng.integers(0, 120, 6000)
    assert len(query_rows) > GATHER_BUDGET // 64
    keys = ExactScores(queries, reference, metric).nearness(query_rows, reference_rows)
    q, r = queries[query_rows], reference[reference_rows]
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
    np.testing.assert_allclose(keys, ((q - r) ** 2).sum(axis=1), rtol=1e-12)

