"""retrieval_metrics against a plain-loop brute force, pytorch-metric-learning and sklearn."""

from __future__ import annotations

import math
import warnings

import faiss
import numpy as np
import pytest
import torch
from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator
from sklearn.metrics import normalized_mutual_info_score

from kdml.errors import KdmlError
from kdml.evaluation import retrieval_metrics
from kdml.evaluation.clustering import clustering_nmi

KS = (1, 2, 5, 10, 20)  # 5..20 exceed several class sizes below


def unit_length(row):
    norm = math.sqrt(sum(v * v for v in row))
    return [v / norm for v in row]


def brute_force_metrics(embeddings, labels, ks, metric, reference=None, reference_labels=None):
    """Recall@K, MAP@R, R-Precision with Python loops in float64, lone queries skipped."""
    same_set = reference is None
    queries = [[float(v) for v in row] for row in embeddings]
    refs = queries if same_set else [[float(v) for v in row] for row in reference]
    ref_labels = labels if same_set else reference_labels
    if metric == "cosine":
        queries = [unit_length(row) for row in queries]
        refs = queries if same_set else [unit_length(row) for row in refs]

    recall = dict.fromkeys(ks, 0.0)
    map_at_r = r_precision = 0.0
    counted = 0
    for i, query in enumerate(queries):
        ranked = []
        for j, ref in enumerate(refs):
            if same_set and j == i:
                continue
            if metric == "cosine":
                order_key = -sum(a * b for a, b in zip(query, ref, strict=True))
            else:
                order_key = sum((a - b) ** 2 for a, b in zip(query, ref, strict=True))
            ranked.append((order_key, int(ref_labels[j])))
        ranked.sort()
        ranked_labels = [label for _, label in ranked]
        label = int(labels[i])
        r = ranked_labels.count(label)
        if r == 0:  # lone query
            continue
        counted += 1
        for k in ks:
            recall[k] += 1.0 if label in ranked_labels[:k] else 0.0
        hits, precision_sum = 0, 0.0
        for position in range(r):
            if ranked_labels[position] == label:
                hits += 1
                precision_sum += hits / (position + 1)
        map_at_r += precision_sum / r
        r_precision += hits / r
    result = {f"recall@{k}": recall[k] / counted for k in ks}
    result["map@r"] = map_at_r / counted
    result["r_precision"] = r_precision / counted
    return result


