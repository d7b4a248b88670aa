"""Chart retrieval, chart clustering NMI, the piecewise linear probe and the chart plot.

Chart retrieval is checked against a brute force on the full manifold distance matrix of
Eq. 7 with one-hot memberships (literal loops, float64), scored by a literal implementation
of Recall@K, MAP@R and R-Precision in which neighbours at infinite distance never count.
"""

from __future__ import annotations

import doctest
import logging
import math
import warnings

import matplotlib.colors
import numpy as np
import pytest
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import normalized_mutual_info_score

from kdml import viz_charts as viz_charts_module
from kdml.errors import KdmlError
from kdml.evaluation import charts as charts_module
from kdml.evaluation.charts import (
    allocate_clusters,
    chart_clustering_nmi,
    chart_retrieval_metrics,
    piecewise_linear_accuracy,
)
from kdml.evaluation.retrieval import retrieval_metrics
from kdml.viz_charts import chart_figure, plot_charts

# ----------------------------------------------------------------- brute force


def full_manifold_distances(chart_coords, chart_index, n_charts, rng):
    """Eq. 7 on the full representation: every point gets coordinates in every chart (random
    in the charts it is not in) and a one-hot membership; sums over all charts."""
    num_points, dim = chart_coords.shape
    coords = rng.standard_normal((num_points, n_charts, dim))
    coords[np.arange(num_points), chart_index] = chart_coords
    q = np.eye(n_charts)[chart_index]
    # the same float64 values as Python lists: indexing an array for each of the 115,200 terms
    # below took most of the test's time
    coords, q = coords.tolist(), q.tolist()
    distances = [[0.0] * num_points for _ in range(num_points)]
    for a in range(num_points):
        for b in range(num_points):
            numerator = denominator = 0.0
            for i in range(n_charts):
                weight = q[a][i] * q[b][i]
                numerator += weight * math.dist(coords[a][i], coords[b][i])
                denominator += weight
            distances[a][b] = numerator / denominator if denominator else math.inf
    return distances


def brute_force_metrics(distances, labels, ks):
    """Musgrave et al.'s metrics from sorted rows; rel(i) = 0 at infinite distance."""
    ranked = []
    for a, row in enumerate(distances):
        neighbours = sorted((b for b in range(len(row)) if b != a), key=lambda b: row[b])
        relevant = [labels[b] == labels[a] and math.isfinite(row[b]) for b in neighbours]
        ranked.append((relevant, sum(labels[b] == labels[a] for b in range(len(row)) if b != a)))
    return metrics_of_ranked(ranked, ks)


def metrics_of_ranked(ranked, ks):
    """Recall@K, MAP@R and R-Precision from each query's (rel(1), rel(2), ...) and R; lone
    queries (R = 0) left out."""
    recalls = {k: [] for k in ks}
    average_precisions, r_precisions = [], []
    for relevant, num_relevant in ranked:
        if num_relevant == 0:  # lone query: left out
            continue
        for k in ks:
            recalls[k].append(float(any(relevant[:k])))
        hits, precision_sum = 0, 0.0
        for i in range(num_relevant):
            if relevant[i]:
                hits += 1
                precision_sum += hits / (i + 1)
        average_precisions.append(precision_sum / num_relevant)
        r_precisions.append(hits / num_relevant)
    results = {f"recall@{k}": sum(v) / len(v) for k, v in recalls.items()}
    results["map@r"] = sum(average_precisions) / len(average_precisions)
    results["r_precision"] = sum(r_precisions) / len(r_precisions)
    return results


