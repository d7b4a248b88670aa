r"""Evaluation of Atlas representations (Korman, Eq. 3): retrieval under the manifold distance
and the piecewise linear probe of Table 2.

At evaluation time a point is its compressed code :math:`(c(x), i)`: the pre-sigmoid
coordinates of its most probable chart and that chart's index. With these one-hot memberships
the manifold distance of Eq. 7 is

.. math::
    d_{\mathcal{M}}(x, y) = \begin{cases} \|c(x) - c(y)\| & i(x) = i(y) \\
    \infty & \text{otherwise,} \end{cases}

so retrieval decomposes into one exact Euclidean k-NN search per chart
(:func:`chart_retrieval_metrics`) and classification into one linear classifier per chart
(:func:`piecewise_linear_accuracy`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from kdml.checks import is_finite_number, is_positive_int
from kdml.errors import KdmlError
from kdml.evaluation.clustering import kmeans_assign, nmi_score
from kdml.evaluation.knn import (
    DEFAULT_CHUNK_SIZE,
    as_float32_matrix,
    check_positive_int,
    equal_values,
    host_array,
    prepare_pair,
    prepare_vectors,
)
from kdml.evaluation.labels import as_label_vector
from kdml.evaluation.rescoring import ExactScores
from kdml.evaluation.retrieval import (
    RankedSearch,
    _RetrievalScores,
    check_ks,
    index_labels,
    refuse_query_set_as_reference,
    warn_of_query_copy,
)
from kdml.evaluation.ties import TIE_ULPS

__all__ = [
    "allocate_clusters",
    "chart_clustering_nmi",
    "chart_retrieval_metrics",
    "piecewise_linear_accuracy",
]


def _chart_blocks(chart_index: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The points sorted by chart (stable) and the ``(chart, start, stop)`` of each block."""
    order = np.argsort(chart_index, kind="stable")
    sorted_charts = chart_index[order]
    starts = np.flatnonzero(np.r_[True, sorted_charts[1:] != sorted_charts[:-1]])
    stops = np.r_[starts[1:], len(order)]
    blocks = [(int(sorted_charts[a]), int(a), int(b)) for a, b in zip(starts, stops, strict=True)]
    return order, blocks


