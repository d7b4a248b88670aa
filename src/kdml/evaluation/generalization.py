r"""Generalization analysis of Chu et al. 2020 (Sec. 2, Eq. 1-3; Table 3).

The bound on the unseen-class error has two data terms, estimated with nearest-neighbour
classifiers fitted on labelled splits and scored on the rest:

- the H-divergence between seen-class and unseen-class embeddings. A classifier h tells the two
  sets apart; with its per-set errors :math:`e_s` (seen samples called unseen) and :math:`e_u`,
  its error is the *balanced* one, :math:`\bar e(h) = (e_s + e_u) / 2`, which does not move
  with the ratio of the set sizes (the pooled error of two identical sets of 300 and 300
  points is about 0.5, of 450 and 150 points about 0.37, which would read as d_H = 0.63 for
  sets no classifier can tell apart). The better of h and its complement
  is kept, :math:`\bar e^* = \min(\bar e, 1 - \bar e)`. Two forms are reported:

  - ``h_divergence``, the paper's Eq. 2, :math:`d_H = 1 - \bar e^*`, in [0.5, 1];
  - ``h_divergence_bd``, Ben-David et al.'s (2010) :math:`1 - (e_s + e_u)` with the better of h
    and its complement, i.e. :math:`1 - 2 \bar e^*`, in [0, 1]: half of their
    :math:`d_H = 2 (1 - 2 \bar e^*)` (the proxy A-distance), in [0, 2], which published
    numbers may quote.

  Chance (sets the classifier cannot tell apart) gives :math:`\bar e^* \approx 0.5`:
  :math:`d_H \approx 0.5` and the Ben-David form :math:`\approx 0`; perfectly separated sets
  give 1 in both.
- ``lambda = err_s(h*) + err_u(h*)`` (Eq. 3), the error of the ideal joint hypothesis: one
  multi-class classifier fitted on the labelled parts of both sets, over all their classes.

Both are repeated over random splits and reported with 95% confidence intervals. A scored
sample whose class has no sample in the fitted part cannot be classified right, so lambda
counts it as an error: ``unfitted``, the share of such samples, says how much of lambda that
is (it grows as ``labelled_fraction`` shrinks, and with classes of very few samples).

At the other end, each set must keep at least :data:`MIN_SCORED` samples to score: with
:math:`n` scored samples per set, a classifier at chance gets both sets all right or both all
wrong (:math:`e_s = e_u \in \{0, 1\}`, which reads :math:`d_H = 1`) with probability
:math:`2^{1 - 2n}` (1/2 for one sample, 1/512 for five), and lambda's errors move in steps
of :math:`1/n`; a ``labelled_fraction`` that leaves fewer is refused, with the largest one that
would do.

The classifiers rank neighbours by the Euclidean distance between the vectors given. ``kdml
analyze generalization`` gives a run's ``embed`` outputs; for an Atlas run that is not the
distance it is evaluated with, and :func:`distance_note` says so.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from kdml.checks import beyond_int64, check_seed, is_finite_number, is_positive_int
from kdml.errors import KdmlError, counted
from kdml.evaluation.estimate import Estimate
from kdml.evaluation.knn import as_float_matrix, check_positive_int
from kdml.evaluation.labels import transposed_hint

# the fewest samples of each set the classifiers are scored on (see the module docstring)
MIN_SCORED = 5


def _labels(labels: Any, name: str, expected_length: int, width: int) -> np.ndarray:
    """Class labels as a 1-D NumPy array of ``expected_length`` (any values the classifiers
    take: integers, strings)."""
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    array = np.asarray(labels)
    if array.shape != (expected_length,):
        hint = transposed_hint(len(array), expected_length, width) if array.ndim == 1 else ""
        raise KdmlError(f"{name} must have shape ({expected_length},) to match the embeddings, "
                        f"got {tuple(array.shape)}{hint}")
    if array.dtype.kind == "f":  # 2.0 is class 2; 0.5 is no class (scikit-learn: a traceback)
        whole = np.isfinite(array) & (array == np.round(array))
        if not whole.all():
            raise KdmlError(f"{name} must be class labels (integers or names), got the "
                            f"non-integer value {float(array[~whole][0])!r}")
        # beyond int64 the cast gives -2**63 to all (1e20 and 2e20 one class, with NumPy's
        # RuntimeWarning alone)
        beyond = beyond_int64(array)
        if beyond.size:
            raise KdmlError(f"{name} must be class labels within int64's range (|label| < "
                            f"2**63), got {float(beyond[0])!r}; renumber the classes "
                            "(e.g. with numpy.unique(..., return_inverse=True))")
        array = array.astype(np.int64)
    elif array.dtype.kind not in "iubUSO":
        raise KdmlError(f"{name} must be class labels (integers or names), got dtype "
                        f"{array.dtype}")
    return array


def _label_kind(labels: np.ndarray) -> str:
    """``"integers"`` or ``"names"`` (strings, bytes or objects) for :func:`_labels`'s arrays."""
    return "integers" if labels.dtype.kind in "iub" else "names"


