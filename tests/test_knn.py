"""Exact chunked k-NN search (kdml.evaluation.knn_search) against a float64 brute force."""

from __future__ import annotations

import math
import re
import warnings

import numpy as np
import pytest
import torch

from kdml.errors import KdmlError
from kdml.evaluation import knn_search


def brute_force_knn(queries, reference, k, metric, exclude_self):
    """Full float64 score matrix, sorted; self removed by masking it out."""
    q, r = queries.astype(np.float64), reference.astype(np.float64)
    if metric == "cosine":
        q = q / np.linalg.norm(q, axis=1, keepdims=True)
        r = r / np.linalg.norm(r, axis=1, keepdims=True)
        order_key = -(q @ r.T)
    else:
        order_key = ((q[:, None, :] - r[None, :, :]) ** 2).sum(-1)
    if exclude_self:
        np.fill_diagonal(order_key, np.inf)
    indices = np.argsort(order_key, axis=1, kind="stable")[:, :k]
    scores = np.take_along_axis(order_key, indices, axis=1)
    return (-scores if metric == "cosine" else scores), indices


def collect(chunks):
    chunks = list(chunks)
    return np.concatenate([c.scores for c in chunks]), np.concatenate([c.indices for c in chunks])


@pytest.fixture
def points():
    rng = np.random.default_rng(0)
    return rng.standard_normal((53, 6)).astype(np.float32), rng.standard_normal((31, 6))


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
@pytest.mark.parametrize("chunk_size", [1, 7, 1000])
def test_matches_brute_force_against_itself(points, metric, chunk_size):
    queries, _ = points
    scores, indices = collect(
        knn_search(queries, k=9, metric=metric, exclude_self=True, chunk_size=chunk_size)
    )
    expected_scores, expected_indices = brute_force_knn(queries, queries, 9, metric, True)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    assert not (indices == np.arange(len(queries))[:, None]).any()


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_matches_brute_force_against_separate_reference(points, metric):
    reference, queries = points  # float64 queries, float32 reference
    scores, indices = collect(knn_search(queries, reference, k=53, metric=metric, chunk_size=4))
    expected_scores, expected_indices = brute_force_knn(queries, reference, 53, metric, False)
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_a_large_k_ranks_whole_rows_and_matches_brute_force(metric, monkeypatch):
    """k = 1,500 of 1,600 references takes the whole-rows path (torch.topk), in blocks of a
    few queries (made small here), and ranks exactly as the brute-force reference."""
    from kdml.evaluation import knn

    assert knn.uses_full_rows(1500, 1600) and not knn.uses_full_rows(1000, 1600)
    assert knn.uses_full_rows(2048, 35000) and not knn.uses_full_rows(1024, 35000)
    monkeypatch.setattr(knn, "FULL_ROWS_BLOCK", 1601 * 7)  # blocks of 7 queries
    searched = []
    monkeypatch.setattr(knn.faiss, "knn", lambda *args: searched.append(args) or 1 / 0)
    points = np.random.default_rng(2).standard_normal((1601, 5)).astype(np.float32)
    points.setflags(write=False)  # as a memory-mapped .npy: torch must not warn about it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores, indices = collect(knn_search(points, k=1500, metric=metric, exclude_self=True,
                                             chunk_size=40))
    expected_scores, _ = brute_force_knn(points, points, 1500, metric, True)
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-5, atol=1e-5)
    # each neighbour has the float64 score of its rank (float32 near-ties may swap places)
    all_scores, order = brute_force_knn(points, points, 1601, metric, False)
    by_index = np.empty_like(all_scores)
    np.put_along_axis(by_index, order, all_scores, axis=1)
    np.testing.assert_allclose(np.take_along_axis(by_index, indices, axis=1), expected_scores,
                               rtol=1e-5, atol=1e-5)
    assert not (indices == np.arange(1601)[:, None]).any()
    assert not searched  # faiss was never asked