def chart_retrieval_metrics(
    chart_coords: Any,
    chart_index: Any,
    labels: Any,
    ks: Sequence[int] = (1, 2, 4, 8),
    nmi: bool = True,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    reference_coords: Any | None = None,
    reference_chart_index: Any | None = None,
    reference_labels: Any | None = None,
) -> dict[str, float]:
    r"""Recall@K, MAP@R, R-Precision and NMI under the manifold distance with argmax charts.

    Leave-one-out retrieval over the whole set, as
    :func:`~kdml.evaluation.retrieval.retrieval_metrics`, but a point's neighbours are only
    the other points of its own chart, ranked by Euclidean distance of their pre-sigmoid
    coordinates (:math:`d_0` of MTriplet); every point of another chart is at :math:`+\infty`.
    With ``reference_*`` (a gallery, as In-Shop's) the points are queries searched in that
    separate set instead, under the same rules.
    The metrics are those of ``retrieval_metrics`` (Musgrave et al. 2020) with:

    - **Neighbours at infinity are misses.** A query whose chart holds :math:`m - 1 < K`
      other points has :math:`m - 1` finite neighbours; ranks :math:`m, m+1, \dots` are all
      at :math:`+\infty`, tied, so no specific point is retrieved there and
      :math:`\mathrm{rel}(i) = 0`. Same-class points in other charts are never retrieved.
    - **R counts every same-class reference of the whole set** (query excluded), not only
      those in the query's chart. Then MAP@R and R-Precision penalise a class split over
      several charts, as the infinite distance does, and each query has the same R as in the
      Euclidean evaluation of a baseline, so the numbers are comparable. (Counting only the
      same-chart references would give a perfect score to a model that puts every point alone
      with its nearest same-class point in a chart.) This equals the brute-force definition:
      sort the row of the full :math:`N \times N` manifold distance matrix and count
      :math:`\mathrm{rel}(i) = 1` only for finite distances.
    - Lone queries (:math:`R = 0`: the only member of their class) are left out of the
      averages, as in ``retrieval_metrics``.

    Exact and memory-light: points are grouped by chart and each chart runs one chunked exact
    faiss search (:class:`~kdml.evaluation.retrieval.RankedSearch`) with, per query,
    :math:`\min(\max(K_{max}, R), m - 1)` neighbours, its float32 near-ties re-scored in
    float64 as in ``retrieval_metrics``; nothing of size :math:`N^2` or :math:`n N^2` is
    built.

    NMI (``nmi=True``): see :func:`chart_clustering_nmi`, a k-means clustering that respects
    the manifold distance (no cluster spans two charts).

    Args:
        chart_coords: :math:`(N, d)` pre-sigmoid coordinates of each point's argmax chart
            (``compressed_code`` / ``method.chart_codes``), array or tensor.
        chart_index: :math:`(N,)` integer chart of each point.
        labels: :math:`(N,)` integer class labels.
        ks: the K of Recall@K, each at most :math:`N - 1` (the reference's size with one).
        nmi: also compute :func:`chart_clustering_nmi` (of the queries, and of the reference
            with them where one is given, as ``retrieval_metrics`` does).
        chunk_size: queries per k-NN search.
        reference_coords, reference_chart_index, reference_labels: a separate reference
            set :math:`(G, d)`, :math:`(G,)`, :math:`(G,)`, given together, or none. The
            query set itself (``chart_coords`` or a view of its memory) is refused, and a copy
            equal in coordinates, charts and labels warned of, as in ``retrieval_metrics``.

    Returns:
        ``{"recall@K": ..., "map@r": ..., "r_precision": ..., "nmi": ...}`` (floats in
        :math:`[0, 1]`; ``"nmi"`` only when ``nmi=True``), the keys of ``retrieval_metrics``.

    Raises:
        KdmlError: on mismatched shapes, non-integer labels or chart indices, non-finite or
            empty coordinates, invalid ``ks``, reference coordinates that are the query set
            itself, or when every query is lone.

    Example:
        >>> coords = np.array([[0.0], [0.1], [5.0], [0.0], [0.2]])
        >>> charts = np.array([0, 0, 0, 1, 1])
        >>> labels = np.array([0, 0, 1, 1, 0])
        >>> chart_retrieval_metrics(coords, charts, labels, ks=(1,), nmi=False)["recall@1"]
        0.4
    """
    check_positive_int("chunk_size", chunk_size)
    given = [part is not None for part in (reference_coords, reference_chart_index,
                                           reference_labels)]
    if any(given) and not all(given):
        raise KdmlError("reference_coords, reference_chart_index and reference_labels must be "
                        "given together")
    same_set = not any(given)
    if not same_set:
        refuse_query_set_as_reference(chart_coords, reference_coords, "reference_coords",
                                      "the reference_* arguments")
    if same_set:
        vectors = reference_vectors = prepare_vectors(chart_coords, "euclidean", "chart_coords")
    else:  # shifted and scaled alike
        vectors, reference_vectors = prepare_pair(chart_coords, reference_coords, "euclidean",
                                                  ("chart_coords", "reference_coords"))
    num_points = len(vectors)
    charts = as_label_vector(chart_index, "chart_index", num_points)
    label_vector = as_label_vector(labels, "labels", num_points)
    if same_set:
        reference_charts, reference_label_vector = charts, None
    else:
        reference_charts = as_label_vector(reference_chart_index, "reference_chart_index",
                                           len(reference_vectors))
        reference_label_vector = as_label_vector(reference_labels, "reference_labels",
                                                 len(reference_vectors))
        if (np.array_equal(label_vector, reference_label_vector)
                and np.array_equal(charts, reference_charts)
                and equal_values(chart_coords, reference_coords)):
            warn_of_query_copy("the reference_* arguments hold the same coordinates, charts "
                               "and labels", "the reference_* arguments", stacklevel=2)
    ks = check_ks(ks, len(reference_vectors) - int(same_set))
    label_index = index_labels(label_vector, reference_label_vector)
    codes, num_relevant = label_index.query_codes, label_index.num_relevant
    reference_codes = label_index.reference_codes
    if not (num_relevant > 0).any():
        raise KdmlError(
            "no query has another sample of its class in the set, so recall@K, map@r and "
            "r_precision are undefined"
        )

    order, blocks = _chart_blocks(charts)
    scores = _RetrievalScores(num_points, ks)  # rows in chart-sorted order
    # the coordinates as given, for the float64 re-scoring of float32 ties
    given_coords = host_array(chart_coords)
    given_reference = given_coords if same_set else host_array(reference_coords)
    for chart, start, stop in blocks:
        members = order[start:stop]
        # Each query scores max(K_max, R) ranks; only the chart's references are finite.
        ranks_scored = np.maximum(max(ks), num_relevant[members])
        references = members if same_set else np.flatnonzero(reference_charts == chart)
        finite = len(references) - int(same_set)
        if finite == 0:  # nothing else in its chart: every neighbour is at infinity
            no_hits = np.zeros((len(members), int(ranks_scored.max())), dtype=bool)
            scores.add(slice(start, stop), no_hits, num_relevant[members])
            continue
        exact = ExactScores(given_coords[members],
                            None if same_set else given_reference[references], "euclidean")
        search = RankedSearch(vectors[members], reference_vectors[references], "euclidean",
                              same_set, chunk_size, exact)
        for rows, ranked in search.ranked(np.minimum(ranks_scored, finite)):
            queries = members[rows]
            is_hit = reference_codes[references[ranked.indices]] == codes[queries, None]
            # Ranks beyond the chart are at infinity: misses, in no finite tie group.
            missing = int(ranks_scored[rows].max()) - is_hit.shape[1]
            if missing > 0:
                is_hit = np.pad(is_hit, ((0, 0), (0, missing)))
                continues = np.pad(ranked.continues, ((0, 0), (0, missing)))
            else:
                continues = ranked.continues
            scores.add(start + rows, is_hit, num_relevant[queries], continues)

    results = scores.averages(num_relevant[order] > 0)
    if nmi and reference_label_vector is None:
        results["nmi"] = chart_clustering_nmi(vectors, charts, label_vector)
    elif nmi:  # the queries and the reference together, as retrieval_metrics
        results["nmi"] = chart_clustering_nmi(
            np.concatenate([vectors, reference_vectors]),
            np.concatenate([charts, reference_charts]),
            np.concatenate([label_vector, reference_label_vector]))
    return results