def clustered(class_sizes, dim=6, noise=0.9, seed=0):
    """Gaussian class centres plus noise: neighbours are informative but not perfect."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(class_sizes)), class_sizes)
    centres = rng.standard_normal((len(class_sizes), dim))
    embeddings = centres[labels] + noise * rng.standard_normal((len(labels), dim))
    order = rng.permutation(len(labels))
    return embeddings[order].astype(np.float32), labels[order] * 3 + 7  # non-dense label values


@pytest.fixture
def same_set_data():
    # Two classes of size 1: lone queries in the leave-one-out setting.
    return clustered([1, 2, 3, 4, 5, 6, 8, 12, 1, 9, 2])


@pytest.fixture
def separate_data():
    queries, query_labels = clustered([3, 4, 2, 5, 3, 6, 2], seed=1)
    reference, reference_labels = clustered([5, 1, 7, 2, 9, 4, 3, 6], seed=2)
    # Query class 6 (label 25) has no reference sample: lone. Reference class 7 is unqueried.
    return queries, query_labels, reference, reference_labels


def assert_metrics_close(actual, expected):
    assert actual.keys() == expected.keys()
    for key in expected:
        assert actual[key] == pytest.approx(expected[key], abs=1e-12), key


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
@pytest.mark.parametrize("chunk_size", [3, 4096])
def test_same_set_matches_brute_force(same_set_data, metric, chunk_size):
    embeddings, labels = same_set_data
    actual = retrieval_metrics(
        embeddings, labels, ks=KS, metric=metric, nmi=False, chunk_size=chunk_size
    )
    assert_metrics_close(actual, brute_force_metrics(embeddings, labels, KS, metric))
    assert 0.2 < actual["map@r"] < 0.95  # the data is neither trivial nor random


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
@pytest.mark.parametrize("chunk_size", [2, 4096])
def test_separate_reference_matches_brute_force(separate_data, metric, chunk_size):
    queries, query_labels, reference, reference_labels = separate_data
    actual = retrieval_metrics(
        queries,
        query_labels,
        ks=KS,
        metric=metric,
        reference=reference,
        reference_labels=reference_labels,
        nmi=False,
        chunk_size=chunk_size,
    )
    expected = brute_force_metrics(queries, query_labels, KS, metric, reference, reference_labels)
    assert_metrics_close(actual, expected)


def pml_metrics(metric, query, query_labels, reference=None, reference_labels=None):
    if metric == "cosine":  # PML's default k-NN is L2; on unit vectors it ranks like cosine
        query = query / np.linalg.norm(query, axis=1, keepdims=True)
        if reference is not None:
            reference = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    calculator = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
        k="max_bin_count",
        device=torch.device("cpu"),
    )
    # PML 2.x: reference=None means "query is the reference, leave self out"
    # (ref_includes_query=True); a separate reference uses ref_includes_query=False.
    return calculator.get_accuracy(
        torch.from_numpy(query),
        torch.from_numpy(query_labels),
        None if reference is None else torch.from_numpy(reference),
        None if reference_labels is None else torch.from_numpy(reference_labels),
        ref_includes_query=False,
    )


def assert_matches_pml(ours, pml):
    assert ours["recall@1"] == pytest.approx(pml["precision_at_1"], abs=1e-9)
    assert ours["map@r"] == pytest.approx(pml["mean_average_precision_at_r"], abs=1e-9)
    assert ours["r_precision"] == pytest.approx(pml["r_precision"], abs=1e-9)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_same_set_matches_pml(metric):
    # 60 classes of 1..7 samples: includes lone queries, which PML leaves out.
    rng = np.random.default_rng(3)
    embeddings, labels = clustered(rng.integers(1, 8, size=60), dim=16, noise=1.2, seed=4)
    ours = retrieval_metrics(embeddings, labels, ks=(1,), metric=metric, nmi=False)
    assert_matches_pml(ours, pml_metrics(metric, embeddings, labels))


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_separate_reference_matches_pml(separate_data, metric):
    queries, query_labels, reference, reference_labels = separate_data
    ours = retrieval_metrics(
        queries,
        query_labels,
        ks=(1,),
        metric=metric,
        reference=reference,
        reference_labels=reference_labels,
        nmi=False,
    )
    pml = pml_metrics(metric, queries, query_labels, reference, reference_labels)
    assert_matches_pml(ours, pml)


def test_lone_queries_do_not_count(same_set_data):
    """Adding a lone query (a label seen nowhere else) leaves every metric unchanged."""
    embeddings, labels = same_set_data
    without = retrieval_metrics(embeddings, labels, ks=KS, metric="euclidean", nmi=False)
    far_away = np.full((1, embeddings.shape[1]), 1e4, dtype=np.float32)  # nobody's neighbour
    with_lone = retrieval_metrics(
        np.concatenate([far_away, embeddings]),
        np.concatenate([[-1], labels]),
        ks=KS,
        metric="euclidean",
        nmi=False,
    )
    assert_metrics_close(with_lone, without)


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_euclidean_scores_do_not_move_with_the_embeddings_origin(separate_data, backend, dtype):
    """Distances do not change under a shift, so neither do the scores: embeddings 1000 or
    10,000 away from the origin (a large common mean, as ReLU features have) had scored at
    chance, faiss's float32 rounding growing with |x|^2 and every neighbour looking tied."""
    queries, query_labels, reference, reference_labels = separate_data
    queries, reference = queries.astype(dtype), reference.astype(dtype)

    def scores(shift, with_reference):
        searched = queries + shift
        gallery = {"reference": reference + shift, "reference_labels": reference_labels}
        return retrieval_metrics(torch.from_numpy(searched) if backend == "torch" else searched,
                                 query_labels, ks=KS, metric="euclidean", nmi=False,
                                 backend=backend, **(gallery if with_reference else {}))

    for with_reference in (False, True):
        expected = scores(0.0, with_reference)
        for offset in (300.0, 1000.0, 1e4):
            shift = np.linspace(-1.0, 1.0, queries.shape[1], dtype=dtype) * offset
            assert_metrics_close(scores(shift, with_reference), expected)