def clustered_codes(num_points, n_charts, dim, num_classes, seed):
    """Codes with class structure: each class has a home chart and a centre; a third of the
    points land in random charts (classes split over charts, charts of 0, 1, 2 points)."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, num_classes, num_points)
    home = rng.integers(0, n_charts, num_classes)
    charts = np.where(rng.random(num_points) < 0.67, home[labels],
                      rng.integers(0, n_charts, num_points))
    centres = rng.standard_normal((num_classes, dim)) * 2.0
    coords = (centres[labels] + rng.standard_normal((num_points, dim))).astype(np.float32)
    return coords, charts, labels, rng


KS = (1, 2, 4, 8, 16, 32)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("chunk_size", [4096, 3])
def test_chart_retrieval_matches_brute_force(seed, chunk_size):
    coords, charts, labels, rng = clustered_codes(60, 7, 3, 9, seed)
    # a chart holding a single point and a chart id far from the others
    charts[0], charts[1] = 30, 31
    sizes = np.bincount(charts)
    assert (sizes[sizes > 0] < max(KS)).any()  # some queries have fewer than K chart mates
    distances = full_manifold_distances(coords.astype(np.float64), charts, 32, rng)
    expected = brute_force_metrics(distances, labels.tolist(), KS)
    got = chart_retrieval_metrics(coords, charts, labels, ks=KS, nmi=False,
                                  chunk_size=chunk_size)
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key


def test_one_chart_is_euclidean_retrieval():
    coords, _, labels, _ = clustered_codes(80, 1, 4, 10, seed=3)
    charts = np.zeros(80, dtype=np.int64)
    got = chart_retrieval_metrics(torch.from_numpy(coords), torch.from_numpy(charts),
                                  torch.from_numpy(labels), ks=(1, 4, 16), nmi=False)
    expected = retrieval_metrics(coords, labels, ks=(1, 4, 16), metric="euclidean", nmi=False)
    assert got == pytest.approx(expected, abs=1e-12)


def test_points_alone_in_their_chart_miss_everything():
    coords = np.array([[0.0], [0.1], [0.2], [0.3]], dtype=np.float32)
    labels = np.array([0, 0, 0, 0])
    got = chart_retrieval_metrics(coords, np.array([0, 1, 2, 3]), labels, ks=(1, 3), nmi=False)
    assert got == {"recall@1": 0.0, "recall@3": 0.0, "map@r": 0.0, "r_precision": 0.0}
    got = chart_retrieval_metrics(coords, np.array([0, 0, 1, 1]), labels, ks=(1, 3), nmi=False)
    # each query finds its one chart mate at rank 1 of R = 3: AP = (1/1) / 3
    assert got["recall@1"] == 1.0 and got["map@r"] == pytest.approx(1 / 3)


def test_chart_nmi_with_a_gallery_clusters_the_queries_and_the_gallery_together():
    """As retrieval_metrics does (and as documented): with reference_* the NMI clusters the
    queries and the gallery together (0.25 here), not the 12 queries alone (0.61). Coordinates
    in eighths: the search's shift by the gallery's median is exact, so the two agree to the
    bit."""
    rng = np.random.default_rng(0)
    coords, charts, labels = (rng.integers(-16, 16, size=(12, 3)) / 8.0, np.repeat([0, 1], 6),
                              np.arange(12) % 6)
    gallery, gallery_charts, gallery_labels = (rng.integers(-16, 16, size=(36, 3)) / 8.0,
                                               rng.integers(0, 2, 36), np.arange(36) % 6)
    got = chart_retrieval_metrics(coords, charts, labels, ks=(1,), reference_coords=gallery,
                                  reference_chart_index=gallery_charts,
                                  reference_labels=gallery_labels)["nmi"]
    assert got == chart_clustering_nmi(np.concatenate([coords, gallery]),
                                       np.concatenate([charts, gallery_charts]),
                                       np.concatenate([labels, gallery_labels]))
    assert got != chart_clustering_nmi(coords, charts, labels)


def test_chart_retrieval_rejects_bad_inputs():
    coords, charts, labels, _ = clustered_codes(20, 3, 2, 4, seed=4)
    with pytest.raises(KdmlError, match="chart_index"):
        chart_retrieval_metrics(coords, charts[:-1], labels)
    with pytest.raises(KdmlError, match="integers"):
        chart_retrieval_metrics(coords, charts.astype(float), labels)
    with pytest.raises(KdmlError, match="K="):
        chart_retrieval_metrics(coords, charts, labels, ks=(20,))
    with pytest.raises(KdmlError, match="no query"):
        chart_retrieval_metrics(coords, charts, np.arange(20), nmi=False)


# ----------------------------------------------------------------- NMI


@pytest.mark.parametrize(("sizes", "num_clusters", "expected"), [
    ([10, 5, 5], 4, [2, 1, 1]),
    ([1, 1, 1, 1], 2, [1, 1, 1, 1]),  # more charts than clusters: one each
    ([3, 100], 10, [1, 9]),
    ([2, 2], 10, [2, 2]),  # capped at the chart sizes
    ([5, 5, 5], 4, [2, 1, 1]),  # equal remainders: lower chart first
    # four charts under their share of one cluster raised to 1 overshoot 7 by 2: the charts
    # most over their share give one back each (13 points, 2 for 2.46, before 20: 3 for 3.78)
    ([1, 1, 1, 1, 20, 13], 7, [1, 1, 1, 1, 2, 1]),
    ([1, 1, 1, 1, 100], 3, [1, 1, 1, 1, 1]),  # down to max(K, charts) = 5
    # shares 1.67, 1.67, 0.67: floors (not rounded shares) first, then the largest remainders
    ([5, 5, 2], 4, [2, 1, 1]),
])
def test_allocate_clusters(sizes, num_clusters, expected):
    assert allocate_clusters(sizes, num_clusters).tolist() == expected


def test_allocate_clusters_properties():
    rng = np.random.default_rng(0)
    for _ in range(50):
        sizes = rng.integers(1, 30, rng.integers(1, 12))
        num_clusters = int(rng.integers(1, 80))
        allocation = allocate_clusters(sizes, num_clusters)
        assert (allocation >= 1).all() and (allocation <= sizes).all()
        assert allocation.sum() == min(max(num_clusters, len(sizes)), sizes.sum())


def test_nmi_with_one_cluster_per_chart_is_the_nmi_of_the_charts():
    rng = np.random.default_rng(5)
    charts = np.repeat([0, 4, 9], 12)
    labels = rng.integers(0, 3, 36)
    coords = rng.standard_normal((36, 2)).astype(np.float32)
    expected = normalized_mutual_info_score(labels, charts)
    assert chart_clustering_nmi(coords, charts, labels) == pytest.approx(expected, abs=1e-12)
    got = chart_retrieval_metrics(coords, charts, labels, ks=(1,), nmi=True)["nmi"]
    assert got == pytest.approx(expected, abs=1e-12)


def test_nmi_finds_separated_classes_inside_charts():
    rng = np.random.default_rng(6)
    labels = np.repeat(np.arange(4), 10)
    charts = labels // 2  # classes 0, 1 in chart 0; 2, 3 in chart 1
    centres = np.array([[-10.0, 0.0], [10.0, 0.0], [0.0, -10.0], [0.0, 10.0]])
    coords = (centres[labels] + 0.1 * rng.standard_normal((40, 2))).astype(np.float32)
    assert chart_clustering_nmi(coords, charts, labels) == pytest.approx(1.0)
    # the same codes in one chart are also separable, but charts that mix classes are not
    mixed = np.arange(40) % 2
    assert chart_clustering_nmi(coords, mixed, labels) < 0.9


# ----------------------------------------------------------------- piecewise linear probe


def probe_data(seed):
    """Charts 0, 1: mixed labels (logistic); 3: one label; 2: test points only (majority);
    5: training points only. Labels follow a slanted boundary y = 2x, which is linear in
    the codes but not in their sigmoids, so the two probes differ."""
    rng = np.random.default_rng(seed)
    train_codes = (3 * rng.standard_normal((120, 2))).astype(np.float32)
    test_codes = (3 * rng.standard_normal((60, 2))).astype(np.float32)
    train_labels = 2 * (train_codes[:, 1] > 2 * train_codes[:, 0]).astype(int)
    test_labels = 2 * (test_codes[:, 1] > 2 * test_codes[:, 0]).astype(int)
    train_labels[:5] = 7  # a rare third class
    train_index = rng.integers(0, 2, 120)
    test_index = rng.integers(0, 4, 60)
    train_index[5:15] = 3
    train_labels[5:15] = 2  # chart 3 holds label 2 only
    train_index[-3:] = 5
    return train_codes, train_index, train_labels, test_codes, test_index, test_labels


def hand_probe(data, sigmoid):
    """One LogisticRegression per chart, fitted by hand; returns (correct, kind per chart)."""
    train_x, train_i, train_y, test_x, test_i, test_y = data

    def features(x):
        x = x.astype(np.float64)
        return 1.0 / (1.0 + np.exp(-x)) if sigmoid else x

    labels, counts = np.unique(train_y, return_counts=True)
    majority = labels[np.argmax(counts)]
    correct, kinds = 0, {}
    for chart in sorted(set(train_i) | set(test_i)):
        tr, te = train_i == chart, test_i == chart
        if not te.any():
            kinds[chart] = "none"
            continue
        classes = np.unique(train_y[tr])
        if len(classes) >= 2:
            model = LogisticRegression(C=1.0, max_iter=1000).fit(features(train_x[tr]),
                                                                 train_y[tr])
            predicted, kinds[chart] = model.predict(features(test_x[te])), "logistic"
        elif len(classes) == 1:
            predicted, kinds[chart] = np.full(te.sum(), classes[0]), "single-class"
        else:
            predicted, kinds[chart] = np.full(te.sum(), majority), "majority"
        correct += int((predicted == test_y[te]).sum())
    return correct, kinds


@pytest.mark.parametrize("sigmoid", [True, False])
def test_piecewise_linear_accuracy_matches_per_chart_fits(sigmoid):
    data = probe_data(0)
    train_x, train_i, train_y, test_x, test_i, test_y = data
    got = piecewise_linear_accuracy(*data, sigmoid=sigmoid)
    correct, kinds = hand_probe(data, sigmoid)
    assert correct != hand_probe(data, not sigmoid)[0]  # the data tells the probes apart
    assert set(kinds.values()) == {"logistic", "single-class", "majority", "none"}
    assert got["accuracy"] == correct / len(test_y)
    assert got["num_correct"] == correct and got["num_test"] == len(test_y)
    for row in got["charts"]:
        chart = row["chart"]
        assert row["classifier"] == kinds[chart]
        assert row["num_train"] == (train_i == chart).sum()
        assert row["num_test"] == (test_i == chart).sum()
    assert sum(row["num_correct"] for row in got["charts"]) == correct


def literal_logistic_predictions(train_x, train_y, test_x, C):
    """argmax of the minimiser of C * sum_i CE_i + ||W||^2 / 2 (multinomial, bias
    unpenalised; for three or more classes: scikit-learn fits two with the binomial loss, one
    weight vector), written out point by point in float64 and minimised by Newton's method on
    its literal Hessian, to a Newton decrement of 1e-20 of the objective.

    Newton's steps do not depend on the codes' scale (a linear change of the parameters leaves
    them the same), where L-BFGS stops on an absolute gradient: scipy's L-BFGS-B on the raw
    codes, this reference until 2026-12-07, stopped 2% above the minimum on codes spread over
    1e-6 at C = 1e12 and scored 0.956 where the minimiser scores 0.889. The codes are centred
    (bias b + W mean: the same objective, the bias being unpenalised) so that no digits go to a
    common offset, and the first class's bias is held at 0 (adding one number to every bias
    changes nothing), which leaves the Hessian positive definite."""
    classes = np.unique(train_y)
    mean = train_x.mean(axis=0)
    x, test_centred = train_x - mean, test_x - mean
    (n, d), k = x.shape, len(classes)
    target = np.searchsorted(classes, train_y)
    # theta = (W row by row, biases of classes 1..k-1); logits of point i = jacobians[i] @ theta
    jacobians = [np.hstack([np.kron(np.eye(k), x[i]), np.eye(k)[:, 1:]]) for i in range(n)]
    penalised = np.concatenate([np.ones(k * d), np.zeros(k - 1)])

    def objective(theta):
        value = 0.5 * np.sum(penalised * theta * theta)
        for i in range(n):
            logits = jacobians[i] @ theta
            top = logits.max()
            value += C * (top + np.log(np.exp(logits - top).sum()) - logits[target[i]])
        return value

    def derivatives(theta):
        grad, hess = penalised * theta, np.diag(penalised)
        for i in range(n):
            logits = jacobians[i] @ theta
            p = np.exp(logits - logits.max())
            p /= p.sum()
            residual = p.copy()
            residual[target[i]] -= 1.0
            grad = grad + C * jacobians[i].T @ residual
            hess = hess + C * jacobians[i].T @ (np.diag(p) - np.outer(p, p)) @ jacobians[i]
        return grad, hess

    theta = np.zeros(k * d + k - 1)
    for _ in range(200):
        grad, hess = derivatives(theta)
        step = np.linalg.solve(hess, -grad)
        decrement, current = float(-grad @ step), objective(theta)
        if decrement <= 1e-20 * current:
            break
        size = 1.0  # backtracking; the last term lets rounding of the sum pass near the end
        while (objective(theta + size * step)
               > current - 0.25 * size * decrement + 1e-14 * current):
            size /= 2
        theta = theta + size * step
    else:
        raise AssertionError("Newton's method did not converge in 200 steps")
    w, b = theta[:k * d].reshape(k, d), np.concatenate([[0.0], theta[k * d:]])
    return classes[np.argmax(test_centred @ w.T + b, axis=1)]


def narrow_codes(seed, n, spread):
    """Three balanced classes at the corners of a triangle, shrunk to ``spread`` around 0.3."""
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(3), n // 3)
    corners = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    codes = 0.3 + spread * (corners[labels] + 0.4 * rng.standard_normal((len(labels), 2)))
    return codes.astype(np.float32).astype(np.float64), labels


@pytest.mark.parametrize(("spread", "C"), [(1e-3, 1.0), (1e-3, 1e6), (1e-6, 1.0), (1e-6, 1e12)])
def test_piecewise_linear_accuracy_is_that_of_the_penalised_optimum_for_narrow_codes(spread, C):
    """Codes spread over 1e-3, as a network's at initialisation: lbfgs's absolute tolerance
    stopped the plain fit at or near w = 0 (0.65 here at C = 1, chance on a real run). Over
    1e-6 (C = 1: the predictions rest on logits 1e-10 apart) L-BFGS-B on the raw codes, the
    reference before, stopped short too and read chance, 0.333, where the minimiser's is 0.917."""
    train_x, train_y = narrow_codes(0, 90, spread)
    test_x, test_y = narrow_codes(1, 60, spread)
    expected = np.mean(literal_logistic_predictions(train_x, train_y, test_x, C) == test_y)
    assert expected > 0.75  # the codes separate the classes
    got = piecewise_linear_accuracy(train_x, np.zeros(90, int), train_y, test_x,
                                    np.zeros(60, int), test_y, sigmoid=False, C=C)
    assert got["accuracy"] == expected