def distance_note(has_charts: bool) -> str | None:
    """One line on the k-NN distance of ``kdml analyze generalization`` (Euclidean, on the
    run's ``embed`` outputs) for a method with charts (Atlas: ``mtriplet``, ``msimclr``), which
    ``kdml eval`` scores with another distance, the manifold distance on chart codes
    (:mod:`kdml.evaluation.charts`); ``None`` for methods without charts."""
    if not has_charts:
        return None
    # embed is atlas_embedding: [sigmoid(c_i(x)), sqrt(d) e_i] of the argmax chart i
    return ("the k-NN used Euclidean distance on the Atlas embedding [sigmoid chart "
            "coordinates, sqrt(d) x one-hot chart] (a point's own chart ranks first), not the "
            "manifold distance on pre-sigmoid chart coordinates that eval scores this run with")


def nn_error(train_x: np.ndarray, train_y: np.ndarray, test_x: np.ndarray, test_y: np.ndarray,
             neighbors: int = 1) -> float:
    """Test error of a k-nearest-neighbour classifier (Euclidean) fitted on the train part.

    Takes arrays or tensors, as :func:`generalization_terms` does: labels come to NumPy first
    (a NumPy prediction compared with a tensor of labels is one bool, which had read a
    perfect classifier's error as 1.0), and what scikit-learn would refuse with a traceback
    (feature sizes that differ, more neighbours than fitted samples) is refused in one line."""
    from sklearn.neighbors import KNeighborsClassifier  # here: see clustering.nmi_score

    train_x, train_y, test_x, test_y = _two_sets(train_x, train_y, test_x, test_y,
                                                 ("train_x", "train_y", "test_x", "test_y"))
    check_positive_int("neighbors", neighbors)
    if neighbors > len(train_x):
        raise KdmlError(f"neighbors ({neighbors}) is more than the {len(train_x):,} fitted "
                        "samples; use fewer")
    classifier = KNeighborsClassifier(n_neighbors=neighbors).fit(train_x, train_y)
    return float(np.mean(classifier.predict(test_x) != test_y))


def _two_sets(first: Any, first_labels: Any, second: Any, second_labels: Any,
              names: tuple[str, str, str, str]) -> tuple[np.ndarray, ...]:
    """Two labelled sets as float matrices of one feature size and NumPy labels (an array
    compared with a tensor is one bool, which would count every prediction wrong), each
    refused in one line by its ``names`` (first, its labels, second, its labels)."""
    first, second = as_float_matrix(first, names[0]), as_float_matrix(second, names[2])
    if first.shape[1] != second.shape[1]:
        raise KdmlError(f"{names[0]} and {names[2]} must have one feature size, got "
                        f"{first.shape[1]} and {second.shape[1]} columns")
    first_y, second_y = _one_integer_type(
        _labels(first_labels, names[1], len(first), first.shape[1]),
        _labels(second_labels, names[3], len(second), second.shape[1]), names[1], names[3])
    return first, first_y, second, second_y


def _one_integer_type(first: np.ndarray, second: np.ndarray, first_name: str,
                      second_name: str) -> tuple[np.ndarray, np.ndarray]:
    """Integer labels of uint64 beside signed ones in one integer dtype: NumPy joins the two
    as float64 (np.concatenate, np.intersect1d), where labels from 2**53 on fall together,
    which had refused two sets of disjoint classes as overlapping. int64 where the unsigned
    labels fit it, else uint64 where the signed ones are not negative; refused where neither
    holds both."""
    if first.dtype.kind not in "iub" or second.dtype.kind not in "iub" \
            or np.result_type(first, second).kind != "f":
        return first, second
    unsigned, signed = (first, second) if first.dtype.kind == "u" else (second, first)
    if not unsigned.size or int(unsigned.max()) <= np.iinfo(np.int64).max:
        unsigned = unsigned.astype(np.int64)
    elif not signed.size or int(signed.min()) >= 0:
        signed = signed.astype(np.uint64)
    else:
        raise KdmlError(f"{first_name} and {second_name} mix uint64 labels beyond int64's "
                        f"range (up to {int(unsigned.max())}) with negative ones (down to "
                        f"{int(signed.min())}), which no integer type holds together; "
                        "renumber the classes (e.g. with numpy.unique(..., "
                        "return_inverse=True))")
    return (unsigned, signed) if first.dtype.kind == "u" else (signed, unsigned)


