"""The generalization terms of JRD (Chu et al., ICML 2020, Sec. 2, Eq. 2-3; Table 3) with
k-nearest-neighbour classifiers (k = 1, 3, 5) and uneven labelled fractions, against literal
float64 loops.

The random splits that :func:`generalization_terms` draws are recorded (its ``_split`` is
wrapped) and checked against the documented rule; the terms of each split are then recomputed
by brute-force k-NN votes:

- H-divergence (Eq. 2): a k-NN discriminator of seen (0) against unseen (1) fitted on the
  labelled parts; e_s, e_u its error on each set's scored part; the balanced error
  e = (e_s + e_u) / 2 of the better of h and its complement, e* = min(e, 1 - e);
  d_H = 1 - e* and Ben-David's 1 - 2 e*.
- lambda (Eq. 3): err_s + err_u of one k-NN classifier over the classes of both sets.
- unfitted: the share of scored samples whose class has no fitted sample.

Votes: the label with most of the k nearest (Euclidean) neighbours; between equally voted labels
the smallest, the rule of scikit-learn's ``KNeighborsClassifier`` (the paper uses 1-NN, which
has no vote ties; with two domains and odd k the discriminator has none either).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.neighbors import KNeighborsClassifier

from kdml.errors import KdmlError
from kdml.evaluation import generalization
from kdml.evaluation.generalization import generalization_terms


def literal_knn_predict(
    train_x: list[list[float]], train_y: list[int], x: list[float], k: int
) -> int:
    order = sorted(
        range(len(train_x)),
        key=lambda j: sum((a - b) ** 2 for a, b in zip(x, train_x[j], strict=True)),
    )
    votes: dict[int, int] = {}
    for j in order[:k]:
        votes[train_y[j]] = votes.get(train_y[j], 0) + 1
    best = max(votes.values())
    return min(label for label, count in votes.items() if count == best)


def literal_error(train_x, train_y, test_x, test_y, k: int) -> float:
    wrong = sum(
        literal_knn_predict(train_x, train_y, x, k) != y
        for x, y in zip(test_x, test_y, strict=True)
    )
    return wrong / len(test_y)


def literal_terms(
    seen, seen_y, unseen, unseen_y, s_fit, s_score, u_fit, u_score, k: int
) -> dict[str, float]:
    fit_x = [seen[i] for i in s_fit] + [unseen[i] for i in u_fit]
    domains = [0] * len(s_fit) + [1] * len(u_fit)
    e_s = literal_error(fit_x, domains, [seen[i] for i in s_score], [0] * len(s_score), k)
    e_u = literal_error(fit_x, domains, [unseen[i] for i in u_score], [1] * len(u_score), k)
    balanced = (e_s + e_u) / 2
    best = min(balanced, 1.0 - balanced)
    fit_y = [seen_y[i] for i in s_fit] + [unseen_y[i] for i in u_fit]
    err_seen = literal_error(
        fit_x, fit_y, [seen[i] for i in s_score], [seen_y[i] for i in s_score], k
    )
    err_unseen = literal_error(
        fit_x, fit_y, [unseen[i] for i in u_score], [unseen_y[i] for i in u_score], k
    )
    scored = [seen_y[i] for i in s_score] + [unseen_y[i] for i in u_score]
    return {
        "h_divergence": 1.0 - best,
        "h_divergence_bd": 1.0 - 2.0 * best,
        "lambda": err_seen + err_unseen,
        "err_seen": err_seen,
        "err_unseen": err_unseen,
        "unfitted": sum(y not in set(fit_y) for y in scored) / len(scored),
    }


def literal_ci95(values: list[float]) -> float:
    """Half-width of the Student-t 95% interval of the mean: t_{0.975, n-1} s / sqrt(n)."""
    n = len(values)
    mean = sum(values) / n
    sample_std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return float(stats.t.ppf(0.975, n - 1)) * sample_std / math.sqrt(n)


def recorded_splits(monkeypatch) -> list[tuple[np.ndarray, np.ndarray, int, float]]:
    draws = []
    original = generalization._split

    def recording(count, fraction, rng):
        fit, score = original(count, fraction, rng)
        draws.append((fit.copy(), score.copy(), count, fraction))
        return fit, score

    monkeypatch.setattr(generalization, "_split", recording)
    return draws


def random_sets(num_seen: int, num_unseen: int, dim: int, seed: int, shift: float):
    rng = np.random.default_rng(seed)
    seen_y = rng.integers(0, 4, num_seen) * 2 + 1  # odd labels
    unseen_y = rng.integers(0, 3, num_unseen) * 2 + 20  # even labels, disjoint
    seen = rng.normal(size=(num_seen, dim)) + 0.8 * seen_y[:, None] / 7
    unseen = rng.normal(size=(num_unseen, dim)) + shift
    return seen, seen_y, unseen, unseen_y


CASES = [  # (Ns, Nu, d, k, labelled fraction, shift of the unseen set)
    (20, 16, 2, 1, 0.5, 0.0),
    (25, 18, 3, 3, 0.3, 0.7),
    (18, 30, 2, 5, 0.7, 1.5),
    (12, 12, 1, 3, 0.55, 0.2),
    (30, 10, 4, 1, 0.25, 3.0),
]


@pytest.mark.parametrize(("num_seen", "num_unseen", "dim", "neighbors", "fraction", "shift"), CASES)
def test_generalization_terms_equal_literal_knn_on_the_drawn_splits(
    monkeypatch, num_seen, num_unseen, dim, neighbors, fraction, shift
):
    seen, seen_y, unseen, unseen_y = random_sets(
        num_seen, num_unseen, dim, seed=num_seen, shift=shift
    )
    draws = recorded_splits(monkeypatch)
    repeats = 4
    terms = generalization_terms(
        seen,
        seen_y,
        unseen,
        unseen_y,
        labelled_fraction=fraction,
        repeats=repeats,
        neighbors=neighbors,
        seed=3,
    )
    assert len(draws) == 2 * repeats  # seen, then unseen, per repeat
    expected: dict[str, list[float]] = {}
    for repeat in range(repeats):
        splits = draws[2 * repeat : 2 * repeat + 2]
        for (fit, score, count, drawn_fraction), size in zip(
            splits, (num_seen, num_unseen), strict=True
        ):
            # a partition of the set, fraction of it fitted (rounded), at least 1 of each
            assert count == size and drawn_fraction == fraction
            assert sorted(fit.tolist() + score.tolist()) == list(range(size))
            assert len(fit) >= 1 and len(score) >= 1
            assert abs(len(fit) - fraction * size) <= 0.5 or len(fit) in (1, size - 1)
        (s_fit, s_score, _, _), (u_fit, u_score, _, _) = splits
        values = literal_terms(seen.tolist(), seen_y.tolist(), unseen.tolist(),
                               unseen_y.tolist(), s_fit, s_score, u_fit, u_score, neighbors)
        for name, value in values.items():
            expected.setdefault(name, []).append(value)
    assert set(terms) == set(expected)
    for name, values in expected.items():
        assert terms[name].values == pytest.approx(tuple(values), rel=1e-12, abs=1e-15), name
        assert terms[name].mean == pytest.approx(sum(values) / repeats, rel=1e-12, abs=1e-15)
        assert terms[name].ci95 == pytest.approx(literal_ci95(values), rel=1e-9, abs=1e-15)


def test_vote_ties_between_classes_go_to_the_smallest_label(monkeypatch):
    """k = 2 with two fitted points per set: a scored point whose two nearest fitted points
    are of two classes gets the smaller label. The data makes such ties; the test checks that
    some occurred, so the rule is exercised."""
    rng = np.random.default_rng(5)
    seen = rng.normal(size=(12, 2))
    seen_y = np.arange(12) % 2 * 2 + 1  # classes 1 and 3
    unseen = rng.normal(size=(12, 2)) + 0.3
    unseen_y = np.arange(12) % 2 * 2 + 20  # classes 20 and 22
    draws = recorded_splits(monkeypatch)
    terms = generalization_terms(
        seen, seen_y, unseen, unseen_y, labelled_fraction=0.17, repeats=3, neighbors=2, seed=0
    )
    ties = 0
    for repeat in range(3):
        (s_fit, s_score, _, _), (u_fit, u_score, _, _) = draws[2 * repeat : 2 * repeat + 2]
        assert len(s_fit) == len(u_fit) == 2
        values = literal_terms(seen.tolist(), seen_y.tolist(), unseen.tolist(),
                               unseen_y.tolist(), s_fit, s_score, u_fit, u_score, 2)
        for name in ("lambda", "h_divergence", "err_seen", "err_unseen"):
            assert terms[name].values[repeat] == pytest.approx(values[name], abs=1e-15), name
        fit_x = np.concatenate([seen[s_fit], unseen[u_fit]])
        fit_y = np.concatenate([seen_y[s_fit], unseen_y[u_fit]])
        scored = np.concatenate([seen[s_score], unseen[u_score]])
        peer = KNeighborsClassifier(n_neighbors=2).fit(fit_x, fit_y).predict(scored)
        for x, predicted in zip(scored, peer, strict=True):
            nearest = np.argsort(((fit_x - x) ** 2).sum(axis=1))[:2]
            ties += fit_y[nearest[0]] != fit_y[nearest[1]]
            # the vote rule of the loops is scikit-learn's, the peer kdml uses
            assert literal_knn_predict(fit_x.tolist(), fit_y.tolist(), x.tolist(), 2) == predicted
    assert ties > 0


def test_the_default_is_ten_random_splits(monkeypatch):
    """repeats defaults to 10, as documented and as the CLI's --repeats: without it, every
    estimate (and its 95% interval) is over ten splits, each a seen and an unseen partition."""
    seen, seen_y, unseen, unseen_y = random_sets(12, 12, 2, seed=1, shift=0.5)
    draws = recorded_splits(monkeypatch)
    terms = generalization_terms(seen, seen_y, unseen, unseen_y)
    assert len(draws) == 2 * 10
    for name, estimate in terms.items():
        assert len(estimate.values) == 10, name


@pytest.mark.parametrize("as_tensor", ["labels", "everything"])
def test_nn_error_of_tensors_is_that_of_the_arrays(as_tensor):
    """nn_error compared NumPy predictions with the given labels: with a tensor of labels the
    comparison was one bool, and a perfect classifier's error read 1.0 instead of 0.0."""
    import torch

    rng = np.random.default_rng(3)
    train_x, test_x = rng.normal(size=(12, 3)), rng.normal(size=(7, 3))
    train_y, test_y = np.arange(12) % 3, rng.integers(0, 3, size=7)
    expected = [
        literal_knn_predict(train_x.tolist(), train_y.tolist(), x, 1) != y
        for x, y in zip(test_x.tolist(), test_y.tolist(), strict=True)
    ]
    args = [train_x, train_y, test_x, test_y]
    if as_tensor == "labels":
        args[1], args[3] = torch.tensor(train_y), torch.tensor(test_y)
    else:
        args = [torch.tensor(arg) for arg in args]
    assert generalization.nn_error(*args) == pytest.approx(sum(expected) / 7, abs=1e-12)
    assert generalization.nn_error(train_x, train_y, train_x, torch.tensor(train_y)) == 0.0