def test_piecewise_linear_accuracy_at_a_large_c_on_codes_spread_over_1e_6_is_the_minimisers():
    """60 codes spread over 1e-6 at C = 1e12 (1e-3 and 1e6 scaled alike): kdml's probe scores
    0.889, and scipy's L-BFGS-B on the raw codes 0.956, but that fit stopped 2% above the
    minimum (objective / C 27.460 against 26.873, gradient 2e-5 C, weights 16% off), where
    Newton's method, scikit-learn's newton-cg on the raw codes and lbfgs on centred ones all
    reach kdml's fit. Every test point gets the minimiser's prediction."""
    train_x, train_y = narrow_codes(0, 60, 1e-6)
    test_x, test_y = narrow_codes(1, 45, 1e-6)
    expected = literal_logistic_predictions(train_x, train_y, test_x, 1e12)
    assert np.mean(expected == test_y) == 40 / 45
    predicted = charts_module._fit_and_predict(train_x, train_y, test_x, 1e12, 1000)
    assert predicted.tolist() == expected.tolist()
    got = piecewise_linear_accuracy(train_x, np.zeros(60, int), train_y, test_x,
                                    np.zeros(45, int), test_y, sigmoid=False, C=1e12)
    assert got["accuracy"] == 40 / 45


def test_piecewise_linear_accuracy_converges_where_the_penalty_dominates():
    """120 codes spread over 2e-4 in 9 unbalanced classes (as a tiny run's test part): the
    penalty dominates, and rescaling by the spread alone left lbfgs 2,000 steps from the
    optimum (a ConvergenceWarning at max_iter 1000); the fit must reach it without one."""
    from sklearn.exceptions import ConvergenceWarning

    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(9), [52, 6, 4, 24, 4, 15, 1, 12, 2])
    centres = rng.standard_normal((9, 2))
    codes = 0.5 + 2e-4 * (centres[labels] + 0.4 * rng.standard_normal((len(labels), 2)))
    codes = codes.astype(np.float32).astype(np.float64)
    expected = np.mean(literal_logistic_predictions(codes, labels, codes, 1.0) == labels)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        got = piecewise_linear_accuracy(codes, np.zeros(len(labels), int), labels, codes,
                                        np.zeros(len(labels), int), labels, sigmoid=False)
    assert got["accuracy"] == expected