def generalization_terms(
    seen: Any, seen_labels: Any, unseen: Any, unseen_labels: Any,
    labelled_fraction: float = 0.5, repeats: int = 10, neighbors: int = 1, seed: int = 0,
) -> dict[str, Estimate]:
    """Estimate the H-divergence and lambda between seen- and unseen-class embeddings.

    Args:
        seen: [Ns, d] embeddings of seen-class (training) samples; ``seen_labels`` [Ns]
            (arrays or tensors; labels of any kind the classifiers take, e.g. ints or names).
        unseen: [Nu, d] embeddings of unseen-class (test) samples; ``unseen_labels`` [Nu].
            Seen and unseen label values must not overlap (class-disjoint split).
        labelled_fraction: share of each set that the classifiers are fitted on; at least
            one sample of each set is fitted and :data:`MIN_SCORED` must be left to score.
        repeats: number of random splits (at least 2, for the 95% interval).
        neighbors: k of the nearest-neighbour classifiers.

    Returns:
        ``{"h_divergence": Estimate, "h_divergence_bd": Estimate, "lambda": Estimate,
        "err_seen": ..., "err_unseen": ..., "unfitted": ...}`` (see the module docstring).
    """
    from sklearn.neighbors import KNeighborsClassifier  # here: see clustering.nmi_score

    seen, seen_labels, unseen, unseen_labels = _two_sets(
        seen, seen_labels, unseen, unseen_labels,
        ("seen", "seen_labels", "unseen", "unseen_labels"))
    check_positive_int("neighbors", neighbors)
    check_seed(seed)
    if not is_finite_number(labelled_fraction, above=0) or not labelled_fraction < 1:
        raise KdmlError(f"labelled_fraction must be in (0, 1), got {labelled_fraction}")
    if not is_positive_int(repeats) or repeats < 2:
        raise KdmlError(f"repeats must be at least 2 (a 95% interval needs two random splits), "
                        f"got {repeats}")
    if _label_kind(seen_labels) != _label_kind(unseen_labels):
        # np.concatenate turns integers into strings: the joint classifier's predictions then
        # never equal an integer seen label, and err_seen read 1.0
        raise KdmlError(f"seen_labels are {_label_kind(seen_labels)} and unseen_labels "
                        f"{_label_kind(unseen_labels)}; give both as integers or both as names")
    check_orderable_labels(seen_labels, unseen_labels)
    check_disjoint_classes(seen_labels, unseen_labels)
    check_scored_counts(len(seen), len(unseen), labelled_fraction, neighbors=neighbors)
    rng = np.random.default_rng(seed)
    h_divergence, h_divergence_bd, lam, err_seen, err_unseen, unfitted = [], [], [], [], [], []
    for _ in range(repeats):
        s_fit, s_score = _split(len(seen), labelled_fraction, rng)
        u_fit, u_score = _split(len(unseen), labelled_fraction, rng)
        fit_x = np.concatenate([seen[s_fit], unseen[u_fit]])
        # Eq. 2: discriminate seen (0) from unseen (1) samples; balanced error, better of h
        # and its complement.
        domain_fit = np.r_[np.zeros(len(s_fit)), np.ones(len(u_fit))]
        discriminator = KNeighborsClassifier(n_neighbors=neighbors).fit(fit_x, domain_fit)
        e_s = float(np.mean(discriminator.predict(seen[s_score]) != 0))
        e_u = float(np.mean(discriminator.predict(unseen[u_score]) != 1))
        balanced = min((e_s + e_u) / 2, 1.0 - (e_s + e_u) / 2)
        h_divergence.append(1.0 - balanced)
        h_divergence_bd.append(1.0 - 2.0 * balanced)
        # Eq. 3: one classifier over the classes of both sets, scored on each set.
        joint = KNeighborsClassifier(n_neighbors=neighbors).fit(
            fit_x, np.concatenate([seen_labels[s_fit], unseen_labels[u_fit]]))
        e_s = float(np.mean(joint.predict(seen[s_score]) != seen_labels[s_score]))
        e_u = float(np.mean(joint.predict(unseen[u_score]) != unseen_labels[u_score]))
        err_seen.append(e_s)
        err_unseen.append(e_u)
        lam.append(e_s + e_u)
        scored = np.concatenate([seen_labels[s_score], unseen_labels[u_score]])
        unfitted.append(float(np.mean(~np.isin(scored, joint.classes_))))
    return {"h_divergence": Estimate.of(h_divergence),
            "h_divergence_bd": Estimate.of(h_divergence_bd), "lambda": Estimate.of(lam),
            "err_seen": Estimate.of(err_seen), "err_unseen": Estimate.of(err_unseen),
            "unfitted": Estimate.of(unfitted)}