@pytest.mark.parametrize("case", ["dimensions", "neighbors", "label count"])
def test_nn_error_refuses_what_scikit_learn_would_in_one_line(case):
    from kdml.errors import KdmlError

    x, y = np.eye(4), np.arange(4)
    args: dict[str, object] = {"train_x": x, "train_y": y, "test_x": x, "test_y": y}
    if case == "dimensions":
        args["test_x"] = np.eye(3)
        args["test_y"] = y[:3]
    elif case == "neighbors":
        args["neighbors"] = 5
    else:
        args["train_y"] = y[:3]
    with pytest.raises(KdmlError):
        generalization.nn_error(**args)  # type: ignore[arg-type]


def test_neighbors_may_be_every_fitted_sample_and_no_more():
    """10 seen and 10 unseen samples at labelled_fraction 0.5 fit 5 + 5: neighbors=10 is every
    fitted sample (scikit-learn takes it: a vote of all of them) and is taken; 11 is refused."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.standard_normal((10, 2)), rng.standard_normal((10, 2)) + 3.0
    seen_labels, unseen_labels = np.arange(10) % 2, 2 + np.arange(10) % 2
    terms = generalization_terms(seen, seen_labels, unseen, unseen_labels, repeats=2,
                                 neighbors=10)
    assert set(terms) >= {"h_divergence", "err_seen"}
    with pytest.raises(KdmlError, match=r"^neighbors \(11\) is more than the 10 samples"):
        generalization_terms(seen, seen_labels, unseen, unseen_labels, repeats=2,
                             neighbors=11)


def test_float_labels_must_be_whole_numbers():
    """2.0 is class 2, as the integer; 0.5 is no class and is refused in one line (it had been
    read as class 0)."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.standard_normal((10, 2)), rng.standard_normal((10, 2)) + 3.0
    seen_labels, unseen_labels = np.arange(10) % 2, 2 + np.arange(10) % 2
    as_floats = generalization_terms(seen, seen_labels.astype(float), unseen,
                                     unseen_labels.astype(float), repeats=2)
    assert as_floats == generalization_terms(seen, seen_labels, unseen, unseen_labels,
                                             repeats=2)
    # whole floats are integers beside integer labels too (a torch tensor's float labels)
    assert generalization_terms(seen, seen_labels.astype(float), unseen, unseen_labels,
                                repeats=2) == as_floats
    halves = seen_labels.astype(float)
    halves[3] = 0.5
    with pytest.raises(KdmlError, match=r"^seen_labels must be class labels \(integers or "
                                        r"names\), got the non-integer value 0\.5$"):
        generalization_terms(seen, halves, unseen, unseen_labels, repeats=2)