@pytest.mark.parametrize("factor", [1e-4, 1e3])
def test_piecewise_linear_accuracy_scales_with_its_penalty(factor):
    """The objective of codes a * x + b with C / a**2 is a**-2 times that of x with C: the same
    predictions, whatever the scale of the codes."""
    train_x, train_i, train_y, test_x, test_i, test_y = probe_data(2)
    reference = piecewise_linear_accuracy(train_x, train_i, train_y, test_x, test_i, test_y,
                                          sigmoid=False)
    moved = piecewise_linear_accuracy(factor * train_x + 5.0, train_i, train_y,
                                      factor * test_x + 5.0, test_i, test_y, sigmoid=False,
                                      C=1.0 / factor**2)
    assert moved["accuracy"] == reference["accuracy"]


@pytest.mark.parametrize("C", [1e-300, 1.0, 1.7e308])
def test_piecewise_linear_accuracy_of_codes_at_one_point_is_the_majority_of_their_chart(C):
    """No spread to rescale by (a collapsed embedding): only the intercept is fitted, also
    for a C whose product with the number of points overflows."""
    codes = np.full((6, 2), 0.25)
    labels = np.array([4, 4, 4, 1, 1, 2])
    got = piecewise_linear_accuracy(codes, np.zeros(6, int), labels, codes[:4],
                                    np.zeros(4, int), np.array([4, 4, 1, 2]), C=C)
    assert got["accuracy"] == 0.5 and got["charts"][0]["classifier"] == "logistic"