def test_nmi_is_one_for_well_separated_classes():
    embeddings, labels = clustered([20] * 5, dim=8, noise=0.01, seed=5)
    assert retrieval_metrics(embeddings, labels, ks=(1,))["nmi"] == pytest.approx(1.0)


def literal_faiss_nmi(vectors: np.ndarray, labels: np.ndarray, num_clusters: int,
                      niter: int = 20, max_points: int = 256) -> float:
    """The documented route, literally: order the points by two seeded projections, seed
    k-means++ with plain loops, run faiss k-means from those centres (``niter`` iterations,
    trained on at most ``max_points`` points per centroid), NMI by scikit-learn."""
    projections = np.random.default_rng(0).standard_normal((vectors.shape[1], 2))
    keys = vectors.astype(np.float64) @ projections
    order = sorted(range(len(vectors)), key=lambda i: (keys[i, 0], keys[i, 1]))
    ordered = vectors[order]
    rng = np.random.default_rng(0)
    centres = [int(rng.integers(len(ordered)))]
    nearest = [float(((row.astype(np.float64) - ordered[centres[0]]) ** 2).sum())
               for row in ordered]
    for _ in range(num_clusters - 1):
        threshold, running = rng.random() * sum(nearest), 0.0
        chosen = next(i for i, d in enumerate(nearest) if (running := running + d) >= threshold)
        centres.append(chosen)
        nearest = [min(d, float(((row.astype(np.float64) - ordered[chosen]) ** 2).sum()))
                   for d, row in zip(nearest, ordered, strict=True)]
    kmeans = faiss.Kmeans(vectors.shape[1], num_clusters, niter=niter, seed=0,
                          max_points_per_centroid=max_points)
    kmeans.train(np.ascontiguousarray(ordered), init_centroids=ordered[centres])
    _, assigned = kmeans.index.search(np.ascontiguousarray(ordered), 1)
    assignments = np.empty(len(vectors), dtype=np.int64)
    assignments[order] = assigned.ravel()
    return normalized_mutual_info_score(labels, assignments)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_nmi_matches_direct_faiss_kmeans_and_sklearn(metric):
    embeddings, labels = clustered([25, 30, 20, 25, 30, 20], dim=8, noise=1.0, seed=6)
    vectors = embeddings.astype(np.float32)
    if metric == "cosine":
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    expected = literal_faiss_nmi(vectors, labels, 6)

    ours = retrieval_metrics(embeddings, labels, ks=(1,), metric=metric)["nmi"]
    assert ours == pytest.approx(expected, abs=1e-12)
    assert 0.2 < ours < 0.99
    assert clustering_nmi(embeddings, labels, metric=metric) == ours


def test_nmi_runs_niter_iterations_on_every_point():
    """niter reaches faiss (a fixed 20 had passed every test), and every point trains the
    centroids, as the docstring says: above faiss's default of 256 points per centroid it
    trains on a sample unless told otherwise (which had passed every test too)."""
    embeddings, labels = clustered([60] * 8, dim=16, noise=1.6, seed=0)
    by_niter = {niter: clustering_nmi(embeddings, labels, metric="euclidean", niter=niter)
                for niter in (1, 2)}
    for niter, nmi in by_niter.items():
        assert nmi == pytest.approx(literal_faiss_nmi(embeddings, labels, 8, niter), abs=1e-12)
    assert by_niter[1] != by_niter[2]
    embeddings, labels = clustered([700, 700], dim=8, noise=2.0, seed=1)  # 700 > 256
    every_point = literal_faiss_nmi(embeddings, labels, 2, max_points=len(embeddings))
    assert every_point != literal_faiss_nmi(embeddings, labels, 2)  # faiss's sample differs
    assert clustering_nmi(embeddings, labels, metric="euclidean") == pytest.approx(
        every_point, abs=1e-12)


def test_chunk_size_does_not_change_results(same_set_data):
    embeddings, labels = same_set_data
    small = retrieval_metrics(embeddings, labels, ks=KS, nmi=False, chunk_size=7)
    large = retrieval_metrics(embeddings, labels, ks=KS, nmi=False, chunk_size=100_000)
    assert small == large


