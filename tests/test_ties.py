"""Tied neighbours count as their expectation over random orders; metrics do not depend on the
order of the samples nor on a positive scaling of the embeddings."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from kdml.evaluation import retrieval, retrieval_metrics
from kdml.evaluation.charts import chart_retrieval_metrics
from kdml.evaluation.ties import (
    _choose_ratio,
    continues_group,
    expected_scores,
    group_reaches_last_column,
    last_group_settled,
    tie_tolerance,
)


def literal_scores(hits: list[int], groups: list[int], ks, r: int):
    """Recall@K, AP@R and R-Precision averaged over every order of every tie group: the
    definition, by enumeration (float64, plain loops)."""
    members = [[i for i, g in enumerate(groups) if g == group] for group in sorted(set(groups))]
    totals = np.zeros(len(ks) + 2)
    count = 0
    for orders in itertools.product(*(itertools.permutations(m) for m in members)):
        ranked = [hits[i] for order in orders for i in order]
        recall = [float(any(ranked[:k])) for k in ks]
        found, precision_sum = 0, 0.0
        for position in range(r):
            if ranked[position]:
                found += 1
                precision_sum += found / (position + 1)
        totals += recall + [precision_sum / r, found / r]
        count += 1
    return totals / count


CASES = [  # hits, tie group of each rank (consecutive ranks share a group), ks, R
    ([1, 0, 1, 0, 0, 1], [0, 0, 0, 1, 1, 2], (1, 2, 4), 3),
    ([0, 0, 1, 1, 0, 0, 1], [0, 1, 1, 1, 1, 2, 3], (1, 2, 3), 3),
    ([0, 1, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0], (1, 2, 5), 3),
    ([1, 1, 0, 1, 0], [0, 1, 2, 3, 4], (1, 3), 3),  # no ties: the plain values
    ([0, 0, 0, 1, 0], [0, 0, 1, 1, 1], (2, 4), 1),
]


@pytest.mark.parametrize(("hits", "groups", "ks", "r"), CASES)
def test_expected_scores_equal_the_average_over_all_orders(hits, groups, ks, r):
    is_hit = np.array([hits], dtype=bool)
    continues = np.array([[j > 0 and groups[j] == groups[j - 1] for j in range(len(groups))]])
    recall, average_precision, r_precision = expected_scores(is_hit, continues, ks,
                                                             np.array([r]))
    expected = literal_scores(hits, groups, ks, r)
    assert recall[:, 0] == pytest.approx(expected[:len(ks)], abs=1e-12)
    assert average_precision[0] == pytest.approx(expected[-2], abs=1e-12)
    assert r_precision[0] == pytest.approx(expected[-1], abs=1e-12)


def test_expected_scores_of_many_rows_at_once_equal_each_rows_enumeration():
    """Rows with and without ties, lone rows (R = 0) and a row tied throughout, in one call:
    each row scores as its own enumeration over all orders."""
    rng = np.random.default_rng(3)
    rows, width, ks = 40, 7, (1, 3, 5)
    is_hit = rng.random((rows, width)) < 0.4
    continues = rng.random((rows, width)) < 0.35
    continues[:, 0] = False
    continues[5, 1:] = True  # one group of all 7
    continues[6, :] = False  # no ties at all
    num_relevant = rng.integers(0, width + 1, rows)
    num_relevant[5] = 4
    recall, average_precision, r_precision = expected_scores(is_hit, continues, ks,
                                                             num_relevant)
    for row in range(rows):
        groups = np.cumsum(~continues[row]).tolist()
        expected = literal_scores(is_hit[row].astype(int).tolist(), groups, ks,
                                  max(int(num_relevant[row]), 1))
        assert recall[:, row] == pytest.approx(expected[:len(ks)], abs=1e-12), row
        if num_relevant[row] == 0:  # lone: left out of the averages, scored 0
            assert average_precision[row] == r_precision[row] == 0.0
        else:
            assert average_precision[row] == pytest.approx(expected[-2], abs=1e-12), row
            assert r_precision[row] == pytest.approx(expected[-1], abs=1e-12), row


def test_identical_embeddings_score_the_expectation_whatever_their_order():
    embeddings = np.ones((500, 4), dtype=np.float32)
    labels = np.repeat(np.arange(50), 10)
    results = []
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(500)
        results.append(retrieval_metrics(embeddings[order], labels[order], ks=(1, 8),
                                         nmi=False))
    assert results[0] == results[1] == results[2]
    assert results[0]["recall@1"] == pytest.approx(9 / 499, rel=1e-9)
    assert results[0]["recall@8"] == pytest.approx(1 - math.comb(490, 8) / math.comb(499, 8),
                                                   rel=1e-9)
    assert results[0]["r_precision"] == pytest.approx(9 / 499, rel=1e-9)
    # MAP@R of one query, by the definition: E[rel(p) hits(p)] = h/g + p h(h-1)/(g(g-1))
    g, h = 499, 9
    average_precision = sum((h / g + p * h * (h - 1) / (g * (g - 1))) / (p + 1)
                            for p in range(9)) / 9
    assert results[0]["map@r"] == pytest.approx(average_precision, rel=1e-9)


@pytest.mark.parametrize("chunk_size", [1, 7, 100_000])
def test_ties_widened_across_chunks_score_as_in_one_chunk(chunk_size):
    """Rows of many chunks whose tie group runs past the searched neighbours are widened
    together at the end; the scores are those of the expectation, whatever the chunking."""
    embeddings = np.repeat(np.eye(3, dtype=np.float32), 40, axis=0)  # 3 groups of 40 copies
    labels = np.tile(np.arange(4), 30)
    results = retrieval_metrics(embeddings, labels, ks=(1, 4), nmi=False,
                                chunk_size=chunk_size)
    g, h = 39, 9  # each query: 39 tied neighbours, 9 of its class
    assert results["recall@1"] == pytest.approx(h / g, rel=1e-9)
    assert results["recall@4"] == pytest.approx(1 - math.comb(g - h, 4) / math.comb(g, 4),
                                                rel=1e-9)
    assert results["r_precision"] == pytest.approx(h / g, rel=1e-9)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_duplicated_points_do_not_make_metrics_depend_on_order(metric):
    rng = np.random.default_rng(3)
    centres = rng.standard_normal((12, 8))
    points = centres[rng.integers(0, 12, 40)]  # 40 distinct points ...
    embeddings = points[rng.integers(0, 40, 240)].astype(np.float32)  # ... each repeated
    labels = rng.integers(0, 6, 240)
    reference = retrieval_metrics(embeddings, labels, ks=(1, 2, 4, 8), metric=metric,
                                  nmi=False)
    for seed in range(3):
        order = np.random.default_rng(seed).permutation(240)
        shuffled = retrieval_metrics(embeddings[order], labels[order], ks=(1, 2, 4, 8),
                                     metric=metric, nmi=False)
        assert shuffled == pytest.approx(reference, abs=1e-12)


def test_scaled_copies_tie_under_the_cosine_metric():
    rng = np.random.default_rng(0)
    direction = rng.standard_normal(16)
    embeddings = np.stack([direction * c for c in rng.uniform(0.1, 100, 30)])
    labels = np.repeat([0, 1, 2], 10)
    scores = [retrieval_metrics(embeddings[order], labels[order], ks=(1,), nmi=False)
              for order in (np.arange(30), rng.permutation(30))]
    assert scores[0] == scores[1]
    assert scores[0]["recall@1"] == pytest.approx(9 / 29)


def well_separated(seed: int = 0):
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(40), 5)
    embeddings = rng.standard_normal((40, 16))[labels] + 0.05 * rng.standard_normal((200, 16))
    return embeddings, labels


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
@pytest.mark.parametrize("factor", [1e19, 1e20, 1e-30, 3.7, 1e200])
def test_metrics_are_invariant_to_a_positive_scaling(metric, factor):
    embeddings, labels = well_separated()
    reference = retrieval_metrics(embeddings, labels, ks=(1, 4), metric=metric)
    scaled = retrieval_metrics(embeddings * factor, labels, ks=(1, 4), metric=metric)
    assert scaled == pytest.approx(reference, abs=1e-12)
    assert reference["recall@1"] == 1.0


@pytest.mark.parametrize("backend", ["faiss", "torch"])
@pytest.mark.parametrize(("dtype", "factor"), [(np.float32, 1e-14), (np.float32, 1e-25),
                                               (np.float64, 1e-50), (np.float64, 1e-170)])
def test_the_cosine_ignores_the_norm_of_one_tiny_row(backend, dtype, factor):
    """A row scaled down among unit ones has the same cosines. Its float32 squared norm had
    underflowed to 0 (faiss: a zero vector, similarity 0 to all), F.normalize's floor of 1e-12
    had left it short of unit length (torch), and a float64 row of 1e-50 became zeros in
    float32 before it was normalised (both); a float64 row of 1e-170, whose squares underflow
    even in float64, is brought near 1 by a power of two first."""
    import torch

    embeddings = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]], dtype=dtype)
    labels = np.array([0, 0, 1, 1])
    scaled = embeddings.copy()
    scaled[0] *= factor
    expected = {"recall@1": 1.0, "map@r": 1.0, "r_precision": 1.0}
    for given in (embeddings, scaled):
        assert retrieval_metrics(torch.from_numpy(given), torch.from_numpy(labels), (1,),
                                 "cosine", nmi=False, backend=backend) == expected


def test_a_gallery_is_rescaled_with_its_queries():
    embeddings, labels = well_separated(1)
    queries, gallery = embeddings[::2] * 1e25, embeddings[1::2] * 1e25
    scores = retrieval_metrics(queries, labels[::2], ks=(1,), metric="euclidean",
                               reference=gallery, reference_labels=labels[1::2], nmi=False)
    assert scores["recall@1"] == 1.0


def test_searches_without_ties_are_not_repeated(monkeypatch):
    calls = []
    real = retrieval.search_rows
    monkeypatch.setattr(retrieval, "search_rows", lambda *a, **k: calls.append(1) or real(*a,
                                                                                         **k))
    embeddings, labels = well_separated(2)
    retrieval_metrics(embeddings, labels, ks=(1, 4), nmi=False)
    assert calls == []
    retrieval_metrics(np.ones((30, 3)), np.repeat(np.arange(3), 10), ks=(1,), nmi=False)
    assert calls  # a tie group running past the retrieved neighbours is searched further


def test_chart_retrieval_ties_count_as_their_expectation():
    coords = np.zeros((60, 2))  # every point at one spot of chart 0 ...
    charts = np.zeros(60, dtype=np.int64)
    charts[50:] = 1  # ... but the last ten in chart 1
    labels = np.repeat(np.arange(6), 10)
    results = [chart_retrieval_metrics(coords[order], charts[order], labels[order], ks=(1, 2),
                                       nmi=False)
               for order in (np.arange(60), np.random.default_rng(0).permutation(60))]
    assert results[0] == pytest.approx(results[1], abs=1e-12)
    # chart 0 queries: 49 tied mates, 9 of them relevant; chart 1: all 9 mates relevant
    assert results[0]["recall@1"] == pytest.approx((50 * 9 / 49 + 10 * 1.0) / 60)


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_tie_flags_skip_exact_tolerances_only_where_no_gap_could_be_a_tie(metric):
    """The search checks each query's gaps against an upper bound of its tolerances first;
    its tie flags must equal those of the exact per-neighbour tolerances everywhere."""
    rng = np.random.default_rng(3)
    base = rng.standard_normal((40, 6))
    # near-duplicates at several norms, so exact tolerances vary along a row
    nudged = base[:20] + 2e-7 * rng.standard_normal((20, 6))  # near ties, not exact ones
    vectors = np.concatenate([base, nudged, 3.0 * base[:10], base[:10]])
    vectors = vectors.astype(np.float32)
    prepared = retrieval.prepare_vectors(vectors, metric, "embeddings", "faiss")
    search = retrieval.RankedSearch(prepared, prepared, metric, True, 32)
    needed = np.full(len(prepared), 12)
    flagged = 0
    for chunk in retrieval.search_prepared(prepared, prepared, needed + 1, metric, True, 32):
        rows = np.arange(chunk.start, chunk.stop)
        exact = continues_group(chunk.scores, tie_tolerance(
            search.query_norms[rows], search.reference_norms[chunk.indices], metric, 6))
        # needed at the last column: no neighbour after it, so none is cut as out of reach
        np.testing.assert_array_equal(
            search._continues(rows, chunk.scores, chunk.indices, needed[rows] + 1), exact)
        flagged += exact.sum()
    assert flagged > 0  # the data has ties, so the check compared both paths


def test_a_group_of_every_neighbour_is_widened_straight_to_the_whole_set(monkeypatch):
    """Doubling the search stops early for a small group, but would search a collapsed
    embedding log2(N / w) times: rows whose neighbours are all tied jump to every reference,
    others double. The scores are the same either way (the tests above)."""
    widths: list[tuple[int, int]] = []
    real = retrieval.search_rows

    def counted(queries, rows, reference, k, *rest):
        widths.append((len(rows), k))
        return real(queries, rows, reference, k, *rest)

    monkeypatch.setattr(retrieval, "search_rows", counted)
    retrieval_metrics(np.ones((500, 4)), np.repeat(np.arange(50), 10), ks=(1, 8), nmi=False)
    assert widths == [(500, 499)]  # searched 10 wide, then once at all 499 others
    widths.clear()
    # two close points, then 100 copies of a far one, one of them of the pair's class: the
    # pair's groups start after their untied nearest neighbour, so they double (5 -> 10 -> ...
    # -> 80); the copies (searched 50 wide: R = 48 or 49) jump to 101, where the pair joins them
    embeddings = np.concatenate([[[1.0, 0.0], [1.0, 0.01]], np.tile([[0.0, 1.0]], (100, 1))])
    labels = np.concatenate([[0, 0], np.arange(100) % 2 + 1])
    labels[2] = 0  # R = 2 for the pair
    retrieval_metrics(embeddings, labels, ks=(1, 4), nmi=False, chunk_size=1)
    assert widths == [(2, 10), (2, 20), (2, 40), (2, 80), (102, 101)]
    widths.clear()
    # with none of the copies of the pair's class, the pair's group of copies holds no
    # relevant neighbour, and both its members are found before it: it is not searched further
    labels[2] = 1
    retrieval_metrics(embeddings, labels, ks=(1, 4), nmi=False, chunk_size=1)
    assert widths == [(100, 101)]


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_a_chain_of_float32_ties_beyond_reach_of_the_ranks_scored_is_not_searched(
        metric, monkeypatch):
    """Dense embeddings (a model early in training): 600 points spread over a tiny patch, so
    every gap between consecutive neighbours is under the float32 tie tolerance and the chain
    of ties runs through every reference. Only neighbours within reach of rank max(K, R) in
    exact arithmetic are searched again: the chain had been followed to all 599 others for
    every query (and re-scored in float64 whole). The scores are those of the exact float64
    ranking of every reference, from a literal loop over the coordinates: each pair's float64
    sum is taken term by term, in order, bit for bit as a plain loop over the pairs takes it,
    for all pairs at once (that loop in Python took seconds)."""
    rng = np.random.default_rng(0)
    centre = rng.standard_normal(8)
    centre /= np.linalg.norm(centre)
    points = centre + 2e-3 * rng.standard_normal((600, 8))
    labels = rng.integers(0, 3, size=600)  # R of about 200
    ks = (1, 4)
    compared = points.astype(np.float64)
    if metric == "cosine":  # each point on the unit sphere, once (was once a pair: 4x slower)
        squared_norms = np.zeros(len(points))
        for coordinate in compared.T:
            squared_norms = squared_norms + coordinate * coordinate
        compared = compared / np.sqrt(squared_norms)[:, None]
    distances = np.zeros((len(points), len(points)))
    for coordinate in compared.T:
        difference = coordinate[:, None] - coordinate[None, :]
        distances = distances + difference * difference
    others = ~np.eye(len(points), dtype=bool)
    neighbours = np.nonzero(others)[1].reshape(len(points), -1)  # each row's j != i, in order
    # ascending distance, then index: the order in which sorting (distance, j) pairs ranks them
    order = np.argsort(distances[others].reshape(len(points), -1), axis=1, kind="stable")
    is_hit = labels[np.take_along_axis(neighbours, order, axis=1)] == labels[:, None]
    no_ties = np.zeros(is_hit.shape, dtype=bool)
    num_relevant = is_hit.sum(axis=1)
    recall, average_precision, r_precision = expected_scores(is_hit, no_ties, ks, num_relevant)
    expected = {f"recall@{k}": recall[n].mean() for n, k in enumerate(ks)}
    expected |= {"map@r": average_precision.mean(), "r_precision": r_precision.mean()}

    widths: list[int] = []
    real = retrieval.search_rows

    def counted(queries, rows, reference, k, *rest):
        widths.append(k)
        return real(queries, rows, reference, k, *rest)

    monkeypatch.setattr(retrieval, "search_rows", counted)
    prepared = retrieval.prepare_vectors(points.astype(np.float32), metric, "embeddings",
                                         "faiss")
    gaps = np.abs(np.diff(np.sort(prepared @ prepared[0])))  # the chain: gaps under 1e-6
    assert np.median(gaps) < 1e-6
    scores = retrieval_metrics(points, labels, ks, metric, nmi=False)
    assert scores == pytest.approx(expected, abs=1e-12)
    assert max(widths, default=0) < 599, widths  # no query followed the chain to the end


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_neighbours_a_few_ulps_apart_are_ordered_as_exact_arithmetic_orders_them(metric):
    """Each query has a relevant reference A and an irrelevant one B, which is nearer by one
    float32 ulp of the score in exact arithmetic on the given values: Recall@1 is 0. A fixed
    tolerance of 4 ulps let float32 sums of 512 terms, off by up to about 6 ulps each, put A
    first for some queries (about 10 of 4,000 for the cosine, 20 for the Euclidean distance).
    The queries are searched in blocks of 1,000, each against its own 2,000 references: every
    other reference is far from a query (cosine near 0), so it changes none of the first ranks,
    and each query with A and B tied is searched again at every reference of its call, a
    quarter as many as in one call of all 8,000. Blocks of 1,000 put A first as often with
    that fixed tolerance; much smaller ones, whose float32 sums faiss rounds otherwise, never
    did."""
    rng = np.random.default_rng(2)
    n, dim, block = 4000, 512, 1000
    eps = float(np.finfo(np.float32).eps)
    queries = rng.standard_normal((n, dim))
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    def at_cosine(cosine: float) -> np.ndarray:
        other = rng.standard_normal((n, dim))
        other -= (other * queries).sum(1, keepdims=True) * queries
        other /= np.linalg.norm(other, axis=1, keepdims=True)
        return (cosine * queries + np.sqrt(1 - cosine**2) * other).astype(np.float32)

    relevant, irrelevant = at_cosine(0.995), at_cosine(0.995 + eps)
    queries = queries.astype(np.float32)
    q, a, b = (x.astype(np.float64) for x in (queries, relevant, irrelevant))
    if metric == "cosine":
        b_nearer = ((q * b).sum(1) / np.linalg.norm(b, axis=1)
                    > (q * a).sum(1) / np.linalg.norm(a, axis=1))
    else:
        b_nearer = ((q - b) ** 2).sum(1) < ((q - a) ** 2).sum(1)
    assert b_nearer.sum() > 3000
    labels = np.arange(n)
    for start in range(0, n, block):
        rows = slice(start, start + block)
        searched = b_nearer[rows]
        scores = retrieval_metrics(queries[rows][searched], labels[rows][searched], (1,), metric,
                                   reference=np.concatenate([relevant[rows], irrelevant[rows]]),
                                   reference_labels=np.concatenate([labels[rows],
                                                                    n + labels[rows]]),
                                   nmi=False)
        assert scores["recall@1"] == 0.0, start


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_with_its_shortcuts_scores_as_the_exact_full_ranking(separate, seed):
    """Integer points on a small grid: many exactly equal distances, long tie groups, groups of
    only relevant or only irrelevant neighbours (not re-scored) and groups running past the
    retrieved neighbours that hold no relevant one (not searched further). Each query's scores
    must equal the tie expectation over its exact ranking of every reference, from integer
    distances."""
    rng = np.random.default_rng(seed)
    points = rng.integers(-3, 4, size=(300, 3)).astype(np.float64)
    labels = rng.integers(0, 30, size=300)
    if separate:
        queries, query_labels = points[:100], labels[:100]
        reference, reference_labels = points[100:], labels[100:]
    else:
        queries, query_labels, reference, reference_labels = points, labels, points, labels
    ks = (1, 2, 4, 8)
    rows = []
    for i, (query, label) in enumerate(zip(queries, query_labels, strict=True)):
        others = [j for j in range(len(reference)) if separate or j != i]
        # sums of squared small integers: exact in float64 whatever the order of the terms
        distances = ((reference[others] - query) ** 2).sum(axis=1).astype(np.int64).tolist()
        order = sorted(range(len(others)), key=lambda position: distances[position])
        hits = [reference_labels[others[position]] == label for position in order]
        ranked = [distances[position] for position in order]
        continues = [j > 0 and ranked[j] == ranked[j - 1] for j in range(len(ranked))]
        rows.append((hits, continues, sum(hits)))
    is_hit = np.array([hits for hits, _, _ in rows])
    continues = np.array([flags for _, flags, _ in rows])
    num_relevant = np.array([count for _, _, count in rows])
    recall, average_precision, r_precision = expected_scores(is_hit, continues, ks,
                                                             num_relevant)
    counted = num_relevant > 0
    expected = {f"recall@{k}": recall[i][counted].mean() for i, k in enumerate(ks)}
    expected["map@r"] = average_precision[counted].mean()
    expected["r_precision"] = r_precision[counted].mean()
    given = ({"reference": reference, "reference_labels": reference_labels} if separate
             else {})
    for chunk_size in (7, 4096):
        scores = retrieval_metrics(queries, query_labels, ks, "euclidean", nmi=False,
                                   chunk_size=chunk_size, **given)
        assert scores == pytest.approx(expected, abs=1e-12)


def test_ties_out_of_reach_of_the_last_rank_scored_are_cut_row_by_row():
    """A chain of float32 ties (each gap 0.9 of the tolerance) is cut where a neighbour after
    rank ``needed`` lies more than REACH (2) tolerances from the score at that rank, each row
    from its own rank ``needed``: columns nearer than that stay tied."""
    rng = np.random.default_rng(0)
    vectors = retrieval.prepare_vectors(rng.standard_normal((8, 4)).astype(np.float32),
                                        "cosine", "embeddings", "faiss")
    search = retrieval.RankedSearch(vectors[:2], vectors[2:], "cosine", False, 8)
    bound = float(search._largest_tolerance(np.arange(2)).max())
    scores = np.tile((0.5 - 0.9 * bound * np.arange(6)).astype(np.float32), (2, 1))
    indices = np.tile(np.arange(6), (2, 1))
    continues = search._continues(np.arange(2), scores, indices, np.array([1, 4]))
    # row 0 from rank 1 (0.5): ranks 2 and 3 within 1.8 tolerances, rank 4 on beyond 2.7
    # row 1 from rank 4: every later one within 1.8 tolerances
    np.testing.assert_array_equal(continues, [[False, True, True, False, False, False],
                                              [False, True, True, True, True, True]])


@pytest.mark.parametrize("metric", ["cosine", "euclidean"])
def test_tie_tolerance_is_the_documented_ulps_at_the_larger_neighbour_norm(metric):
    """tie_tolerance's docstring, element by element in float64: (TIE_ULPS (4) + the search's
    error, dim ulps for inner products and 2 (dim + 2) for squared L2) float32 ulps of
    |q| max(|r_{j-1}|, |r_j|), or |q|^2 + max(|r_{j-1}|, |r_j|)^2; column 0 at its own norm."""
    query_norms = np.array([1.0, 3.0])
    neighbour_norms = np.array([[2.0, 0.5, 1.0, 4.0], [1.0, 1.0, 0.25, 0.5]])
    dim = 7
    eps = float(np.finfo(np.float32).eps)
    ulps = 4.0 + (dim if metric == "cosine" else 2.0 * (dim + 2))
    expected = np.zeros((2, 4))
    for i in range(2):
        for j in range(4):
            largest = max(neighbour_norms[i, j], neighbour_norms[i, max(j - 1, 0)])
            scale = (query_norms[i] * largest if metric == "cosine"
                     else query_norms[i] ** 2 + largest**2)
            expected[i, j] = ulps * eps * scale
    np.testing.assert_allclose(tie_tolerance(query_norms, neighbour_norms, metric, dim),
                               expected, rtol=1e-15)


def literal_last_group_start(flags: list[bool]) -> int:
    """The first column of the tie group holding the last column (plain loop)."""
    start = len(flags) - 1
    while start > 0 and flags[start]:
        start -= 1
    return start


def test_last_group_settled_and_reaching_follow_their_definitions_at_the_boundaries():
    """Both searches' shortcuts, row by row against their docstrings in plain loops: a last
    group is settled when every relevant neighbour (R) is ranked before it, or when it starts
    at rank R or later after a hit; the group holding rank ``needed`` reaches the last
    column when it starts at or before it. Rows sit on each boundary (found == R, start == R,
    start == needed - 1), where a flipped comparison changes the answer."""
    rows = [  # hits, continues, R, needed; the last group starts at column 2 or 3
        ([1, 1, 0, 0, 0], [False, False, False, True, True], 2, 3),  # found 2 == R
        ([1, 0, 0, 0, 0], [False, False, False, True, True], 2, 3),  # start 2 == R, a hit
        ([0, 0, 0, 1, 0], [False, False, False, True, True], 2, 3),  # start 2 == R, no hit
        ([1, 0, 0, 1, 0], [False, False, False, True, True], 3, 3),  # start 2 < R
        ([0, 0, 0, 0, 0], [False, False, False, True, True], 0, 3),  # lone: R == found == 0
        ([1, 0, 1, 0, 0], [False, False, False, False, True], 1, 4),  # start 3 == needed - 1
        ([1, 0, 1, 0, 0], [False, False, False, False, True], 1, 3),  # start 3 > needed - 1
    ]
    is_hit = np.array([hits for hits, _, _, _ in rows], dtype=bool)
    continues = np.array([flags for _, flags, _, _ in rows])
    num_relevant = np.array([r for _, _, r, _ in rows])
    needed = np.array([n for _, _, _, n in rows])
    settled, reaches = [], []
    for hits, flags, r, wanted in rows:
        start = literal_last_group_start(flags)
        found = sum(hits[:start])
        settled.append(found >= r or (start >= r and found > 0))
        reaches.append(start <= wanted - 1)
    assert last_group_settled(is_hit, continues, num_relevant).tolist() == settled
    assert group_reaches_last_column(continues, needed).tolist() == reaches
    assert settled == [True, True, False, False, True, True, True]
    assert reaches == [True, True, True, True, True, True, False]


def test_choose_ratio_is_the_exact_fraction_to_the_last_digits_up_to_exact_taken():
    """C(misses, taken) / C(total, taken) against Python's exact integers: up to EXACT_TAKEN
    draws the product of correctly rounded factors is within a few ulps (the log-gamma form,
    beyond, is off by up to 1e-12 here), 0 where more are drawn than there are misses."""
    cases = [(490, 499, 8), (9, 10, 1), (0, 5, 1), (40, 60, 30), (200, 250, 100), (5, 5, 5),
             (98, 100, 2), (1000, 1200, 200), (3, 10, 4)]
    misses, total, taken = (np.array(column) for column in zip(*cases, strict=True))
    expected = [float(Fraction(math.comb(m, t), math.comb(n, t))) for m, n, t in cases]
    np.testing.assert_allclose(_choose_ratio(misses, total, taken), expected, rtol=2e-15,
                               atol=0)
    # beyond EXACT_TAKEN, clipped: log-gamma of 1e10 is off by more than this log ratio
    # (-3e-8), whose exponential had read 1.00003, a Recall@K below 0
    huge = _choose_ratio(np.array([10**10 - 1]), np.array([10**10]), np.array([300]))
    assert 0.0 <= huge[0] <= 1.0


def test_a_first_search_of_every_reference_is_not_repeated(monkeypatch):
    """Where the first search already retrieved every other reference (R = 4 of 5 points, all
    equal), its tie groups are complete: nothing is searched again, even though the group of
    every neighbour reaches the last column."""
    calls = []
    real = retrieval.search_rows
    monkeypatch.setattr(retrieval, "search_rows", lambda *a, **k: calls.append(1) or real(*a,
                                                                                         **k))
    scores = retrieval_metrics(np.ones((5, 3)), np.zeros(5, dtype=np.int64), ks=(1,), nmi=False)
    assert calls == []
    assert scores == {"recall@1": 1.0, "map@r": 1.0, "r_precision": 1.0}


def literal_cosine_scores(vectors: np.ndarray, labels: np.ndarray, ks) -> dict[str, float]:
    """Recall@K, MAP@R and R-Precision from float64 cosine similarities in plain loops (for
    sets without float64 ties)."""
    unit = vectors / np.sqrt((vectors**2).sum(axis=1, keepdims=True))
    totals = {**{f"recall@{k}": 0.0 for k in ks}, "map@r": 0.0, "r_precision": 0.0}
    counted = 0
    for i in range(len(vectors)):
        similar = sorted((-float(unit[i] @ unit[j]), j) for j in range(len(vectors)) if j != i)
        ranked = [labels[j] == labels[i] for _, j in similar]
        r = sum(ranked)
        if r == 0:
            continue
        counted += 1
        for k in ks:
            totals[f"recall@{k}"] += float(any(ranked[:k]))
        found, precision_sum = 0, 0.0
        for position in range(r):
            if ranked[position]:
                found += 1
                precision_sum += found / (position + 1)
        totals["map@r"] += precision_sum / r
        totals["r_precision"] += found / r
    return {name: total / counted for name, total in totals.items()}


def test_directions_closer_than_float32_can_tell_are_ordered_in_float64_on_both_paths():
    """Directions within 1e-4 rad of each other have cosines within float32's tie tolerance,
    so their order comes from the float64 re-scoring: on the first search's path (20 arcs of 3
    directions, each arc's group ending within the neighbours retrieved) and on the widened
    one (one arc of 40, every neighbour tied: searched again at every reference). Without the
    re-scoring either gave the tie expectation instead (Recall@1 1/3 for 2/3, 0.23 for 0.9)."""
    rng = np.random.default_rng(0)
    angles = np.sort(rng.uniform(0, 1e-4, 40))  # one arc
    one_arc, one_arc_labels = np.stack([np.cos(angles), np.sin(angles)], axis=1), \
        np.repeat(np.arange(4), 10)
    angles = (np.repeat(np.arange(20) * (2 * np.pi / 20) + 0.1, 3)
              + np.tile([0.0, 3e-5, 1e-4], 20))  # 20 arcs: two of a class, one of class 99
    arcs = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    arcs_labels = np.where(np.tile([True, True, False], 20), np.repeat(np.arange(20), 3), 99)
    for vectors, labels, recall_at_1 in ((one_arc, one_arc_labels, 0.9),
                                         (arcs, arcs_labels, 2 / 3)):
        expected = literal_cosine_scores(vectors, labels, (1, 4))
        assert expected["recall@1"] == pytest.approx(recall_at_1)
        assert retrieval_metrics(vectors, labels, (1, 4), "cosine", nmi=False) \
            == pytest.approx(expected, abs=1e-12)