def test_integer_seen_labels_beside_named_unseen_ones_are_refused():
    """np.concatenate turns the integers into strings, so the joint classifier's predictions
    never equal an integer seen label (err_seen read 1.0): refused in one line."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.standard_normal((10, 2)), rng.standard_normal((10, 2)) + 3.0
    with pytest.raises(KdmlError, match=r"^seen_labels are integers and unseen_labels names; "
                                        r"give both as integers or both as names$"):
        generalization_terms(seen, np.arange(10) % 2, unseen,
                             np.array(["cat", "dog"] * 5), repeats=2)


def test_estimate_is_the_mean_and_the_student_t_half_width_of_its_values():
    """Estimate.of against the textbook: the sample standard deviation (n - 1), its mean's
    standard error, and Student's t at 97.5% with n - 1 degrees of freedom (3.182 for 4)."""
    from kdml.evaluation.estimate import Estimate

    values = [1.0, 2.0, 3.0, 4.5]
    mean = sum(values) / 4
    deviation = math.sqrt(sum((value - mean) ** 2 for value in values) / 3)
    estimate = Estimate.of(values)
    assert estimate.mean == mean
    assert estimate.ci95 == pytest.approx(3.182446305284263 * deviation / 2, rel=1e-12)
    assert estimate.values == tuple(values)