@pytest.mark.parametrize(("metric", "seed"), [("euclidean", 0), ("cosine", 6)])
def test_chunk_size_does_not_change_results_in_the_last_digit(metric, seed):
    """Bit-identical, as documented, where classes are large enough for np.sum's pairwise
    blocks: a query's MAP@R and R-Precision terms are as wide as the largest R scored with it,
    and np.sum over them had moved the last digit with the chunk size (these two sets: the
    expectations of their many exact ties)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 5, 400)
    labels[:3] = [7, 8, 9]  # lone queries too
    rng.standard_normal((400, 4))  # (the draws that found them)
    embeddings = rng.integers(0, 3, (400, 2)).astype(float)  # many exact ties
    small, large = (retrieval_metrics(embeddings, labels, ks=(1, 5), metric=metric, nmi=False,
                                      chunk_size=chunk_size) for chunk_size in (7, 4096))
    assert small == large


@pytest.mark.parametrize("chunk_size", [0, -3, 2.5, True, "64"])
def test_bad_chunk_size_is_a_one_line_error(same_set_data, chunk_size):
    embeddings, labels = same_set_data
    with pytest.raises(KdmlError, match="chunk_size must be a positive integer"):
        retrieval_metrics(embeddings, labels, ks=KS, nmi=False, chunk_size=chunk_size)


def test_numpy_integer_chunk_size_is_accepted(same_set_data):
    embeddings, labels = same_set_data
    assert retrieval_metrics(embeddings, labels, ks=KS, nmi=False,
                             chunk_size=np.int64(7)) == retrieval_metrics(
        embeddings, labels, ks=KS, nmi=False, chunk_size=7)


def test_torch_and_numpy_inputs_agree(same_set_data):
    embeddings, labels = same_set_data
    from_numpy = retrieval_metrics(embeddings.astype(np.float64), labels, ks=KS)
    from_torch = retrieval_metrics(
        torch.from_numpy(embeddings).double(), torch.from_numpy(labels).int(), ks=KS
    )
    assert from_numpy == from_torch


def test_inputs_are_not_modified(same_set_data):
    embeddings, labels = same_set_data
    array_before, tensor = embeddings.copy(), torch.from_numpy(embeddings.copy())
    retrieval_metrics(embeddings, labels, ks=(1,), metric="cosine", nmi=False)
    retrieval_metrics(tensor, labels, ks=(1,), metric="cosine", nmi=False)
    np.testing.assert_array_equal(embeddings, array_before)
    np.testing.assert_array_equal(tensor.numpy(), array_before)


def test_returns_only_requested_keys(same_set_data):
    embeddings, labels = same_set_data
    assert set(retrieval_metrics(embeddings, labels, ks=(1, 4))) == {
        "recall@1",
        "recall@4",
        "map@r",
        "r_precision",
        "nmi",
    }


BAD_INPUTS = {
    "labels length": lambda x, y: retrieval_metrics(x, y[:-1]),
    "labels 2-D": lambda x, y: retrieval_metrics(x, y[:, None]),
    "float labels": lambda x, y: retrieval_metrics(x, y.astype(np.float32)),
    "1-D embeddings": lambda x, y: retrieval_metrics(x[:, 0], y),
    "integer embeddings": lambda x, y: retrieval_metrics(x.astype(np.int64), y),
    "nan": lambda x, y: retrieval_metrics(np.where(x > 1.5, np.nan, x), y),
    "inf": lambda x, y: retrieval_metrics(np.where(x > 1.5, np.inf, x), y),
    "empty": lambda x, y: retrieval_metrics(x[:0], y[:0]),
    "zero dimensions": lambda x, y: retrieval_metrics(x[:, :0], y),
    "k = 0": lambda x, y: retrieval_metrics(x, y, ks=(1, 0)),
    "k < 0": lambda x, y: retrieval_metrics(x, y, ks=(-2,)),
    "k not int": lambda x, y: retrieval_metrics(x, y, ks=(1.5,)),
    "no ks": lambda x, y: retrieval_metrics(x, y, ks=()),
    "ks not a sequence": lambda x, y: retrieval_metrics(x, y, ks=5),
    "k > N - 1": lambda x, y: retrieval_metrics(x, y, ks=(len(x),)),
    "k > reference": lambda x, y: retrieval_metrics(
        x, y, ks=(11,), reference=x[:10], reference_labels=y[:10]
    ),
    "reference without labels": lambda x, y: retrieval_metrics(x, y, reference=x),
    "labels without reference": lambda x, y: retrieval_metrics(x, y, reference_labels=y),
    "reference labels length": lambda x, y: retrieval_metrics(
        x, y, reference=x, reference_labels=y[:-1]
    ),
    "reference dimension": lambda x, y: retrieval_metrics(
        x, y, reference=x[:, :-1], reference_labels=y
    ),
    "metric": lambda x, y: retrieval_metrics(x, y, metric="manhattan"),
    "chunk size": lambda x, y: retrieval_metrics(x, y, chunk_size=0),
    "every query lone": lambda x, y: retrieval_metrics(x, np.arange(len(x))),
    "every query lone vs reference": lambda x, y: retrieval_metrics(
        x, y, reference=x, reference_labels=y + 1000
    ),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_inputs_raise_kdml_error(same_set_data, case):
    embeddings, labels = same_set_data
    with pytest.raises(KdmlError) as error:
        BAD_INPUTS[case](embeddings, labels)
    assert "\n" not in str(error.value)


def test_uint64_labels_beyond_int64_are_refused_not_wrapped():
    """2**64 - 1 cast to int64 is -1, which would match a reference label -1."""
    embeddings = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.1, 1.0]])
    fine = np.array([0, 0, 2**62, 2**62], dtype=np.uint64)
    assert retrieval_metrics(embeddings, fine, ks=(1,), nmi=False)["recall@1"] == 1.0
    with pytest.raises(KdmlError, match=r"holds 18446744073709551615, beyond int64"):
        retrieval_metrics(embeddings, np.array([0, 0, 2**64 - 1, 2**64 - 1], dtype=np.uint64),
                          ks=(1,), nmi=False)


def test_transposed_embeddings_are_named_as_the_likely_mistake():
    """[D, N] embeddings with N labels: the error says they look transposed; a label array that
    is merely short gets no such guess."""
    embeddings = np.random.default_rng(0).normal(size=(12, 3))
    labels = np.arange(12) % 4
    with pytest.raises(KdmlError, match=r"^labels must have shape \(3,\) to match the "
                       r"embeddings, got \(12,\); the embeddings, \[3, 12\], look transposed: "
                       r"pass them as \[N, D\]$"):
        retrieval_metrics(embeddings.T, labels, ks=(1,))
    with pytest.raises(KdmlError, match=r"got \(6,\)$"):
        retrieval_metrics(embeddings, labels[:6], ks=(1,))


# ------------------------------------------------- the query set given as its own reference


def query_set(seed=0):
    """40 random vectors in 8 classes: leave-one-out Recall@1 near 1/8, each query finding
    itself 1.0."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((40, 8)), np.repeat(np.arange(8), 5)


