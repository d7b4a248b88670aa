"""The evaluation numbers, as a fuzzing session of them found them (every metric otherwise
agreed with literal references and PML's AccuracyCalculator on ~3,000 tie-heavy cases): the
cosine of a tiny row beside a huge one read as a zero vector (one power of two shared by all
rows), a collapse under the cosine missed at a tiny scale, and the expected Recall@K of a tie
group through exp(gammaln) slightly negative or off its exact value."""

from __future__ import annotations

import numpy as np
import pytest

from kdml.evaluation import retrieval_metrics
from kdml.evaluation.charts import chart_retrieval_metrics
from kdml.evaluation.ties import expected_scores


def _far_pair_among_tied_strangers(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Two samples of class 0 at 0 and 10, and ``size`` samples of other classes (each alone,
    so left out of the averages) all at 1: each counted query's first ``size`` neighbours are
    one tie group holding no relevant neighbour."""
    embeddings = np.array([[0.0], [10.0]] + [[1.0]] * size)
    labels = np.array([0, 0, *range(1, size + 1)])
    return embeddings, labels


@pytest.mark.parametrize(("size", "k"), [(7, 4), (6, 4), (3, 1), (4, 2), (259, 257)])
def test_recall_at_k_of_a_tie_group_without_hits_is_exactly_zero(size, k):
    """Every order of the tied strangers puts no relevant neighbour in the first K: Recall@K is
    0, not the rounding of 1 - C(g, K) / C(g, K) through gammaln (-4.4e-16 for g = 7, K = 4:
    a negative recall, printed as -0.0000). Beyond EXACT_TAKEN draws (K = 257) the log-gamma
    ratio, 1 + 5.5e-14 for g = 259, is clipped to 1."""
    embeddings, labels = _far_pair_among_tied_strangers(size)
    results = retrieval_metrics(embeddings, labels, ks=(k,), metric="euclidean", nmi=False)
    assert results[f"recall@{k}"] == 0.0


def test_chart_recall_of_a_tie_group_without_hits_is_exactly_zero():
    embeddings, labels = _far_pair_among_tied_strangers(7)
    results = chart_retrieval_metrics(embeddings, np.zeros(len(labels), dtype=np.int64), labels,
                                      ks=(4,), nmi=False)
    assert results["recall@4"] == 0.0


def test_expected_recall_of_one_tie_group_is_exact():
    """The expected Recall@1 of one group of g neighbours holding h relevant ones is h / g (the
    docstring's 9/499, its expected rel(1), R-Precision at R = 1), to float64's precision, not
    the 4e-12 of exp(gammaln(...)) at g = 499; a group without hits gives exactly 0, never
    below it."""
    for size in [*range(2, 40), 499]:
        for hits in range(size + 1):
            is_hit = np.zeros((1, size), dtype=bool)
            is_hit[0, :hits] = True
            continues = np.ones((1, size), dtype=bool)
            continues[0, 0] = False
            ks = tuple(range(1, min(size, 12) + 1))
            recall, _, r_precision = expected_scores(is_hit, continues, ks, np.array([1]))
            assert recall.min() >= 0.0 and recall.max() <= 1.0, (size, hits)
            if hits == 0:
                assert (recall == 0.0).all(), (size, hits)
            assert recall[0, 0] == pytest.approx(hits / size, rel=1e-14, abs=0), (size, hits)
            assert r_precision[0] == pytest.approx(hits / size, rel=1e-14, abs=0), (size, hits)



@pytest.mark.parametrize("backend", ["faiss", "torch"])
def test_the_cosine_of_a_tiny_row_survives_a_huge_row_elsewhere(backend):
    """The cosine is per row: a row of 1e-200 has the direction of [1, 0] whatever another row
    holds (knn.row_powers_of_two: "neither underflows for a row of 1e-200 nor overflows for one
    of 1e200, whatever the other rows hold"; pair_scores already scales row by row). The search
    first divided every row by one power of two for the 1e200 row, which made the 1e-200 row a
    zero vector: Recall@1 0.667 (faiss) and 0.333 (torch) for 1.0."""
    import torch

    embeddings = np.array([[1e-200, 0.0], [1.0, 0.0], [0.0, 1e200], [0.0, 1.0]])
    labels = np.array([0, 0, 1, 1])
    given = torch.from_numpy(embeddings) if backend == "torch" else embeddings
    results = retrieval_metrics(given, labels, ks=(1,), metric="cosine", nmi=False,
                                backend=backend)
    assert results == {"recall@1": 1.0, "map@r": 1.0, "r_precision": 1.0}


def test_source_nn_accuracy_under_the_cosine_reads_a_tiny_source_row_by_its_direction():
    """The target [1, 0.1] has cosine 0.995 with the source row [1e-200, 0] (label 0) and 0.0995
    with [0, 1e200] (label 1); the shared power of two for the 1e200 row had made the first a
    zero vector (similarity 0) and the accuracy 0."""
    from kdml.evaluation.transfer import source_nn_accuracy

    source = np.array([[1e-200, 0.0], [0.0, 1e200]])
    assert source_nn_accuracy(source, [0, 1], np.array([[1.0, 0.1]]), [0],
                              metric="cosine") == 1.0


@pytest.mark.parametrize("scale", [1e-13, 1e-20])
def test_a_collapse_under_the_cosine_does_not_depend_on_the_embeddings_scale(scale):
    """collapse(metric="cosine") measures the share of the points in one direction: 60 of 100
    rows along [0.6, 0.8, 0] are 60% collapsed at any scale. F.normalize's floor of 1e-12 on
    the norm left rows of norm 1e-13 unnormalised, their lengths apart: share 0."""
    import torch

    from kdml.evaluation.collapse import collapse

    torch.manual_seed(0)
    direction = torch.tensor([0.6, 0.8, 0.0])
    embeddings = torch.cat([direction * torch.linspace(0.5, 2.0, 60)[:, None],
                            torch.randn(40, 3)])
    expected = collapse(embeddings, "cosine").share
    assert expected == pytest.approx(0.6)
    assert collapse(embeddings * scale, "cosine").share == pytest.approx(expected)