def test_piecewise_linear_accuracy_of_saturated_codes_warns_of_nothing():
    """A pre-sigmoid code below -709 (an MTriplet code, unclamped) had made NumPy warn of an
    overflow in exp on every scoring; the accuracy was right."""
    rng = np.random.default_rng(0)
    codes = rng.normal(size=(40, 2))
    codes[0, 0] = -800.0
    labels, charts = (codes[:, 1] > 0).astype(int), np.zeros(40, int)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = piecewise_linear_accuracy(codes, charts, labels, codes, charts, labels)
    with np.errstate(over="ignore"):
        squashed = 1.0 / (1.0 + np.exp(-codes))  # the literal sigmoid, its overflow silenced
    assert got == piecewise_linear_accuracy(squashed, charts, labels, squashed, charts, labels,
                                            sigmoid=False)


def codes_ulps_apart(ulps):
    """Labels 0, 0, 0, 1, 1 and 2-d float32 codes: 0.3 for label 0, ``ulps`` float32 ulps
    above it for label 1."""
    apart = np.float32(0.3)
    for _ in range(ulps):
        apart = np.nextafter(apart, np.float32(1.0))
    labels = np.array([0, 0, 0, 1, 1])
    codes = np.where(labels == 0, np.float32(0.3), apart).astype(np.float32)
    return np.stack([codes, codes], axis=1), labels


@pytest.mark.parametrize(("ulps", "expected"), [(1, 0.6), (4, 0.6), (8, 1.0)])
def test_piecewise_linear_accuracy_reads_no_rounding_noise(ulps, expected):
    """Codes a few float32 ulps apart, following the labels: up to 4 ulps (what retrieval
    scores as ties) the probe takes them as one point and predicts the majority label, 0;
    8 ulps apart it reads the labels (C large enough for weights of about 1e7 to pay)."""
    codes, labels = codes_ulps_apart(ulps)
    got = piecewise_linear_accuracy(codes, np.zeros(5, int), labels, codes, np.zeros(5, int),
                                    labels, sigmoid=False, C=1e18)
    assert got["accuracy"] == expected


def test_piecewise_linear_accuracy_takes_codes_exactly_tie_ulps_apart_as_one_point():
    """The bound is inclusive: codes exactly TIE_ULPS float32 epsilons of their largest
    magnitude apart (1 and 1 - 4 * 2**-23, exact in float32) are one point, and the probe
    predicts the majority label, 0, however large C."""
    from kdml.evaluation.ties import TIE_ULPS

    labels = np.array([0, 0, 0, 1, 1])
    apart = np.float32(1.0 - TIE_ULPS * float(np.finfo(np.float32).eps))
    assert float(1.0 - apart) == TIE_ULPS * float(np.finfo(np.float32).eps)
    column = np.where(labels == 0, np.float32(1.0), apart).astype(np.float32)
    codes = np.stack([column, column], axis=1)
    got = piecewise_linear_accuracy(codes, np.zeros(5, int), labels, codes, np.zeros(5, int),
                                    labels, sigmoid=False, C=1e18)
    assert got["accuracy"] == 0.6


def test_a_chart_without_training_points_predicts_the_smallest_of_tied_majority_labels():
    """Chart 1 has test points only: it predicts the training set's most frequent label, and
    between equally frequent ones (two 7s, two 3s) the smallest, 3."""
    train = np.array([[0.0], [1.0], [2.0], [3.0]])
    train_labels = np.array([7, 3, 7, 3])
    test = np.array([[0.5], [1.5], [2.5]])
    got = piecewise_linear_accuracy(train, np.zeros(4, int), train_labels, test,
                                    np.ones(3, int), np.array([3, 3, 7]))
    assert got["charts"][1]["classifier"] == "majority"
    assert got["num_correct"] == 2 and got["accuracy"] == 2 / 3


def test_a_chart_given_a_cluster_per_point_puts_equal_points_apart():
    """Chart 0's two points are equal and its share of the 3 clusters is 2 (the tied
    remainder goes to the lower chart): each is its own cluster, as documented, where k-means
    would put equal points in one cluster."""
    coords = np.array([[0.5, 0.5], [0.5, 0.5], [0.0, 1.0], [1.0, 0.0]])
    charts, labels = np.array([0, 0, 1, 1]), np.array([0, 1, 1, 2])
    assert allocate_clusters([2, 2], 3).tolist() == [2, 1]
    expected = normalized_mutual_info_score(labels, [0, 1, 2, 2])
    assert chart_clustering_nmi(coords, charts, labels) == pytest.approx(expected, abs=1e-12)