def test_chunks_cover_queries_in_order_with_per_query_k(points):
    queries, _ = points
    k_per_query = np.arange(len(queries)) % 5 + 1
    chunks = list(knn_search(queries, k=k_per_query, exclude_self=True, chunk_size=10))
    assert [(c.start, c.stop) for c in chunks] == [(s, min(s + 10, 53)) for s in range(0, 53, 10)]
    for chunk in chunks:
        width = k_per_query[chunk.start : chunk.stop].max()
        assert chunk.indices.shape == chunk.scores.shape == (chunk.stop - chunk.start, width)


def test_exact_duplicates_never_return_self():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 4)).astype(np.float32)
    # Rows 0, 1, 2 are identical, so each ties with itself at the top.
    points = np.concatenate([base[:1], base[:1], base[:1], base[1:]])
    for metric in ("cosine", "euclidean"):
        _, indices = collect(knn_search(points, k=2, metric=metric, exclude_self=True))
        for row in range(3):
            assert set(indices[row]) == {0, 1, 2} - {row}
        assert not (indices == np.arange(len(points))[:, None]).any()


def test_more_duplicates_than_k_drops_last_column():
    points = np.ones((6, 3), dtype=np.float32)
    points[5] = [1.0, -2.0, 0.5]
    _, indices = collect(knn_search(points, k=2, metric="euclidean", exclude_self=True))
    assert indices.shape == (6, 2)
    assert not (indices == np.arange(6)[:, None]).any()
    assert set(indices[:5].ravel()) <= {0, 1, 2, 3, 4}


def test_torch_and_numpy_inputs_agree(points):
    queries, _ = points
    from_numpy = collect(knn_search(queries, k=4, exclude_self=True))
    from_torch = collect(knn_search(torch.from_numpy(queries).double(), k=4, exclude_self=True))
    np.testing.assert_array_equal(from_numpy[1], from_torch[1])
    np.testing.assert_array_equal(from_numpy[0], from_torch[0])


def test_inputs_are_not_modified(points):
    queries, _ = points
    before = queries.copy()
    collect(knn_search(queries, k=3, metric="cosine", exclude_self=True))
    np.testing.assert_array_equal(queries, before)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": 53},  # only 52 other points
        {"k": 0},
        {"k": 2.5},
        {"k": 2, "metric": "manhattan"},
        {"k": 2, "chunk_size": 0},
        {"k": 2, "reference": np.zeros((53, 5), dtype=np.float32)},
        {"k": 2, "reference": np.zeros((20, 6), dtype=np.float32)},
    ],
)
def test_bad_arguments_raise_at_call_time(points, kwargs):
    queries, _ = points
    with pytest.raises(KdmlError):
        knn_search(queries, exclude_self=True, **kwargs)  # not iterated: must raise eagerly


@pytest.mark.parametrize("k", [np.array([1, 2]), np.ones((53, 1), dtype=int), [[1]]])
def test_a_per_query_k_of_another_length_is_refused_in_one_line(points, k):
    """numpy's broadcast error ("operands could not be broadcast together with remapped
    shapes") named neither k nor the number of queries."""
    queries, _ = points
    shape = np.asarray(k).shape
    with pytest.raises(KdmlError, match=rf"^k must be one int or one per query \(53,\), got "
                                        rf"shape {re.escape(str(shape))}$"):
        knn_search(queries, k=k, exclude_self=True)


@pytest.mark.parametrize(
    "queries",
    [
        np.zeros((0, 4), dtype=np.float32),
        np.zeros(4, dtype=np.float32),
        np.array([[0.0, np.nan]]),
        np.array([[1, 2], [3, 4]]),
    ],
)
def test_bad_vectors_raise(queries):
    with pytest.raises(KdmlError):
        knn_search(queries, k=1)