def allocate_clusters(chart_sizes: Sequence[int], num_clusters: int) -> np.ndarray:
    r"""Number of k-means clusters per chart for :func:`chart_clustering_nmi`.

    Proportional to the chart sizes :math:`m_c`, by largest remainder: chart :math:`c` gets
    :math:`\lfloor K m_c / N \rfloor` clusters, at least 1 and at most :math:`m_c`, and the
    clusters still missing to reach :math:`K` go one by one to the charts with the largest
    fractional part :math:`K m_c / N - \lfloor K m_c / N \rfloor` that still have room. The
    total is :math:`\max(K, \text{number of charts})` (capped at :math:`N`): where raising
    small charts to 1 overshoots it, the charts given most beyond their share
    :math:`K m_c / N` give one back each, in turn, down to 1.

    Example:
        >>> allocate_clusters([10, 5, 5], 4).tolist()
        [2, 1, 1]
    """
    sizes = np.asarray(chart_sizes, dtype=np.int64)
    if sizes.ndim != 1 or len(sizes) == 0 or (sizes < 1).any() or num_clusters < 1:
        raise KdmlError("allocate_clusters needs positive chart sizes and num_clusters >= 1")
    shares = num_clusters * sizes / sizes.sum()
    allocation = np.clip(np.floor(shares).astype(np.int64), 1, sizes)
    remainders = shares - np.floor(shares)
    total = min(max(num_clusters, len(sizes)), int(sizes.sum()))
    # A chart smaller than its share of one cluster still gets one (a cluster never spans two
    # charts): the extra ones come back from the charts most over their share, or the NMI
    # was scored with more clusters than labels (9 for 5 classes and 7 charts), which
    # raises it
    while int(allocation.sum()) > total:
        excess = np.where(allocation > 1, allocation - shares, -np.inf)
        allocation[int(np.argmax(excess))] -= 1
    while (missing := num_clusters - int(allocation.sum())) > 0:
        has_room = np.flatnonzero(allocation < sizes)
        if len(has_room) == 0:
            break
        # stable: equal remainders go to the lower chart first
        chosen = has_room[np.argsort(-remainders[has_room], kind="stable")][:missing]
        allocation[chosen] += 1
        remainders[chosen] = -1.0  # a chart gets at most one extra per round
    return allocation