def _cut(count: int, fraction: float) -> int:
    """How many of ``count`` samples are fitted: ``fraction`` of them, at least 1, and at
    least 1 left to score."""
    return min(max(int(round(fraction * count)), 1), count - 1)


def check_orderable_labels(seen_labels: np.ndarray, unseen_labels: np.ndarray) -> None:
    """Refuse labels of object dtype that cannot be sorted together (the classifiers and the
    class-overlap check sort them): names beside numbers, or a missing name read as NaN or
    None, had failed inside NumPy with "'<' not supported between instances of ..."."""
    joint = np.concatenate([seen_labels, unseen_labels])
    if joint.dtype.kind != "O":
        return
    try:
        np.unique(joint)
    except TypeError:
        kinds = ", ".join(sorted({type(value).__name__ for value in joint}))
        raise KdmlError(f"the seen and unseen labels mix values that cannot be ordered together "
                        f"({kinds}): give every label as a name (str) or every label as an "
                        "integer (a missing name read as NaN or None is one of these)") from None


def check_disjoint_classes(seen_labels: np.ndarray, unseen_labels: np.ndarray) -> None:
    """Refuse seen and unseen sets that share a class (labels of any kind: integers,
    strings)."""
    if np.intersect1d(seen_labels, unseen_labels).size:
        raise KdmlError("seen and unseen classes overlap; the analysis needs disjoint classes "
                        "(a class-disjoint split; a domain pair's target shares the source's "
                        "classes)")


def check_scored_counts(seen_count: int, unseen_count: int, fraction: float,
                        option: str = "labelled_fraction", neighbors: int = 1) -> None:
    """Refuse sets or a ``fraction`` that leave a set fewer than :data:`MIN_SCORED` samples to
    score, naming the set, its fitted and scored counts and the fraction to use instead, and
    ``neighbors`` beyond the samples the classifiers are fitted on (:func:`generalization_terms`
    checks this; a caller may check first, before embedding). ``option`` names the fraction in
    the message (the command line's ``--labelled-fraction``, whose ``--neighbors`` is named
    alike)."""
    sets = {"seen": seen_count, "unseen": unseen_count}
    for name, count in sets.items():
        if count < MIN_SCORED + 1:
            raise KdmlError(f"the {name} set has {counted(count, 'sample')}; the analysis "
                            f"needs at least {MIN_SCORED + 1} in each set (1 fitted, "
                            f"{MIN_SCORED} scored)")
    name = min(sets, key=lambda key: sets[key] - _cut(sets[key], fraction))
    count = sets[name]
    fitted = _cut(count, fraction)
    if count - fitted < MIN_SCORED:
        # round(f * n) <= n - MIN_SCORED for every set once f <= 1 - MIN_SCORED / (smallest n)
        largest = math.floor((1 - MIN_SCORED / min(sets.values())) * 1000) / 1000
        raise KdmlError(f"{option} {fraction} leaves the {name} set {fitted} fitted "
                        f"and {count - fitted} scored of its {count} samples; each set needs at "
                        f"least {MIN_SCORED} scored: use a {option} of at most {largest}")
    fitted_total = _cut(seen_count, fraction) + _cut(unseen_count, fraction)
    if neighbors > fitted_total:
        named = "--neighbors" if option.startswith("--") else "neighbors"
        raise KdmlError(f"{named} ({neighbors}) is more than the {fitted_total:,} samples the "
                        "classifiers are fitted on; use fewer")


def _split(count: int, fraction: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    order = rng.permutation(count)
    cut = _cut(count, fraction)
    return order[:cut], order[cut:]