def test_piecewise_linear_accuracy_rejects_bad_inputs():
    train_x, train_i, train_y, test_x, test_i, test_y = probe_data(1)
    with pytest.raises(KdmlError, match="dimension"):
        piecewise_linear_accuracy(train_x, train_i, train_y, test_x[:, :1], test_i, test_y)
    with pytest.raises(KdmlError, match="test_labels"):
        piecewise_linear_accuracy(train_x, train_i, train_y, test_x, test_i, test_y[:-1])


# ----------------------------------------------------------------- plot


def test_plot_charts_writes_a_png(tmp_path):
    rng = np.random.default_rng(0)
    codes, charts, labels = rng.standard_normal((40, 2)), rng.integers(0, 3, 40), np.arange(40) % 4
    path = plot_charts(codes, charts, labels, tmp_path / "plots" / "charts.png",
                       images=torch.rand(40, 1, 8, 8), max_thumbnails=3)
    assert path == tmp_path / "plots" / "charts.png"
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(KdmlError, match="d = 3"):
        plot_charts(rng.standard_normal((40, 3)), charts, labels, tmp_path / "x.png")
    with pytest.raises(KdmlError, match="images"):
        plot_charts(codes, charts, labels, tmp_path / "x.png", images=torch.rand(39, 1, 8, 8))


@pytest.mark.parametrize("zoom", [1.0, 3.0])
def test_thumbnails_of_border_points_stay_inside_their_panel(zoom):
    # sigmoid coordinates saturate, so trained charts put many points on the border; their
    # thumbnails once covered the panel titles
    codes = np.array([[0.0, 30.0], [-30.0, -30.0], [30.0, 0.0], [0.0, 0.0]])
    figure = chart_figure(codes, np.zeros(4, dtype=int), np.arange(4),
                          images=np.zeros((4, 28, 28)), thumbnail_zoom=zoom)
    (axes,) = figure.axes
    assert len(axes.images) == 4
    (x_low, x_high), (y_low, y_high) = axes.get_xlim(), axes.get_ylim()
    assert x_low < 0.0 and x_high > 1.0 and y_low < 0.0 and y_high > 1.0
    inside = []
    for image in axes.images:
        assert image.get_clip_on() and image.get_clip_box() is not None
        left, right, bottom, top = image.get_extent()
        inside.append(x_low <= left and right <= x_high and y_low <= bottom and top <= y_high)
    # at zoom 1 every thumbnail shows whole; larger border ones reach out and are clipped
    assert all(inside) == (zoom == 1.0)


@pytest.mark.parametrize("module", [charts_module, viz_charts_module])
def test_docstring_examples(module):
    assert doctest.testmod(module, raise_on_error=False).failed == 0


def test_the_chart_legend_names_each_class_in_its_points_colour():
    rng = np.random.default_rng(1)
    codes, charts = rng.standard_normal((30, 2)), np.arange(30) % 5  # 5 panels: 3 columns
    labels = np.arange(30) % 3
    figure = chart_figure(codes, charts, labels, class_names={0: "T-shirt/top", 1: "Trouser"})
    figure.canvas.draw()  # the points get their colours when drawn
    legends = [axes.get_legend() for axes in figure.axes]
    # one legend, beside the first row's last panel
    assert [legend is not None for legend in legends] == [False, False, True, False, False]
    legend = legends[2]
    assert [text.get_text() for text in legend.get_texts()] == ["T-shirt/top", "Trouser", "2"]
    # each entry has the colour of its class's points
    for handle, label in zip(legend.legend_handles, range(3), strict=True):
        for axes in figure.axes:
            (points,) = axes.collections
            members = labels[charts == int(axes.get_title().split()[1])]
            drawn = points.get_facecolors()[members == label]
            assert np.allclose(drawn, matplotlib.colors.to_rgba(handle.get_color()))
    many = chart_figure(codes, charts, np.arange(30))  # 30 classes: no legend
    assert all(axes.get_legend() is None for axes in many.axes)


def test_chart_coordinates_far_out_are_drawn_on_the_border_without_a_warning():
    """exp(-c) overflowed for c below -709: numpy's RuntimeWarning, though the point landed
    right."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figure = chart_figure(np.array([[-800.0, 800.0], [0.0, 0.0], [1.0, -1.0]]),
                              np.zeros(3, dtype=int), np.arange(3))
    (axes,) = figure.axes
    assert axes.collections[0].get_offsets()[:2].tolist() == [[0.0, 1.0], [0.5, 0.5]]


@pytest.mark.parametrize(("n_charts", "n_classes"), [(1, 12), (1, 20), (2, 20), (4, 20)])
def test_the_chart_legend_and_titles_are_drawn_whole(n_charts, n_classes):
    """With one or two charts and long class names, or 15 to 20 classes, the legend had run
    past the picture's edges (classes 18 and 19 not shown) or a title had started left of it,
    and tight_layout had shrunk the panels to fit what it could."""
    rng = np.random.default_rng(0)
    codes, charts = rng.standard_normal((200, 2)), np.arange(200) % n_charts
    names = {c: f"{c:02d} an extremely long class name number {c}" for c in range(n_classes)}
    figure = chart_figure(codes, charts, np.arange(200) % n_classes, class_names=names)
    renderer = figure.canvas.get_renderer()
    width, height = figure.bbox.width, figure.bbox.height
    legends = [axes.get_legend() for axes in figure.axes if axes.get_legend() is not None]
    assert len(legends) == 1 and len(legends[0].get_texts()) == n_classes
    for artist in [axes.title for axes in figure.axes] + legends:
        box = artist.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= width and box.y1 <= height, artist
    for axes in figure.axes:  # the panels keep their size (3.2 inches a side, less margins)
        assert axes.get_window_extent(renderer).height > 2.4 * figure.dpi
        assert not axes.get_window_extent(renderer).overlaps(legends[0].get_window_extent(
            renderer))


@pytest.mark.parametrize("strength", [0, -1.0, math.inf])
def test_piecewise_linear_accuracy_refuses_a_regularization_that_is_not_positive(strength):
    """C = 0 used to surface as scikit-learn's InvalidParameterError."""
    codes = np.zeros((4, 2))
    with pytest.raises(KdmlError, match=r"^C \(the inverse L2 strength of the logistic "
                                        r"regressions\) must be a finite number > 0, got "):
        piecewise_linear_accuracy(codes, np.zeros(4, int), np.arange(4) % 2, codes,
                                  np.zeros(4, int), np.arange(4) % 2, C=strength)