def chart_clustering_nmi(chart_coords: Any, chart_index: Any, labels: Any, niter: int = 20,
                         seed: int = 0) -> float:
    r"""NMI of a clustering of the compressed codes that respects the manifold distance.

    Under :math:`d_{\mathcal{M}}` points of different charts are infinitely far apart, so
    any finite-cost k-means clustering keeps each cluster inside one chart. With :math:`K`
    the number of distinct labels, the :math:`K` clusters are split over the non-empty charts
    by :func:`allocate_clusters` (proportional to chart size, at least one per chart); each
    chart then runs seeded faiss k-means on its pre-sigmoid coordinates (all points used, as
    :func:`~kdml.evaluation.clustering.clustering_nmi`), and the (chart, cluster) assignments
    are scored against the labels with ``sklearn.metrics.normalized_mutual_info_score``.
    A chart with one cluster is one cluster; a chart with as many clusters as points puts each
    point in its own.

    Args:
        chart_coords: :math:`(N, d)` pre-sigmoid coordinates of the argmax charts.
        chart_index: :math:`(N,)` integer charts.
        labels: :math:`(N,)` integer labels.
        niter: k-means iterations.
        seed: k-means seed.

    Returns:
        NMI in :math:`[0, 1]`.
    """
    vectors, _ = as_float32_matrix(chart_coords, "chart_coords")
    charts = as_label_vector(chart_index, "chart_index", len(vectors))
    label_vector = as_label_vector(labels, "labels", len(vectors))
    order, blocks = _chart_blocks(charts)
    allocation = allocate_clusters([stop - start for _, start, stop in blocks],
                                   len(np.unique(label_vector)))
    assignments = np.empty(len(vectors), dtype=np.int64)
    offset = 0
    for (_, start, stop), num_clusters in zip(blocks, allocation, strict=True):
        members = order[start:stop]
        if num_clusters == 1:
            local = np.zeros(len(members), dtype=np.int64)
        elif num_clusters == len(members):
            local = np.arange(len(members))
        else:
            local = kmeans_assign(vectors[members], int(num_clusters), niter, seed)
        assignments[members] = offset + local
        offset += int(num_clusters)
    return nmi_score(label_vector, assignments)


def _at_one_point(codes: np.ndarray) -> bool:
    """Whether float32 ``codes`` ``(N, d)`` differ by no more than rounding: in every coordinate
    by at most :data:`~kdml.evaluation.ties.TIE_ULPS` float32 ulps of the largest magnitude,
    what rounding alone moves a value (retrieval's tie tolerance adds its sums' rounding to it:
    :func:`~kdml.evaluation.ties.tie_tolerance`)."""
    magnitude = float(np.abs(codes).max(initial=0.0))
    spread = np.ptp(codes.astype(np.float64), axis=0).max(initial=0.0)
    return bool(spread <= TIE_ULPS * float(np.finfo(np.float32).eps) * magnitude)