@pytest.mark.parametrize("chunk_size", [0, 2.5, True, "64"])
def test_knn_search_refuses_a_chunk_size_that_is_not_a_positive_integer(chunk_size):
    """2.5 used to reach range() as a raw TypeError, "64" a comparison error."""
    with pytest.raises(KdmlError, match=r"^chunk_size must be a positive integer, got "):
        knn_search(np.zeros((4, 2), dtype=np.float32), k=2, chunk_size=chunk_size)


@pytest.mark.parametrize(("dtype", "largest"), [(np.float64, 1e308), (np.float32, 2e38)])
def test_values_near_the_dtype_s_limit_are_searched_without_a_shift(dtype, largest):
    """A shift by the median can overflow values on both sides of it (|x - c| up to 2 |x|):
    such vectors are searched unshifted, rescaled by a power of two, as before the shift."""
    from kdml.evaluation.knn import prepare_vectors

    x = (np.array([[1.0], [-1.0], [-0.9], [-1.0], [0.9]]) * largest).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        chunk = next(knn_search(x, k=1, metric="euclidean", exclude_self=True))
        on_torch = prepare_vectors(torch.from_numpy(x), "euclidean", "x", "torch")
    assert chunk.indices.ravel().tolist() == [4, 3, 1, 1, 0]
    assert torch.isfinite(on_torch).all()