def test_chart_retrieval_refuses_a_chunk_size_that_is_not_a_positive_integer():
    with pytest.raises(KdmlError, match=r"^chunk_size must be a positive integer, got 2.5$"):
        chart_retrieval_metrics(np.zeros((4, 2)), np.zeros(4, int), np.arange(4) % 2, ks=(1,),
                                chunk_size=2.5)


def brute_force_gallery_metrics(query_coords, query_charts, query_labels, gallery_coords,
                                gallery_charts, gallery_labels, ks):
    """Each query against every gallery point: Euclidean within its chart, infinity outside;
    R counts the same-class gallery points of every chart (float64 loops)."""
    ranked = []
    for a in range(len(query_coords)):
        row = [math.dist(query_coords[a], gallery_coords[b])
               if gallery_charts[b] == query_charts[a] else math.inf
               for b in range(len(gallery_coords))]
        neighbours = sorted(range(len(row)), key=lambda b: row[b])
        relevant = [gallery_labels[b] == query_labels[a] and math.isfinite(row[b])
                    for b in neighbours]
        ranked.append((relevant, sum(label == query_labels[a] for label in gallery_labels)))
    return metrics_of_ranked(ranked, ks)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("chunk_size", [4096, 3])
def test_chart_retrieval_in_a_gallery_matches_brute_force(seed, chunk_size):
    """Queries searched in a separate gallery (In-Shop): charts the gallery lacks, queries of
    classes the gallery lacks (lone), and fewer chart mates than K."""
    coords, charts, labels, _ = clustered_codes(90, 7, 3, 9, seed)
    charts[0] = 30  # a query chart with no gallery point
    query, gallery = slice(0, 40), slice(40, 90)
    ks = (1, 2, 4, 8, 16)
    expected = brute_force_gallery_metrics(
        coords[query].astype(np.float64), charts[query], labels[query].tolist(),
        coords[gallery].astype(np.float64), charts[gallery], labels[gallery].tolist(), ks)
    got = chart_retrieval_metrics(coords[query], charts[query], labels[query], ks=ks, nmi=False,
                                  chunk_size=chunk_size, reference_coords=coords[gallery],
                                  reference_chart_index=charts[gallery],
                                  reference_labels=labels[gallery])
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
    with pytest.raises(KdmlError, match="given together"):
        chart_retrieval_metrics(coords, charts, labels, reference_coords=coords)


@pytest.mark.parametrize("view", [lambda x: x, lambda x: x[:], lambda x: torch.from_numpy(x)],
                         ids=["itself", "slice", "tensor sharing its memory"])
def test_chart_retrieval_refuses_the_query_set_as_its_gallery(view):
    """The queries' own coordinates as the gallery: each query found itself first (Recall@1 of
    1 on codes whose classes are random), as retrieval_metrics already refused."""
    coords, charts, labels, _ = clustered_codes(60, 7, 3, 6, 0)
    queries = view(coords)
    with pytest.raises(KdmlError, match="^reference_coords is the query set itself, where each "
                                        "query would retrieve itself; leave the reference_"):
        chart_retrieval_metrics(queries, charts, labels, reference_coords=view(coords),
                                reference_chart_index=charts, reference_labels=labels)


def test_chart_retrieval_warns_of_a_gallery_equal_to_the_queries():
    """An equal copy (coordinates, charts and labels) is searched, with a warning: a gallery
    can duplicate the queries. One differing chart is no copy."""
    rng = np.random.default_rng(0)
    coords = rng.standard_normal((60, 2)).astype(np.float32)
    charts, labels = rng.integers(0, 3, 60), rng.integers(0, 6, 60)
    with pytest.warns(UserWarning, match="^the reference_\\* arguments hold the same "
                                         "coordinates, charts and labels as the queries") as got:
        scores = chart_retrieval_metrics(coords, charts, labels, ks=(1,), nmi=False,
                                         reference_coords=coords.copy(),
                                         reference_chart_index=charts.copy(),
                                         reference_labels=labels.copy())
    assert len(got) == 1 and got[0].filename == __file__ and scores["recall@1"] == 1.0
    other_charts = charts.copy()
    other_charts[0] = (charts[0] + 1) % 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        chart_retrieval_metrics(coords, charts, labels, ks=(1,), nmi=False,
                                reference_coords=coords.copy(),
                                reference_chart_index=other_charts, reference_labels=labels)