@pytest.mark.parametrize(("kind", "view"), [
    ("tensor", lambda x: x.detach()), ("tensor", lambda x: x[:]),
    ("tensor", lambda x: x.view(x.shape)), ("array", lambda x: x[:])],
    ids=["detach", "slice", "view", "array slice"])
def test_a_view_of_the_query_set_as_reference_is_refused(kind, view):
    """Only ``reference is embeddings`` was refused: x.detach() or x[:] gave Recall@1 = 1.0
    on random data (0.075 leave-one-out)."""
    embeddings, labels = query_set()
    queries = torch.from_numpy(embeddings) if kind == "tensor" else embeddings
    with pytest.raises(KdmlError, match="^reference is the query set itself, where each query "
                                        "would retrieve itself; leave reference and "
                                        "reference_labels out to search the set leave-one-out$"):
        retrieval_metrics(queries, labels, reference=view(queries), reference_labels=labels,
                          nmi=False)
    assert retrieval_metrics(queries, labels, nmi=False)["recall@1"] < 0.2


@pytest.mark.parametrize("copy", [
    lambda x: x.clone(), lambda x: x.numpy().copy(), lambda x: x.float().double()],
    ids=["clone", "array copy", "float64 of float32 values"])
def test_a_copy_of_the_query_set_as_reference_is_warned_of_and_searched(copy):
    """A copy with the same labels is most likely the query set again (Recall@1 of 1), but
    different samples can embed alike, so it is searched, with a warning."""
    embeddings, labels = query_set()
    queries = torch.from_numpy(embeddings).float().double()
    with pytest.warns(UserWarning, match="^reference holds the same embeddings and labels as "
                                         "the queries, so each query retrieves its own copy "
                                         "first .*leave-one-out, unless the gallery truly "
                                         "duplicates the queries$") as warned:
        scores = retrieval_metrics(queries, labels, reference=copy(queries),
                                   reference_labels=labels, nmi=False)
    assert len(warned) == 1 and warned[0].filename == __file__  # the caller's line
    assert scores["recall@1"] == 1.0