def test_each_repeat_draws_its_own_seen_and_unseen_split(monkeypatch):
    """The repeats are independent random splits of both sets: no two repeats of either set
    draw the same labelled part (a repeat that re-drew one set's split from the seed would
    score one unseen split ten times, and the 95% interval would shrink to the seen set's)."""
    seen, seen_y, unseen, unseen_y = random_sets(30, 30, 2, seed=2, shift=0.5)
    draws = recorded_splits(monkeypatch)
    generalization_terms(seen, seen_y, unseen, unseen_y, repeats=6, seed=4)
    for first in (0, 1):  # seen, unseen
        fitted = [tuple(sorted(fit.tolist())) for fit, _, _, _ in draws[first::2]]
        assert len(fitted) == 6
        assert len(set(fitted)) == 6, fitted


def test_estimate_of_one_value_is_that_value_without_an_interval_or_a_warning():
    """One repeat has no spread to estimate: the value itself and a ``nan`` half-width, said
    without NumPy's "Degrees of freedom <= 0" warning (a sample std of one value)."""
    import warnings

    from kdml.evaluation.estimate import Estimate

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        estimate = Estimate.of([0.625])
    assert estimate.mean == 0.625 and math.isnan(estimate.ci95)
    assert estimate.values == (0.625,)
    assert Estimate.of([0.25, 0.25]).ci95 == 0.0  # two equal repeats: no spread