def _fit_and_predict(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, C: float,
                     max_iter: int) -> np.ndarray:
    r"""Fit ``C * sum(loss) + ||w||^2 / 2`` on ``train_x`` and predict ``test_x``, well conditioned.

    The fit runs on :math:`x' = (x - \mu) / t` (:math:`\mu` the training mean) with
    ``C * t**2``: then :math:`w = w'/t` and the objective is :math:`t^2` times the original
    one, so the minimiser and the predictions are the same for any :math:`t > 0` (lbfgs leaves
    the intercept unpenalised, so centring is free). Why: lbfgs stops when every gradient
    component is below ``tol``, an absolute number. Coordinates that spread over about 1e-3 (a
    network as initialised) have a gradient below scikit-learn's default 1e-4 at w = 0, so
    the plain fit stopped before its first step, every class tied, and the probe read chance
    although the codes separate the classes.

    :math:`t = \max(s, 1/\sqrt{C n})`, :math:`s` the training points' standard deviation (one
    scalar) and :math:`n` their number: scikit-learn's objective is the mean loss plus
    :math:`\lVert w' \rVert^2 / (2 C t^2 n)`, so the weights' curvature, about :math:`(s/t)^2`
    from the loss plus :math:`1 / (C t^2 n)` from the penalty, stays within a small factor of
    the intercept's, whether the loss or the penalty dominates (``t = s`` alone made the
    penalty's curvature about 1e6 times the intercept's on 120 codes spread over 2e-4, and
    lbfgs took 2,600 steps). ``tol=1e-8`` then reaches the minimiser (the predictions of a fit to
    1e-10 on the raw codes) in about the plain fit's time.
    """
    from sklearn.linear_model import LogisticRegression  # here: see clustering.nmi_score

    mean = train_x.mean(axis=0)
    centred = train_x - mean
    # 1/sqrt(C)/sqrt(n), not 1/sqrt(C n): C * n overflows for C near the float maximum
    scale = max(float(centred.std()), 1.0 / math.sqrt(C) / math.sqrt(len(train_x)))
    classifier = LogisticRegression(C=C * scale**2, tol=1e-8, max_iter=max_iter)
    classifier.fit(centred / scale, train_y)
    return classifier.predict((test_x - mean) / scale)


