"""Float64 references for the property tests (``test_properties.py``).

They share no code with ``kdml``: kernels are their formulas written with NumPy on float64
difference tensors (no ``|a|^2 + |b|^2 - 2ab`` expansion), and the retrieval scores under ties
enumerate every order of every tie group (``literal_scores`` of ``test_ties.py``) after ranking
the neighbours with exact integer / rational arithmetic.

Each kernel reference also returns a first-order bound on the rounding error of a
floating-point evaluation, in units of the dtype's machine epsilon: the tolerance of the
comparison is ``C * eps * bound``, so float32 and float64 are held to the same relative
standard.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
from test_ties import literal_scores


def sq_dists(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    diff = x[:, None, :] - y[None, :, :]
    return (diff * diff).sum(axis=-1)


def l1_dists(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.abs(x[:, None, :] - y[None, :, :]).sum(axis=-1)


def floored_mean_off_diagonal(dists: np.ndarray, floor: float) -> float:
    """The self-adaptive bandwidth: mean over ordered pairs i != j, floored at ``floor``."""
    n = len(dists)
    return max(float(dists.sum()) / max(n * n - n, 1), floor)


def rounding_floor(points: np.ndarray, power: int, eps: float) -> float:
    """The bandwidth's floor for ``points`` in a dtype of epsilon ``eps``: eps mean |p|_2^2
    (squared distances, power 2) or sqrt(eps) mean |p|_1 (L1, power 1), at least the dtype's
    smallest normal number over its epsilon."""
    info = np.finfo(np.float32 if eps == np.finfo(np.float32).eps else np.float64)
    smallest = float(info.tiny) / eps
    if not len(points):
        return smallest
    sizes = (points**2).sum(axis=1) if power == 2 else np.abs(points).sum(axis=1)
    return max((eps if power == 2 else math.sqrt(eps)) * float(sizes.mean()), smallest)


def kernel_reference(name: str, params: dict, x: np.ndarray, y: np.ndarray | None,
                     eps: float) -> tuple[np.ndarray, np.ndarray]:
    """``(K, bound)``: the kernel matrix of ``x`` against ``y`` (``None``: ``x`` itself) in
    float64, and a bound on the rounding error of computing it in a dtype of epsilon ``eps``
    (``|K_float - K| <~ eps * bound``)."""
    same = y is None
    y = x if same else y
    d = x.shape[1]
    if name in ("gaussian", "imq"):
        # error of a squared distance: ~ (d + 2) eps (|x_i - c|^2 + |y_j - c|^2), c the centre
        # of the expansion
        adaptive = name == "gaussian" and params.get("bandwidth") is None
        if same or adaptive:
            joint = x if same else np.concatenate([x, y])
            centre = joint.mean(axis=0)
        else:
            centre = 0.5 * (x.mean(axis=0) + y.mean(axis=0))
        norms_x = ((x - centre) ** 2).sum(axis=1)
        norms_y = ((y - centre) ** 2).sum(axis=1)
        d2 = sq_dists(x, y)
        d2_err = (d + 2) * (norms_x[:, None] + norms_y[None, :])
        if name == "imq":
            c = params["scale"]
            value = c / (c + d2)
            return value, c / (c + d2) ** 2 * (d2_err + d2) + value
        num_kernels = params.get("num_kernels", 3)
        multiplier = params.get("multiplier", 2.0)
        if adaptive:
            joint = x if same else np.concatenate([x, y])
            tau = floored_mean_off_diagonal(sq_dists(joint, joint), rounding_floor(joint, 2, eps))
            joint_norms = ((joint - centre) ** 2).sum(axis=1)
            tau_rel_err = 2.0 + math.log2(len(joint) ** 2 + 1) + (d + 2) * 2.0 * float(
                joint_norms.mean()) / tau
        else:
            tau, tau_rel_err = params["bandwidth"], 1.0
        value = np.zeros_like(d2)
        bound = np.zeros_like(d2)
        for i in range(num_kernels):
            sigma2 = tau * multiplier ** (i - num_kernels // 2)
            term = np.exp(-d2 / sigma2)
            value += term
            bound += term * (d2_err + d2 * (tau_rel_err + 2.0)) / sigma2
        return value / num_kernels, bound / num_kernels + value / num_kernels
    if name == "laplace":
        l1 = l1_dists(x, y)
        if params.get("bandwidth") is None:
            joint = x if same else np.concatenate([x, y])
            sigma = floored_mean_off_diagonal(l1_dists(joint, joint),
                                              rounding_floor(joint, 1, eps))
            sigma_rel_err = d + 2.0 + math.log2(len(joint) ** 2 + 1)
        else:
            sigma, sigma_rel_err = params["bandwidth"], 1.0
        value = np.exp(-l1 / sigma)
        return value, value * (l1 / sigma) * (d + 2.0 + sigma_rel_err) + value
    # kernels of the dot product: error of x.y ~ d eps sum_k |x_k y_k|
    dots = x @ y.T
    abs_dots = np.abs(x) @ np.abs(y).T
    if name == "polynomial":
        degree, bias = params["degree"], params["bias"]
        base = dots + bias
        value = base**degree
        bound = (degree * np.abs(base) ** (degree - 1) * (d * abs_dots + np.abs(base))
                 + degree * np.abs(value))
        return value, bound
    if name == "mgf":
        value = np.exp(dots)
        return value, value * (d * abs_dots + 1.0)
    raise ValueError(name)


# ----------------------------------------------------------------- retrieval under ties


def rank_keys(points: np.ndarray, metric: str, reference: np.ndarray | None = None,
              exact_floats: bool = False) -> list[list]:
    """``keys[i][j]``: sort key of reference ``j`` (``reference``, default ``points``) for
    query ``i``, smaller is nearer. Exact for integer points (ints for squared L2, Fractions
    for cosine), and for floats with ``exact_floats`` (each value as the rational it is);
    float64 otherwise."""
    reference = points if reference is None else reference
    exact = exact_floats or (points.dtype.kind in "iu" and reference.dtype.kind in "iu")
    if exact_floats:
        queries = [[Fraction(float(v)) for v in row] for row in points]
        refs = [[Fraction(float(v)) for v in row] for row in reference]
    elif exact:
        queries = [[int(v) for v in row] for row in points]
        refs = [[int(v) for v in row] for row in reference]
    else:
        queries, refs = points.tolist(), reference.tolist()
    keys = []
    for q in queries:
        row_keys = []
        for r in refs:
            if metric == "euclidean":
                row_keys.append(sum((a - b) ** 2 for a, b in zip(q, r, strict=True)))
                continue
            dot = sum(a * b for a, b in zip(q, r, strict=True))
            norms2 = sum(a * a for a in q) * sum(b * b for b in r)
            if norms2 == 0:  # a zero vector stays zero: similarity 0 to everything
                row_keys.append(Fraction(0) if exact else 0.0)
            elif exact:  # -cos, compared through -sign(cos) cos^2 (monotonic)
                row_keys.append(-(1 if dot > 0 else -1) * Fraction(dot * dot, norms2))
            else:
                row_keys.append(-dot / math.sqrt(norms2))
        keys.append(row_keys)
    return keys


def min_relative_gap(keys: list[list], exclude_self: bool = True, charts=None) -> float:
    """Smallest gap between two neighbours' keys of a query (query itself left out with
    ``exclude_self``; only same-chart neighbours with ``charts``), relative to the largest key
    magnitude of that query (at least 1): how far from a tie the data is."""
    smallest = math.inf
    for i, row in enumerate(keys):
        values = sorted(float(v) for j, v in enumerate(row)
                        if not (exclude_self and j == i)
                        and (charts is None or charts[j] == charts[i]))
        scale = max([abs(v) for v in values] + [1.0])
        for a, b in zip(values, values[1:], strict=False):
            smallest = min(smallest, (b - a) / scale)
    return smallest


def enumerated_retrieval(keys: list[list], labels, ks, charts=None) -> dict[str, float]:
    """Leave-one-out Recall@K, MAP@R and R-Precision, each query's score averaged over every
    order of its tied neighbours (equal keys), lone queries (R = 0) left out.

    With ``charts``, only same-chart neighbours are ranked by key; the others are at infinite
    distance, after them, and never relevant. R counts every same-class point."""
    labels = [int(v) for v in labels]
    n = len(labels)
    totals = np.zeros(len(ks) + 2)
    counted = 0
    for i in range(n):
        others = [j for j in range(n) if j != i]
        r = sum(labels[j] == labels[i] for j in others)
        if r == 0:
            continue
        finite = [j for j in others if charts is None or charts[j] == charts[i]]
        at_infinity = [j for j in others if j not in finite]
        finite.sort(key=lambda j, i=i: keys[i][j])
        hits, groups = [], []
        for position, j in enumerate(finite):
            tied = position > 0 and keys[i][j] == keys[i][finite[position - 1]]
            groups.append(groups[-1] if tied else len(set(groups)))
            hits.append(int(labels[j] == labels[i]))
        for _ in at_infinity:  # misses, whatever their order: one group each
            groups.append(len(set(groups)))
            hits.append(0)
        totals += literal_scores(hits, groups, ks, r)
        counted += 1
    means = totals / counted
    result = {f"recall@{k}": float(means[p]) for p, k in enumerate(ks)}
    result["map@r"], result["r_precision"] = float(means[-2]), float(means[-1])
    return result


def nn_vote_accuracy(source, source_labels, target, target_labels, k: int, metric: str) -> float:
    """k-NN majority vote (ties between labels: the label of the nearest voter), float64
    loops; target labels < 0 are not scored."""
    def key(t, s):
        if metric == "euclidean":
            return float(((t - s) ** 2).sum())
        norms = float(np.linalg.norm(t) * np.linalg.norm(s))
        return -float(t @ s) / norms if norms else 0.0

    correct = scored = 0
    for t, y in zip(target, target_labels, strict=True):
        if y < 0:
            continue
        nearest = sorted(range(len(source)), key=lambda j, t=t: key(t, source[j]))[:k]
        votes: dict[int, int] = {}
        for j in nearest:
            votes[int(source_labels[j])] = votes.get(int(source_labels[j]), 0) + 1
        best = max(votes.values())
        predicted = next(int(source_labels[j]) for j in nearest
                         if votes[int(source_labels[j])] == best)
        correct += predicted == int(y)
        scored += 1
    return correct / scored