def test_a_collapsed_gallery_equal_to_the_queries_is_searched_as_given():
    """The legitimate case a refusal would break: a collapsed model embeds equally many gallery
    and query images, in one label order, identically. Every reference then ties, and each
    metric is its expectation over the tie's orders: Recall@1 = 5 / 40."""
    labels = np.repeat(np.arange(8), 5)
    queries, gallery = np.ones((40, 4)), np.ones((40, 4))
    with pytest.warns(UserWarning, match="^reference holds the same embeddings and labels"):
        scores = retrieval_metrics(queries, labels, reference=gallery, reference_labels=labels,
                                   ks=(1,), nmi=False)
    assert scores["recall@1"] == pytest.approx(5 / 40)


@pytest.mark.parametrize("change", ["labels", "values", "rows"])
def test_a_reference_that_differs_from_the_queries_is_not_warned_of(change):
    embeddings, labels = query_set()
    reference, reference_labels = embeddings.copy(), labels.copy()
    if change == "labels":
        reference_labels = np.roll(labels, 1)
    elif change == "values":
        reference[3, 2] = np.nextafter(reference[3, 2], np.inf)
    else:
        reference, reference_labels = reference[:-1], reference_labels[:-1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        retrieval_metrics(embeddings, labels, reference=reference,
                          reference_labels=reference_labels, nmi=False)


def test_python_lists_are_taken_as_a_reference_with_the_queries_labels():
    """equal_values read .shape of a list: lists were taken everywhere but for a reference
    whose labels equal the queries' (an AttributeError)."""
    from kdml.evaluation.charts import chart_retrieval_metrics

    queries, gallery, labels = [[0.0], [1.0], [5.0], [6.0]], [[0.1], [1.1], [5.1], [6.1]], [
        0, 0, 1, 1]
    metrics = retrieval_metrics(queries, labels, ks=(1,), nmi=False, metric="euclidean",
                                reference=gallery, reference_labels=labels)
    assert metrics == retrieval_metrics(np.array(queries), labels, ks=(1,), nmi=False,
                                        metric="euclidean", reference=np.array(gallery),
                                        reference_labels=labels)
    assert metrics["recall@1"] == 1.0
    charts = chart_retrieval_metrics(queries, [0] * 4, labels, ks=(1,), nmi=False,
                                     reference_coords=gallery, reference_chart_index=[0] * 4,
                                     reference_labels=labels)
    assert charts["recall@1"] == 1.0


def test_queries_of_the_largest_class_absent_from_the_reference_are_left_out():
    """The largest label among the queries has no reference sample: its queries are lone and
    left out of the averages (the per-class count had been one class short, an IndexError)."""
    queries = np.array([[0.0], [0.2], [10.0], [10.2], [20.0], [20.5]])
    reference = np.array([[0.1], [5.0], [10.1], [30.0]])
    # class 0 queries: 0.1 and 5.0 first, both relevant; class 1: 10.1 (hit), then 5.0 (miss)
    got = retrieval_metrics(queries, [0, 0, 1, 1, 2, 2], ks=(1,), metric="euclidean",
                            reference=reference, reference_labels=[0, 0, 1, 1], nmi=False)
    assert got == pytest.approx({"recall@1": 1.0, "map@r": 0.75, "r_precision": 0.75},
                                abs=1e-15)


@pytest.mark.parametrize("chunk_size", [2, 4096])
def test_a_chunk_of_only_lone_queries_is_skipped(chunk_size):
    """chunk_size=2 makes the first chunk the two lone queries (R = 0 for both): it is skipped,
    not a crash, and the other queries score as in one chunk."""
    embeddings = np.array([[0.4], [100.0], [0.0], [1.0], [10.0], [11.0]])
    # 0 and 1 find the lone 0.4 first (misses), 10 and 11 each other (hits)
    got = retrieval_metrics(embeddings, [5, 6, 0, 0, 1, 1], ks=(1, 2), metric="euclidean",
                            nmi=False, chunk_size=chunk_size)
    assert got == pytest.approx({"recall@1": 0.5, "recall@2": 1.0, "map@r": 0.5,
                                 "r_precision": 0.5}, abs=1e-15)


def test_k_of_every_other_sample_is_accepted_in_leave_one_out():
    """K = N - 1 is the whole reference of a leave-one-out query: allowed, and its Recall@K is
    1 for every query that has a relevant sample; K = N is refused."""
    embeddings = np.array([[0.0], [1.0], [2.5], [7.0]])
    # neighbours: 0 -> 1 (hit); 1 -> 0 (hit); 2.5 -> 1, 0, 7 (miss at 1); 7 -> 2.5 (hit)
    got = retrieval_metrics(embeddings, [0, 0, 1, 1], ks=(1, 3), metric="euclidean", nmi=False)
    assert got == pytest.approx({"recall@1": 0.75, "recall@3": 1.0, "map@r": 0.75,
                                 "r_precision": 0.75}, abs=1e-15)
    with pytest.raises(KdmlError, match="^K=4 in ks is larger than the 3 available references$"):
        retrieval_metrics(embeddings, [0, 0, 1, 1], ks=(4,), metric="euclidean", nmi=False)


@pytest.mark.parametrize("kind", ["array", "tensor"])
def test_the_two_adjacent_halves_of_one_array_are_searched_not_refused(kind):
    """Queries ``x[100:]`` against a reference ``x[:100]`` share memory with it but no row:
    the first query begins where the reference ends, so it is not a reference row. Scored as
    the same values copied apart are."""
    rng = np.random.default_rng(0)
    embeddings, labels = rng.standard_normal((200, 4)), rng.integers(0, 5, 200)
    expected = retrieval_metrics(embeddings[100:].copy(), labels[100:], ks=(1,), nmi=False,
                                 reference=embeddings[:100].copy(),
                                 reference_labels=labels[:100])
    if kind == "tensor":
        embeddings = torch.from_numpy(embeddings)
    assert retrieval_metrics(embeddings[100:], labels[100:], ks=(1,), nmi=False,
                             reference=embeddings[:100], reference_labels=labels[:100]) \
        == expected


def test_nmi_with_a_gallery_clusters_the_queries_and_the_gallery_together():
    """As documented: with a ``reference`` the queries and the gallery are clustered together.
    One query per class alone is one cluster each, an NMI of 1.0 whatever the embedding; the
    random embedding here scores 0.31 together, as clustering_nmi of both sets says."""
    rng = np.random.default_rng(0)
    queries, query_labels = rng.standard_normal((10, 8)), np.arange(10)
    gallery, gallery_labels = rng.standard_normal((50, 8)), np.repeat(np.arange(10), 5)
    got = retrieval_metrics(queries, query_labels, ks=(1,), reference=gallery,
                            reference_labels=gallery_labels)["nmi"]
    assert got == clustering_nmi(np.concatenate([queries, gallery]),
                                 np.concatenate([query_labels, gallery_labels]))
    assert got < 0.5 and clustering_nmi(queries, query_labels) == 1.0


def test_nmi_trains_on_every_point_where_the_points_do_not_divide_among_the_clusters():
    """1,401 points in 2 clusters: faiss samples above max_points_per_centroid * k points, so
    that must be rounded up (701), or faiss trains on 1,400 of them (NMI 0.152, not 0.150)."""
    embeddings, labels = clustered([700, 701], dim=8, noise=2.0, seed=1)
    every_point = literal_faiss_nmi(embeddings, labels, 2, max_points=len(embeddings))
    assert clustering_nmi(embeddings, labels, metric="euclidean") == pytest.approx(
        every_point, abs=1e-12)