@pytest.mark.parametrize("caller", ["none", "bf16"])
def test_the_torch_search_multiplies_in_full_float32_and_restores_the_setting(caller):
    """Under TF32 or bf16 products (common on GPUs) the scores would carry errors far beyond
    the tie tolerance: the search sets its device's backend to "ieee" around its matmul and
    gives the caller's setting back. Through torch's global set_float32_matmul_precision it
    had raised where the caller used the per-backend API (PyTorch's advice), and left "none"
    as "ieee"."""
    from torch.overrides import TorchFunctionMode

    from kdml.evaluation import knn

    backend = torch.backends.mkldnn.matmul  # the CPU's
    seen = []

    class Spy(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in ("matmul", "__matmul__"):
                seen.append(backend.fp32_precision)
            return func(*args, **(kwargs or {}))

    before = backend.fp32_precision
    backend.fp32_precision = caller
    try:
        queries = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
        with Spy():
            knn._torch_search(queries, queries, 2, "euclidean")
        assert seen == ["ieee"] and backend.fp32_precision == caller
    finally:
        backend.fp32_precision = before


def test_queries_and_reference_of_two_float_dtypes_are_searched_as_one():
    """Each matrix had the reference's median subtracted in its own dtype: float32 queries
    moved by the median's float32 rounding against a float64 reference (recall@1 0.52 where
    the float64 loop gives 0.48)."""
    from kdml.evaluation.retrieval import retrieval_metrics

    reference = 1000.0 + np.arange(21, dtype=np.float64)[:, None] * 1e-4  # median 1000.001
    reference_labels = np.arange(21) % 2
    rng = np.random.default_rng(0)
    queries = (1000.0 + rng.uniform(0, 2e-3, size=(200, 1))).astype(np.float32)
    query_labels = rng.integers(0, 2, size=200)
    exact = queries.astype(np.float64)
    hits = []
    for query, label in zip(exact[:, 0], query_labels, strict=True):  # float64, ties averaged
        distances = np.abs(query - reference[:, 0])
        hits.append(np.mean(reference_labels[distances == distances.min()] == label))
    for dtype in (np.float32, np.float64):
        metrics = retrieval_metrics(queries.astype(dtype), query_labels, ks=(1,),
                                    metric="euclidean", nmi=False, reference=reference,
                                    reference_labels=reference_labels)
        assert metrics["recall@1"] == pytest.approx(np.mean(hits), abs=1e-12)


def test_numpy_float16_embeddings_are_searched_in_float32():
    """A NumPy float16 matrix had been shifted in float16: shifted by a source median of
    40000, -40000 overflowed float16, and source-NN accuracy was 0.5 where it is 1."""
    from kdml.evaluation.transfer import source_nn_accuracy

    source = np.array([[40000.0]] * 5 + [[-40000.0], [-39936.0]], dtype=np.float16)
    source_labels = np.array([0] * 5 + [1, 2])
    target = np.array([[-39900.0], [-39990.0]], dtype=np.float16)
    target_labels = np.array([2, 1])
    assert source_nn_accuracy(source, source_labels, target, target_labels) == 1.0
    assert source_nn_accuracy(source.astype(np.float32), source_labels,
                              target.astype(np.float32), target_labels) == 1.0


@pytest.mark.parametrize("flag", [-1, "a", None, 1.0])
def test_exclude_self_that_is_no_bool_is_refused(flag):
    """exclude_self=-1 had stopped the search with an IndexError, a string or None with int()'s
    errors; NumPy's bool passes."""
    x = np.arange(12.0).reshape(6, 2)
    with pytest.raises(KdmlError, match=rf"^exclude_self must be True or False, got {flag!r}$"):
        list(knn_search(x, k=1, exclude_self=flag))
    assert [chunk.indices.tolist() for chunk in knn_search(x, k=1, exclude_self=np.True_)] == [
        chunk.indices.tolist() for chunk in knn_search(x, k=1, exclude_self=True)]


def test_l2_normalize_keeps_float64_rows_whose_squares_leave_floats_range():
    """A float64 row of 1e-200 had squares of 0 (a zero vector, left at zero) and one of 1e200
    squares of inf (a row of zeros after the division); each row is scaled on its own first,
    exactly, so ordinary rows come out bit for bit as before."""
    from kdml.evaluation.knn import l2_normalize

    rows = np.array([[1e-200, 1e-200], [1e200, 0.0], [3e-170, 4e-170], [0.0, 0.0]])
    got = l2_normalize(rows, inplace=False)
    assert got.ravel().tolist() == pytest.approx(
        [math.sqrt(0.5), math.sqrt(0.5), 1.0, 0.0, 0.6, 0.8, 0.0, 0.0], rel=1e-15, abs=0.0)
    ordinary = np.random.default_rng(0).normal(size=(50, 7))
    norms = np.sqrt(np.einsum("ij,ij->i", ordinary, ordinary))
    assert np.array_equal(l2_normalize(ordinary, inplace=False), ordinary / norms[:, None])
    assert np.array_equal(l2_normalize(ordinary.copy(), inplace=True), ordinary / norms[:, None])


def test_drop_self_removes_the_query_wherever_it_is_else_the_farthest_column():
    """Each row's own index is removed where it was retrieved (duplicates can put it in any
    column); a row that did not retrieve itself (more than k duplicates nearer or as near)
    loses its last, farthest column, keeping the k nearest."""
    from kdml.evaluation.knn import drop_self

    scores = np.array([[0.0, 0.0, 1.0], [0.0, 0.5, 1.0], [0.0, 0.5, 1.0]], dtype=np.float32)
    indices = np.array([[4, 7, 2], [3, 1, 5], [8, 9, 6]])
    kept_scores, kept = drop_self(scores, indices, np.array([7, 5, 2]))
    np.testing.assert_array_equal(kept, [[4, 2], [3, 1], [8, 9]])
    np.testing.assert_array_equal(kept_scores, [[0.0, 1.0], [0.0, 0.5], [0.0, 0.5]])


def test_squared_distances_of_the_full_row_search_are_never_negative():
    """A k of 1024 or more runs through whole score rows (torch), where |q|^2 + |r|^2 - 2 q.r
    of a duplicate rounds to as low as -12 at a norm of 4,000: clamped at 0, as faiss's own
    search does, since a squared distance is not negative."""
    points = np.random.default_rng(0).standard_normal((520, 16)) * 1000.0
    points = np.concatenate([points, points])  # each point twice: a distance of 0 each
    scores = np.concatenate([chunk.scores for chunk in knn_search(points, k=1024,
                                                                  metric="euclidean")])
    assert scores.min() == 0.0