def test_thumbnails_are_at_most_max_thumbnails_per_panel_and_drawn_in_range(caplog):
    codes, charts = np.zeros((10, 2)), np.array([0] * 7 + [1] * 3)
    images = np.full((10, 3, 4, 4), 2.0)  # out of [0, 1]: clipped, without matplotlib's
    images[:, :, :2] = -1.0  # "Clipping input data to the valid range" warning
    with caplog.at_level(logging.WARNING):
        figure = chart_figure(codes, charts, np.arange(10) % 2, images=images, max_thumbnails=2)
    assert [len(axes.images) for axes in figure.axes] == [2, 2]
    assert caplog.records == []
    drawn = [image.get_array() for axes in figure.axes for image in axes.images]
    assert all(array.min() == 0.0 and array.max() == 1.0 for array in drawn)
    none = chart_figure(codes, charts, np.arange(10) % 2, images=images, max_thumbnails=0)
    assert [len(axes.images) for axes in none.axes] == [0, 0]


@pytest.mark.parametrize(("setting", "message"), [
    ({"max_thumbnails": True}, "max_thumbnails must be an integer >= 0, got True"),
    ({"thumbnail_zoom": 0.0}, "thumbnail_zoom must be a finite number > 0, got 0.0"),
    ({"thumbnail_zoom": math.inf}, "thumbnail_zoom must be a finite number > 0, got inf"),
])
def test_chart_thumbnail_settings_out_of_range_are_refused(setting, message):
    with pytest.raises(KdmlError, match=f"^{message}$"):
        chart_figure(np.zeros((4, 2)), np.zeros(4, int), np.arange(4),
                     images=np.zeros((4, 5, 5)), **setting)


def test_images_of_four_channels_are_refused_for_the_charts():
    with pytest.raises(KdmlError, match=r"1 or 3 channels, got shape \(4, 5, 5, 4\)"):
        chart_figure(np.zeros((4, 2)), np.zeros(4, int), np.arange(4),
                     images=np.zeros((4, 5, 5, 4)))


def test_ten_classes_take_the_ten_colour_map_and_eleven_the_twenty():
    codes, charts = np.zeros((11, 2)), np.zeros(11, int)
    ten = chart_figure(codes, charts, np.arange(11) % 10)
    eleven = chart_figure(codes, charts, np.arange(11))
    assert ten.axes[0].collections[0].get_cmap().name == "tab10"
    assert eleven.axes[0].collections[0].get_cmap().name == "tab20"


def test_a_grayscale_thumbnail_is_drawn_gray_and_upright_around_its_point():
    figure = chart_figure(np.zeros((1, 2)), np.zeros(1, int), np.zeros(1, int),
                          images=np.zeros((1, 4, 4)))
    (image,) = figure.axes[0].images
    assert image.get_cmap().name == "gray"
    left, right, bottom, top = image.get_extent()
    assert left < 0.5 < right and bottom < 0.5 < top


def test_each_panel_s_title_counts_its_own_points_and_its_frame_is_the_unit_square():
    figure = chart_figure(np.zeros((6, 2)), np.array([0, 0, 0, 2, 2, 3]), np.zeros(6, int))
    assert [axes.get_title() for axes in figure.axes] == ["chart 0 (3 points)",
                                                          "chart 2 (2 points)",
                                                          "chart 3 (1 point)"]
    for axes in figure.axes:
        (frame,) = axes.patches
        assert (frame.get_xy(), frame.get_width(), frame.get_height()) == ((0, 0), 1, 1)


def test_the_thumbnails_drawn_are_chosen_by_the_seed():
    codes, charts = np.random.default_rng(0).standard_normal((10, 2)), np.zeros(10, int)

    def drawn(seed):
        figure = chart_figure(codes, charts, np.arange(10) % 2, images=np.zeros((10, 4, 4)),
                              max_thumbnails=2, seed=seed)
        return sorted(image.get_extent() for image in figure.axes[0].images)

    assert drawn(0) == drawn(0)
    assert drawn(0) != drawn(1)


def test_classes_of_any_label_values_get_distinct_colours():
    """Colours go by a class's rank, not its label: labels 10, 20 and 30 are three colours."""
    figure = chart_figure(np.zeros((3, 2)), np.zeros(3, int), np.array([10, 20, 30]))
    figure.canvas.draw()  # the points get their colours when drawn
    colours = figure.axes[0].collections[0].get_facecolors()
    assert len({tuple(colour) for colour in colours}) == 3


@pytest.mark.parametrize("shape", [(3, 4, 4), (1, 4, 4), (4, 4)])
def test_thumbnails_loaded_one_at_a_time_take_any_documented_shape(shape):
    figure = chart_figure(np.zeros((2, 2)), np.zeros(2, int), np.arange(2),
                          images=lambda index: np.full(shape, 0.5))
    assert len(figure.axes[0].images) == 2


def test_a_legend_taller_than_its_panels_heightens_the_figure():
    """Class names of several lines make a legend taller than one row of panels: the figure
    grows for it, the panel keeping its size and its place under the figure's top."""
    names = {c: "\n".join(f"{c}abcdefg") for c in range(12)}
    figure = chart_figure(np.zeros((12, 2)), np.zeros(12, int), np.arange(12),
                          class_names=names)
    renderer = figure.canvas.get_renderer()
    width, height = figure.get_size_inches()
    assert height > 3.2
    legend = figure.axes[0].get_legend().get_window_extent(renderer)
    assert legend.y0 >= 0 and legend.y1 <= figure.bbox.height  # drawn whole: it had been cut
    panel = figure.axes[0].get_position()
    assert (1 - panel.y1) * height < 0.5 and panel.height * height < 3.2