def piecewise_linear_accuracy(
    train_codes: Any,
    train_index: Any,
    train_labels: Any,
    test_codes: Any,
    test_index: Any,
    test_labels: Any,
    sigmoid: bool = True,
    C: float = 1.0,
    max_iter: int = 1000,
) -> dict[str, Any]:
    r"""Piecewise linear evaluation (Korman, Sec. 3.1, Table 2): one linear classifier per chart.

    Every test point is classified by the classifier of its argmax chart, fitted on the
    training points assigned to that chart: a scikit-learn ``LogisticRegression(C=C,
    max_iter=max_iter)`` (lbfgs; the multinomial loss, the binomial one for a chart of two
    labels) on :math:`\phi = \sigma(\text{code})` in
    :math:`[0, 1]^d`, the chart coordinates of Eq. 3 (the authors' probe also sees sigmoid
    coordinates). Pass ``sigmoid=False`` to fit on the codes as given, e.g. the
    :math:`\mathbb{R}^d` embeddings of a Euclidean baseline with every ``index`` 0 (one chart:
    the ordinary linear probe).

    Each fit minimises :math:`C \sum_i \ell_i + \lVert w \rVert^2 / 2` (the intercept
    unpenalised) in centred, rescaled coordinates with the same minimiser, so that codes
    spread over only about 1e-3 are fitted too (a plain fit stopped at w = 0 there and read
    chance: ``docs/findings.md``). A chart whose training codes differ by no more than float32
    rounding (:func:`_at_one_point`, as a collapsed embedding's) gets the intercept alone: its
    most frequent training label, read from no rounding noise.

    Charts without a fitted classifier:

    - a chart whose training points all share one label predicts that label;
    - a chart with test points but no training points predicts the majority label of the
      whole training set (the smallest such label on ties): the prior is the only
      information the training set gives about an unseen chart.

    Accuracy is ``correct / all test points``, so every test point counts once whichever
    case its chart falls in.

    Args:
        train_codes: :math:`(N_{tr}, d)` training codes (pre-sigmoid for Atlas methods).
        train_index: :math:`(N_{tr},)` integer charts of the training points.
        train_labels: :math:`(N_{tr},)` integer labels.
        test_codes: :math:`(N_{te}, d)` test codes.
        test_index: :math:`(N_{te},)` integer charts of the test points.
        test_labels: :math:`(N_{te},)` integer labels.
        sigmoid: apply the sigmoid to the codes before fitting. Default: ``True``.
        C: inverse L2 regularization strength of the logistic regressions.
        max_iter: lbfgs iterations.

    Returns:
        ``{"accuracy": float, "num_test": int, "num_correct": int, "charts": [...]}`` where
        ``charts`` lists, for each chart holding training or test points (sorted),
        ``{"chart", "num_train", "num_test", "num_correct", "classifier"}`` with
        ``classifier`` one of ``"logistic"``, ``"single-class"``, ``"majority"`` (no training
        points) or ``"none"`` (no test points).

    Example:
        >>> rng = np.random.default_rng(0)
        >>> codes = rng.standard_normal((40, 2))
        >>> labels, charts = (codes[:, 0] > 0).astype(int), (codes[:, 1] > 0).astype(int)
        >>> piecewise_linear_accuracy(codes, charts, labels, codes, charts, labels,
        ...                           sigmoid=False)["accuracy"]
        1.0
    """
    if not is_finite_number(C, above=0):
        raise KdmlError(f"C (the inverse L2 strength of the logistic regressions) must be a "
                        f"finite number > 0, got {C!r}")
    if not is_positive_int(max_iter):  # scikit-learn's own error was a traceback
        raise KdmlError(f"max_iter (the lbfgs iterations of the logistic regressions) must be "
                        f"a positive integer, got {max_iter!r}")
    train_x, _ = as_float32_matrix(train_codes, "train_codes")
    test_x, _ = as_float32_matrix(test_codes, "test_codes")
    if train_x.shape[1] != test_x.shape[1]:
        raise KdmlError(f"train_codes have dimension {train_x.shape[1]} but test_codes have "
                        f"{test_x.shape[1]}")
    train_charts = as_label_vector(train_index, "train_index", len(train_x))
    train_y = as_label_vector(train_labels, "train_labels", len(train_x))
    test_charts = as_label_vector(test_index, "test_index", len(test_x))
    test_y = as_label_vector(test_labels, "test_labels", len(test_x))
    train_features, test_features = train_x.astype(np.float64), test_x.astype(np.float64)
    if sigmoid:  # scipy's: 1 / (1 + exp(-x)) warned of an overflow for x below -709
        from scipy.special import expit  # here: 0.3 s of every scoring command's start-up

        train_features, test_features = expit(train_features), expit(test_features)
    values, counts = np.unique(train_y, return_counts=True)
    majority_label = values[np.argmax(counts)]

    charts, total_correct = [], 0
    for chart in np.union1d(train_charts, test_charts):
        in_train, in_test = train_charts == chart, test_charts == chart
        chart_labels = np.unique(train_y[in_train])
        if not in_test.any():
            kind, correct = "none", 0
        else:
            if len(chart_labels) >= 2:
                kind = "logistic"
                fit_x, score_x = train_features[in_train], test_features[in_test]
                if _at_one_point(train_x[in_train]):  # nothing but rounding to fit
                    fit_x, score_x = np.zeros_like(fit_x), np.zeros_like(score_x)
                predicted = _fit_and_predict(fit_x, train_y[in_train], score_x, C, max_iter)
            else:
                kind = "single-class" if len(chart_labels) == 1 else "majority"
                constant = chart_labels[0] if len(chart_labels) == 1 else majority_label
                predicted = np.full(int(in_test.sum()), constant)
            correct = int((predicted == test_y[in_test]).sum())
        total_correct += correct
        charts.append({"chart": int(chart), "num_train": int(in_train.sum()),
                       "num_test": int(in_test.sum()), "num_correct": correct,
                       "classifier": kind})
    return {"accuracy": total_correct / len(test_x), "num_test": len(test_x),
            "num_correct": total_correct, "charts": charts}
