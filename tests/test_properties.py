"""Property-based tests (hypothesis) of every kernel, regularizer and metric.

Random shapes, float32 and float64, one-class and singleton-class batches, collapsed, tied and
huge embeddings, empty charts. Each test asserts finite values (and gradients), agreement
with a float64 literal reference where one exists (``reference_impls.py`` and the helpers of
the other test modules), and invariances: permutations of the samples, positive scalings of
the embeddings, and the tie rule of the retrieval metrics (each tie counts as its expectation
over random orders, checked against an enumeration of every order on tiny inputs).

Hypothesis runs derandomized and without an example database, so CI is deterministic.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from reference_impls import (
    enumerated_retrieval,
    floored_mean_off_diagonal,
    kernel_reference,
    min_relative_gap,
    nn_vote_accuracy,
    rank_keys,
    rounding_floor,
    sq_dists,
)
from test_atlas_eval import brute_force_metrics as chart_brute_force_metrics
from test_atlas_eval import full_manifold_distances
from test_atlas_geometry import literal_manifold_distance
from test_atlas_regularizers import literal_chart_loss, literal_eq5
from test_dtml_losses import ref_fisher_terms, ref_linear_mmd
from test_jrs import (
    class_members,
    l1_dist,
    mean_over_pairs,
    ref_imq,
    ref_intra_penalty,
    ref_jintra,
    ref_jmmd,
    ref_jrs,
    ref_polynomial,
    sq_dist,
)
from test_retrieval import brute_force_metrics

from kdml.atlas import ChartOutputs, compressed_code, manifold_distance
from kdml.evaluation import retrieval_metrics
from kdml.evaluation.charts import chart_retrieval_metrics, piecewise_linear_accuracy
from kdml.evaluation.transfer import source_nn_accuracy
from kdml.kernels import (
    KERNELS,
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    LaplaceKernel,
    PolynomialKernel,
    adaptive_bandwidth,
    build_kernel,
    resolution_floor,
    squared_distances,
)
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.regularizers import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)
from kdml.regularizers.domain import DomainMMD
from kdml.regularizers.manifold import ChartMembershipLoss, ManifoldMMD


def fast(max_examples: int, **overrides):
    """Deterministic, database-free hypothesis settings."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
                    **overrides)


DTYPES = st.sampled_from([torch.float32, torch.float64])
METRICS = st.sampled_from(["cosine", "euclidean"])
# float64 keeps 1e200 / 1e-200 within range; float32 inputs are scaled at most to 1e19 / 1e-30
FACTORS = {torch.float32: [1e19, 1e-30, 3.7, 0.01], torch.float64: [1e19, 1e-30, 3.7, 1e200,
                                                                    1e-200]}
# Scalings that round nothing: retrieval_metrics and chart_retrieval_metrics rank the given
# values exactly (float64 re-scoring of float32 ties), so a factor that rounds the inputs may
# order exact ties of the grid points (test_retrieval_ranks_the_given_values_exactly)
EXACT_FACTORS = {torch.float32: [2.0**63, 2.0**-100, 4.0, 2.0**-7],
                 torch.float64: [2.0**63, 2.0**-100, 2.0**665, 2.0**-665]}


def eps_of(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


# ----------------------------------------------------------------- strategies


@st.composite
def grid_points(draw, n: int, d: int, span: int = 4,
                layouts=("free", "collapsed", "duplicated", "rays", "normal")) -> np.ndarray:
    """``(n, d)`` float64 points on a grid of step 1/span (exact in float32, so with exact
    ties): free in [-1, 1], all equal (collapsed), a few rows repeated (tied), or positive
    multiples (1 to 3) of a few directions (rays: tied under the cosine metric, with float32
    rounding noise once normalised); or Gaussian."""
    layout = draw(st.sampled_from(layouts))
    values = st.integers(-span, span)
    if layout == "normal":
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        return rng.standard_normal((n, d)) / 2
    if layout == "collapsed":
        if draw(st.booleans()):  # a row off the grid: its mean is not exact in floating point
            row = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal((1, d))
            return np.repeat(row, n, axis=0)
        return np.repeat(draw(arrays(np.int64, (1, d), elements=values)), n, axis=0) / span
    if layout == "rays":  # numpy draws: hypothesis' simple examples rarely make rays
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        base = rng.integers(-span, span + 1, (draw(st.integers(1, max(1, n - 1))), d))
        return base[rng.integers(0, len(base), n)] * rng.integers(1, 4, (n, 1)) / span
    if layout == "duplicated":
        k = draw(st.integers(1, max(1, n - 1)))
        base = draw(arrays(np.int64, (k, d), elements=values))
        return base[draw(arrays(np.int64, n, elements=st.integers(0, k - 1)))] / span
    return draw(arrays(np.int64, (n, d), elements=values)) / span


@st.composite
def class_labels(draw, n: int) -> np.ndarray:
    """One class, all singletons, or a mixture (usually with some singleton classes)."""
    mode = draw(st.sampled_from(["one-class", "singletons", "mixed", "mixed"]))
    if mode == "one-class":
        return np.full(n, draw(st.integers(-3, 9)), dtype=np.int64)
    if mode == "singletons":
        return np.array(draw(st.permutations(range(n))), dtype=np.int64) * 7 - 3
    return draw(arrays(np.int64, n, elements=st.integers(0, 3)))


@st.composite
def retrieval_labels(draw, n: int, num_classes: int = 3) -> np.ndarray:
    """Labels with at least one class of two samples (otherwise every query is lone)."""
    labels = draw(arrays(np.int64, n, elements=st.integers(0, num_classes - 1)))
    if np.bincount(labels).max() < 2:
        labels[-1] = labels[0]
    return labels


@st.composite
def memberships(draw, n: int, n_charts: int) -> np.ndarray:
    """``(n, n_charts)`` rows summing to 1: softmax, one-hot, one chart for all, or with an
    empty chart (a column of exact zeros)."""
    mode = draw(st.sampled_from(["softmax", "one-hot", "one-chart", "empty-chart"]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if mode == "one-hot":
        return np.eye(n_charts)[rng.integers(0, n_charts, n)]
    if mode == "one-chart":
        return np.eye(n_charts)[np.zeros(n, dtype=np.int64)]
    logits = rng.standard_normal((n, n_charts)) * 2
    q = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    if mode == "empty-chart" and n_charts > 1:
        q[:, -1] = 0.0
        q /= q.sum(axis=1, keepdims=True)
    return q


def ks_for(available: int):
    return st.lists(st.integers(1, available), min_size=1, max_size=3, unique=True).map(
        lambda ks: tuple(sorted(ks)))


def tensor(array: np.ndarray, dtype: torch.dtype, grad: bool = False) -> torch.Tensor:
    return torch.tensor(array, dtype=dtype).requires_grad_(grad)


def all_finite(*tensors: torch.Tensor) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in tensors)


def assert_within_bound(got: torch.Tensor, expected: np.ndarray, bound: np.ndarray,
                        dtype: torch.dtype, what: str, factor: float = 32.0) -> None:
    error = np.abs(got.detach().double().numpy() - expected)
    allowed = factor * eps_of(dtype) * bound + 4 * torch.finfo(dtype).tiny  # underflow
    worst = np.unravel_index(np.argmax(error / allowed), error.shape)
    assert (error <= allowed).all(), (
        f"{what}: |got - ref| = {error[worst]:.3g} > {allowed[worst]:.3g} at {worst} "
        f"(got {got.detach()[worst].item()!r}, ref {expected[worst]!r})")


def assert_metrics_equal(got: dict, expected: dict, what: str, tol: float = 1e-12) -> None:
    assert got.keys() == expected.keys(), what
    for key in expected:
        assert abs(got[key] - expected[key]) <= tol, (what, key, got[key], expected[key])


def assert_unit_interval(scores: dict) -> None:
    for key, value in scores.items():
        # NMI may exceed 1 by an ulp: see test_nmi_is_at_most_one
        top = 1.0 + 1e-12 if key == "nmi" else 1.0
        assert math.isfinite(value) and 0.0 <= value <= top, (key, value)


# ----------------------------------------------------------------- kernels

KERNEL_PARAMS = {
    "gaussian": st.fixed_dictionaries({
        "num_kernels": st.integers(1, 4), "multiplier": st.sampled_from([2.0, 3.0]),
        "bandwidth": st.sampled_from([None, None, 0.7, 4.0])}),
    "laplace": st.fixed_dictionaries({"bandwidth": st.sampled_from([None, None, 1.5])}),
    "polynomial": st.fixed_dictionaries({"degree": st.integers(1, 5),
                                         "bias": st.sampled_from([0.0, 1.0, 2.5])}),
    "mgf": st.just({}),
    "imq": st.fixed_dictionaries({"scale": st.sampled_from([0.2, 1.0, 16 / 6])}),
}
# Kernels with values in (0, 1], which must stay finite whatever the inputs' magnitude
# (polynomial and MGF kernels overflow on large dot products by definition).
BOUNDED_KERNELS = [
    ("gaussian", {}), ("gaussian", {"num_kernels": 1, "bandwidth": 2.0}), ("laplace", {}),
    ("laplace", {"bandwidth": 1.5}), ("imq", {"scale": 0.5}),
]


@st.composite
def kernel_inputs(draw, name: str):
    dtype = draw(DTYPES)
    n, m, d = draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 16))
    amplitude = draw(st.sampled_from([0.5, 2.0]))
    offset = 0.0 if name == "mgf" else draw(st.sampled_from([0.0, 0.0, 10.0]))
    x = draw(grid_points(n, d)) * amplitude + offset
    y = draw(grid_points(m, d)) * amplitude + offset
    if name == "mgf":  # meant for bounded inputs: keep |x . y| <= 4
        x, y = (p / max(1.0, np.linalg.norm(p, axis=1).max() / 2) for p in (x, y))
    return dtype, x, y


@pytest.mark.parametrize("name", sorted(KERNELS))
@given(data=st.data())
@fast(40)
def test_kernels_match_float64_reference_and_are_symmetric(name, data):
    params = data.draw(KERNEL_PARAMS[name], label="params")
    dtype, x, y = data.draw(kernel_inputs(name), label="inputs")
    kernel = build_kernel(name, **params)
    x_t, y_t = tensor(x, dtype, grad=True), tensor(y, dtype, grad=True)
    # the reference sees exactly the (rounded) inputs of the kernel
    x64, y64, eps = x_t.detach().double().numpy(), y_t.detach().double().numpy(), eps_of(dtype)

    k_xx, k_xy, k_yx = kernel(x_t), kernel(x_t, y_t), kernel(y_t, x_t)
    assert k_xx.dtype == k_xy.dtype == dtype
    assert k_xx.shape == (len(x), len(x)) and k_xy.shape == (len(x), len(y))
    assert all_finite(k_xx, k_xy)
    expected_xx, bound_xx = kernel_reference(name, params, x64, None, eps)
    expected_xy, bound_xy = kernel_reference(name, params, x64, y64, eps)
    assert_within_bound(k_xx, expected_xx, bound_xx, dtype, f"{name} K(x)")
    assert_within_bound(k_xy, expected_xy, bound_xy, dtype, f"{name} K(x, y)")
    # symmetry: K(x) = K(x)^T and K(x, y) = K(y, x)^T (the joint bandwidth is the same)
    assert_within_bound(k_xx.T, k_xx.detach().double().numpy(), 2 * bound_xx, dtype, "K(x)^T")
    assert_within_bound(k_yx.T, k_xy.detach().double().numpy(), 2 * bound_xy, dtype,
                        "K(y, x)^T")
    assert torch.equal(kernel(x_t, x_t), k_xx)  # the same tensor object is the one-sample case

    weights = torch.linspace(-1.0, 1.0, k_xy.numel(), dtype=dtype).reshape(k_xy.shape)
    grads = torch.autograd.grad((k_xy * weights).sum() + k_xx.sum(), (x_t, y_t))
    assert all_finite(*grads)


@pytest.mark.parametrize(("name", "params"), BOUNDED_KERNELS, ids=str)
@given(dtype=DTYPES, n=st.integers(1, 12), d=st.integers(1, 16), data=st.data(),
       magnitude=st.sampled_from([1e3, 1e6]), offset=st.sampled_from([0.0, 1.0]))
@fast(25)
def test_bounded_kernels_stay_finite_on_huge_and_collapsed_inputs(name, params, dtype, n, d,
                                                                  data, magnitude, offset):
    x = (data.draw(grid_points(n, d)) + offset) * magnitude
    y = (data.draw(grid_points(n, d)) + offset) * magnitude
    kernel = build_kernel(name, **params)
    x_t, y_t = tensor(x, dtype, grad=True), tensor(y, dtype, grad=True)
    for values in (kernel(x_t), kernel(x_t, y_t)):
        assert not torch.isnan(values).any()
        assert ((values >= 0) & (values <= 1)).all()
        grad_x, grad_y = torch.autograd.grad(values.sum(), (x_t, y_t), allow_unused=True)
        assert all_finite(*(g for g in (grad_x, grad_y) if g is not None))
    # the self-adaptive bandwidths make the kernels invariant to a scaling of the inputs
    if params.get("bandwidth") is None and name != "imq":
        small = tensor(x / magnitude, dtype)
        x64, eps = x_t.detach().double().numpy(), eps_of(dtype)
        expected, _ = kernel_reference(name, params, small.double().numpy(), None, eps)
        _, bound = kernel_reference(name, params, x64, None, eps)
        assert_within_bound(kernel(x_t), expected, bound, dtype, f"{name} K(a x) vs K(x)")


@given(dtype=DTYPES, n=st.integers(1, 12), m=st.integers(1, 12), d=st.integers(1, 16),
       data=st.data(), offset=st.sampled_from([0.0, 100.0]))
@fast(40)
def test_squared_distances_and_adaptive_bandwidth(dtype, n, m, d, data, offset):
    x = tensor(data.draw(grid_points(n, d)) + offset, dtype, grad=True)
    y = tensor(data.draw(grid_points(m, d)) + offset, dtype)
    eps = eps_of(dtype)
    for a, b in ((x, x), (x, y)):
        got = squared_distances(a, b)
        a64, b64 = a.detach().double().numpy(), b.detach().double().numpy()
        centre = (a64.mean(0) + b64.mean(0)) / 2
        norms = (((a64 - centre) ** 2).sum(1)[:, None] + ((b64 - centre) ** 2).sum(1)[None, :])
        assert (got >= 0).all()
        assert_within_bound(got, sq_dists(a64, b64), (d + 2) * norms + sq_dists(a64, b64),
                            dtype, "squared distances")
    self_dists = squared_distances(x, x)
    floor = resolution_floor(x, 2)
    assert floor.item() == pytest.approx(
        rounding_floor(x.detach().double().numpy(), 2, eps), rel=8 * eps * math.log2(n + 1))
    tau = adaptive_bandwidth(self_dists, floor)
    assert not tau.requires_grad and tau.dtype == dtype and tau.item() >= floor.item()
    expected = floored_mean_off_diagonal(self_dists.detach().double().numpy(), floor.item())
    assert tau.item() == pytest.approx(expected, rel=8 * eps * math.log2(n * n + 1) + 1e-15)
    assert all_finite(torch.autograd.grad(self_dists.sum(), x)[0])


# ----------------------------------------------------------------- joint regularizers


def floored_gaussian(num_kernels: int, eps: float):
    def make(points):
        tau = max(mean_over_pairs(points, sq_dist), rounding_floor(np.array(points), 2, eps))
        sigma2s = [tau * 2.0 ** (i - num_kernels // 2) for i in range(num_kernels)]
        return lambda a, b: sum(math.exp(-sq_dist(a, b) / s2) for s2 in sigma2s) / num_kernels

    return make


def floored_laplace(eps: float):
    def make(points):
        sigma = max(mean_over_pairs(points, l1_dist), rounding_floor(np.array(points), 1, eps))
        return lambda a, b: math.exp(-l1_dist(a, b) / sigma)

    return make


# name: (kernel factory, reference builder given the dtype's eps, bounded kernel?)
REG_KERNELS = {
    "gaussian3": (lambda: GaussianMixtureKernel(3), lambda eps: floored_gaussian(3, eps), True),
    "gaussian1": (lambda: GaussianMixtureKernel(1), lambda eps: floored_gaussian(1, eps), True),
    "laplace": (LaplaceKernel, floored_laplace, True),
    "imq": (lambda: InverseMultiquadricKernel(0.5), lambda eps: ref_imq, True),
    "polynomial": (lambda: PolynomialKernel(2, 1.0), lambda eps: ref_polynomial, False),
}
JOINT_REFERENCES = {
    JointRepresentationSimilarity: ref_jrs, JointMMD: ref_jmmd, JointIntra: ref_jintra,
}


@st.composite
def labelled_layers(draw, n_min: int = 1, n_max: int = 10, max_layers: int = 3):
    n = draw(st.integers(n_min, n_max))
    dims = draw(st.lists(st.integers(1, 5), min_size=1, max_size=max_layers))
    layers = [draw(grid_points(n, d)) * 2 + draw(st.sampled_from([0.0, 5.0])) for d in dims]
    return layers, draw(class_labels(n))


def joint_scale(layers, labels, builders) -> float:
    """Largest |prod_l k^l(x_i, x_j)|: the magnitude the regularizers' errors scale with."""
    kernels = [build(points) for build, points in zip(builders, layers, strict=True)]
    n = len(labels)
    return max(abs(math.prod(k(p[i], p[j]) for k, p in zip(kernels, layers, strict=True)))
               for i in range(n) for j in range(n))


@pytest.mark.parametrize("regularizer_class", list(JOINT_REFERENCES), ids=lambda c: c.__name__)
@given(dtype=DTYPES, batch=labelled_layers(), data=st.data())
@fast(30)
def test_joint_regularizers_match_reference_and_are_permutation_invariant(
        regularizer_class, dtype, batch, data):
    layers, labels = batch
    names = data.draw(st.lists(st.sampled_from(sorted(REG_KERNELS)), min_size=len(layers),
                               max_size=len(layers)), label="kernels")
    regularizer = regularizer_class([REG_KERNELS[name][0]() for name in names])
    reps = [tensor(layer, dtype, grad=True) for layer in layers]
    label_tensor = torch.from_numpy(labels)
    value = regularizer(reps, label_tensor)
    assert value.shape == () and all_finite(value)
    assert all_finite(*torch.autograd.grad(value, reps))

    eps = eps_of(dtype)
    points = [r.detach().double().tolist() for r in reps]
    builders = [REG_KERNELS[name][1](eps) for name in names]
    expected = JOINT_REFERENCES[regularizer_class](points, labels.tolist(), builders)
    tol = (2e-4 if dtype == torch.float32 else 1e-10) * joint_scale(points, labels, builders)
    assert value.item() == pytest.approx(expected, rel=1e-9, abs=tol)

    perm = torch.tensor(data.draw(st.permutations(range(len(labels))), label="perm"))
    permuted = regularizer([r[perm] for r in reps], label_tensor[perm])
    assert permuted.item() == pytest.approx(value.item(), rel=1e-9, abs=tol)


@given(dtype=DTYPES, batch=labelled_layers(max_layers=1), data=st.data(),
       kernel=st.sampled_from([None, "gaussian3", "laplace"]))
@fast(40)
def test_intra_class_penalty_matches_eq4_and_is_permutation_invariant(dtype, batch, data,
                                                                      kernel):
    (layer,), labels = batch
    penalty = IntraClassPenalty(None if kernel is None else REG_KERNELS[kernel][0]())
    emb = tensor(layer, dtype, grad=True)
    value = penalty([emb], torch.from_numpy(labels))
    assert all_finite(value, torch.autograd.grad(value, emb)[0])
    points = emb.detach().double().tolist()
    if kernel is None:
        expected = ref_intra_penalty(points, labels.tolist())
    else:
        k = REG_KERNELS[kernel][1](eps_of(dtype))(points)
        expected = -sum(
            sum(k(points[i], points[j]) for i in idx for j in idx if i != j)
            / (len(idx) * (len(idx) - 1))
            for idx in class_members(labels.tolist()).values() if len(idx) > 1)
    num_classes = len(set(labels.tolist()))
    tol = (1e-4 if dtype == torch.float32 else 1e-12) * num_classes
    assert value.item() == pytest.approx(expected, rel=1e-9, abs=tol)
    assert -num_classes - tol <= value.item() <= 0.0  # a sum of -mean kernels in (0, 1]
    perm = torch.tensor(data.draw(st.permutations(range(len(labels)))))
    assert penalty([emb[perm]], torch.from_numpy(labels)[perm]).item() == pytest.approx(
        value.item(), rel=1e-9, abs=tol)


@pytest.mark.parametrize("regularizer_class", list(JOINT_REFERENCES), ids=lambda c: c.__name__)
@given(dtype=DTYPES, batch=labelled_layers(max_layers=2), data=st.data(),
       magnitude=st.sampled_from([1e3, 1e6]))
@fast(15)
def test_regularizers_stay_finite_on_huge_embeddings(regularizer_class, dtype, batch, data,
                                                     magnitude):
    layers, labels = batch
    bounded = sorted(name for name, (_, _, is_bounded) in REG_KERNELS.items() if is_bounded)
    names = data.draw(st.lists(st.sampled_from(bounded), min_size=len(layers),
                               max_size=len(layers)))
    reps = [tensor(layer * magnitude, dtype, grad=True) for layer in layers]
    label_tensor = torch.from_numpy(labels)
    for regularizer in (regularizer_class([REG_KERNELS[name][0]() for name in names]),
                        IntraClassPenalty()):
        value = regularizer(reps, label_tensor)
        assert all_finite(value)
        grads = torch.autograd.grad(value, reps, allow_unused=True)
        assert all_finite(*(g for g in grads if g is not None))


# ----------------------------------------------------------------- marginal Fisher, DomainMMD


@given(dtype=DTYPES, batch=labelled_layers(max_layers=1), k1=st.integers(1, 4),
       k2=st.integers(1, 5), alpha=st.sampled_from([0.0, 0.1, 1.0]), data=st.data(),
       magnitude=st.sampled_from([1.0, 1.0, 1e6]))
@fast(50)
def test_marginal_fisher_matches_reference_and_is_permutation_invariant(
        dtype, batch, k1, k2, alpha, data, magnitude):
    (layer,), labels = batch
    loss = MarginalFisherLoss(k1=k1, k2=k2, alpha=alpha)
    emb = tensor(layer * magnitude, dtype, grad=True)
    label_tensor = torch.from_numpy(labels)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small classes: k1 / k2 clamped, warned once
        value = loss(emb, label_tensor)
        perm = torch.tensor(data.draw(st.permutations(range(len(labels)))))
        permuted = loss(emb[perm], label_tensor[perm])
    assert all_finite(value, torch.autograd.grad(value, emb)[0])
    points = emb.detach().double().tolist()
    ref_c, ref_b = ref_fisher_terms(points, labels.tolist(), k1, k2)
    max_d2 = float(sq_dists(np.array(points), np.array(points)).max())
    tol = (1e-5 if dtype == torch.float32 else 1e-12) * (1.0 + max_d2)
    assert value.item() == pytest.approx(ref_c - alpha * ref_b, rel=1e-9, abs=tol)
    assert permuted.item() == pytest.approx(value.item(), rel=1e-9, abs=tol)


DOMAIN_KERNELS = [None, ("gaussian", {}), ("gaussian", {"num_kernels": 1, "bandwidth": 2.0}),
                  ("laplace", {}), ("imq", {"scale": 1.0}),
                  ("polynomial", {"degree": 1, "bias": 0.0})]


@pytest.mark.parametrize("spec", DOMAIN_KERNELS, ids=str)
@given(dtype=DTYPES, ns=st.integers(1, 8), nt=st.integers(1, 8), d=st.integers(1, 6),
       data=st.data(), magnitude=st.sampled_from([1.0, 1.0, 1e6]))
@fast(25)
def test_domain_mmd_matches_reference_is_nonnegative_and_permutation_invariant(
        spec, dtype, ns, nt, d, data, magnitude):
    if spec is not None and spec[0] == "polynomial":
        magnitude = 1.0  # the linear kernel's values grow with the embeddings
    source = tensor(data.draw(grid_points(ns, d)) * magnitude, dtype, grad=True)
    target = tensor((data.draw(grid_points(nt, d)) + data.draw(st.sampled_from([0.0, 0.5])))
                    * magnitude, dtype, grad=True)
    mmd = DomainMMD(None if spec is None else build_kernel(spec[0], **spec[1]))
    value = mmd(source, target)
    assert all_finite(value, *torch.autograd.grad(value, (source, target)))
    s64, t64 = source.detach().double().numpy(), target.detach().double().numpy()
    eps = eps_of(dtype)
    if spec is None:
        expected = ref_linear_mmd(s64.tolist(), t64.tolist())
        scale = float((np.concatenate([s64, t64]) ** 2).sum(1).max())
        tol = 64 * eps * (d + 2) * scale
    else:
        joint, bound = kernel_reference(spec[0], spec[1], np.concatenate([s64, t64]), None, eps)
        expected = (joint[:ns, :ns].mean() + joint[ns:, ns:].mean()
                    - 2.0 * joint[:ns, ns:].mean())
        tol = 4 * 32 * eps * float(bound.max()) + 8 * eps * float(np.abs(joint).max())
    assert value.item() == pytest.approx(expected, abs=tol, rel=1e-9)
    assert value.item() >= -tol  # a squared RKHS norm
    perm_s = torch.tensor(data.draw(st.permutations(range(ns))))
    perm_t = torch.tensor(data.draw(st.permutations(range(nt))))
    assert mmd(source[perm_s], target[perm_t]).item() == pytest.approx(value.item(), rel=1e-9,
                                                                       abs=tol)


# ----------------------------------------------------------------- Atlas regularizers


@st.composite
def atlas_batches(draw, n_min: int = 2, n_max: int = 8):
    num_points = draw(st.integers(n_min, n_max))
    n_charts, dim = draw(st.integers(1, 3)), draw(st.integers(1, 4))
    coords = draw(grid_points(num_points, n_charts * dim)).reshape(num_points, n_charts, dim)
    q = draw(memberships(num_points, n_charts))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    prior = rng.random((draw(st.integers(2, 8)), dim))
    prior[0, 0] = draw(st.sampled_from([0.0, 1.0, 0.5]))  # exact 0 / 1 are clamped
    return coords * 3.0, q, prior


@given(dtype=DTYPES, batch=atlas_batches(), data=st.data())
@fast(40)
def test_manifold_mmd_matches_eq5_and_is_permutation_invariant(dtype, batch, data):
    coords_np, q_np, prior_np = batch
    num_points, n_charts, dim = coords_np.shape
    mmd = ManifoldMMD(dim, n_charts)
    coords = tensor(coords_np, dtype, grad=True)
    q, prior = tensor(q_np, dtype, grad=True), tensor(prior_np, dtype)
    value = mmd(coords, q, prior_sample=prior)
    assert all_finite(value, *torch.autograd.grad(value, (coords, q)))
    expected = literal_eq5(coords.detach().double().tolist(), q.detach().double().tolist(),
                           prior.double().tolist())
    tol = 1e-4 if dtype == torch.float32 else 1e-12
    assert value.item() == pytest.approx(expected, rel=1e-9, abs=tol)
    perm = torch.tensor(data.draw(st.permutations(range(num_points))))
    permuted = mmd(coords[perm], q[perm], prior_sample=prior)
    assert permuted.item() == pytest.approx(value.item(), rel=1e-9, abs=tol)
    if n_charts == 1:  # q = 1: plain embeddings, the Euclidean MMD of Sec. 3.2.2
        plain = mmd(coords[:, 0], prior_sample=prior)
        assert plain.item() == pytest.approx(value.item(), rel=1e-9, abs=tol)
    # huge coordinates: finite value and gradients (float32 loses the value itself: the
    # |a|^2 + |b|^2 - 2ab expansion cancels catastrophically next to the prior's logits)
    huge = tensor(coords_np * 1e6, dtype, grad=True)
    value = mmd(huge, q, prior_sample=prior)
    assert all_finite(value, *torch.autograd.grad(value, (huge, q)))


@given(dtype=DTYPES, num_points=st.integers(1, 8), n_charts=st.integers(1, 5), data=st.data())
@fast(40)
def test_chart_membership_loss_matches_l_j_bounds_and_permutations(dtype, num_points,
                                                                   n_charts, data):
    q = tensor(data.draw(memberships(num_points, n_charts)), dtype, grad=True)
    loss = ChartMembershipLoss()
    value = loss(q)
    assert all_finite(value, torch.autograd.grad(value, q)[0])
    tol = 1e-6 if dtype == torch.float32 else 1e-14
    assert value.item() == pytest.approx(literal_chart_loss(q.detach().double().tolist()),
                                         rel=1e-9, abs=tol)
    assert -(1 - 1 / n_charts) - tol <= value.item() <= tol  # one-hot .. uniform
    perm = torch.tensor(data.draw(st.permutations(range(num_points))))
    assert loss(q[perm]).item() == pytest.approx(value.item(), rel=1e-9, abs=tol)


@given(dtype=DTYPES, n1=st.integers(1, 6), n2=st.integers(1, 6), n_charts=st.integers(1, 4),
       dim=st.integers(1, 3), variant=st.sampled_from(["paper", "code"]),
       d0=st.sampled_from([None, "euclidean", "squared", "mean_squared"]), data=st.data())
@fast(40)
def test_manifold_distance_matches_eq7_symmetry_and_permutations(dtype, n1, n2, n_charts, dim,
                                                                 variant, d0, data):
    q1 = tensor(data.draw(memberships(n1, n_charts)), dtype, grad=True)
    q2 = tensor(data.draw(memberships(n2, n_charts)), dtype, grad=True)
    c1 = tensor(data.draw(grid_points(n1, n_charts * dim)).reshape(n1, n_charts, dim) * 3,
                dtype, grad=True)
    c2 = tensor(data.draw(grid_points(n2, n_charts * dim)).reshape(n2, n_charts, dim) * 3,
                dtype, grad=True)
    got = manifold_distance(q1, c1, q2, c2, d0=d0, variant=variant)
    expected = torch.tensor(literal_manifold_distance(
        q1.detach().double().tolist(), c1.detach().double().tolist(),
        q2.detach().double().tolist(), c2.detach().double().tolist(), variant, d0),
        dtype=torch.float64)
    assert not torch.isnan(got).any()
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    finite = torch.isfinite(expected)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got.double()[finite], expected[finite], rtol=tol, atol=tol)
    transposed = manifold_distance(q2, c2, q1, c1, d0=d0, variant=variant)
    torch.testing.assert_close(transposed.T, got, rtol=tol, atol=tol)
    p1 = torch.tensor(data.draw(st.permutations(range(n1))))
    p2 = torch.tensor(data.draw(st.permutations(range(n2))))
    permuted = manifold_distance(q1[p1], c1[p1], q2[p2], c2[p2], d0=d0, variant=variant)
    torch.testing.assert_close(permuted, got[p1][:, p2], rtol=tol, atol=tol)
    finite_part = torch.where(torch.isfinite(got), got, 0.0).sum()
    assert all_finite(*torch.autograd.grad(finite_part, (q1, c1, q2, c2)))


@given(num_points=st.integers(1, 8), n_charts=st.integers(1, 4), dim=st.integers(1, 3),
       data=st.data())
@fast(30)
def test_compressed_code_takes_the_first_argmax_chart_and_commutes_with_permutations(
        num_points, n_charts, dim, data):
    mode = data.draw(st.sampled_from(["memberships", "tied"]))
    if mode == "tied":  # exact ties between charts: the first maximal chart wins
        q_np = data.draw(arrays(np.int64, (num_points, n_charts), elements=st.integers(0, 2)))
        q_np = q_np.astype(np.float64)
    else:
        q_np = data.draw(memberships(num_points, n_charts))
    coords = torch.tensor(data.draw(grid_points(num_points, n_charts * dim))).reshape(
        num_points, n_charts, dim)
    q = torch.tensor(q_np)
    chart_coords, chart_index = compressed_code(ChartOutputs(coords, q))
    expected_index = [row.index(max(row)) for row in q_np.tolist()]
    assert chart_index.tolist() == expected_index
    assert torch.equal(chart_coords, coords[torch.arange(num_points), chart_index])
    perm = torch.tensor(data.draw(st.permutations(range(num_points))))
    permuted_coords, permuted_index = compressed_code(ChartOutputs(coords[perm], q[perm]))
    assert torch.equal(permuted_index, chart_index[perm])
    assert torch.equal(permuted_coords, chart_coords[perm])


# ----------------------------------------------------------------- retrieval metrics


EXACT_LAYOUTS = ("free", "duplicated", "rays", "collapsed")  # integer points once doubled


def to_input(points: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    return points.astype(np.float32 if dtype == torch.float32 else np.float64)


@given(n=st.integers(2, 7), d=st.integers(1, 3), metric=METRICS, dtype=DTYPES, data=st.data())
@fast(200)
def test_retrieval_tie_rule_is_the_average_over_all_orders(n, d, metric, dtype, data):
    """Small integer points: ranks are exact (ints / rationals), ties are common."""
    points = data.draw(grid_points(n, d, span=2, layouts=EXACT_LAYOUTS))
    points = np.rint(points * 2).astype(np.int64)
    labels = data.draw(retrieval_labels(n))
    ks = data.draw(ks_for(n - 1))
    got = retrieval_metrics(to_input(points, dtype), labels, ks=ks, metric=metric, nmi=False)
    expected = enumerated_retrieval(rank_keys(points, metric), labels, ks)
    assert_metrics_equal(got, expected, "tie rule")
    assert_unit_interval(got)


@given(n=st.integers(2, 24), d=st.integers(1, 6), metric=METRICS,
       seed=st.integers(0, 2**32 - 1), data=st.data(), separate=st.booleans())
@fast(40)
def test_retrieval_matches_brute_force_without_ties(n, d, metric, seed, data, separate):
    assume(metric == "euclidean" or d > 1)  # 1-d directions are +-1: tied by nature
    rng = np.random.default_rng(seed)
    embeddings = rng.standard_normal((n, d)) * rng.uniform(0.1, 10)
    labels = data.draw(retrieval_labels(n, num_classes=4))
    if separate:
        reference = rng.standard_normal((data.draw(st.integers(1, 12)), d))
        reference_labels = data.draw(arrays(np.int64, len(reference),
                                            elements=st.integers(0, 3)))
        if not np.isin(labels, reference_labels).any():
            reference_labels[0] = labels[0]
        keys = rank_keys(embeddings, metric, reference)
        kwargs = {"reference": reference, "reference_labels": reference_labels}
    else:
        keys, kwargs = rank_keys(embeddings, metric), {}
    assume(min_relative_gap(keys, exclude_self=not separate) > 1e-4)  # no near tie
    ks = data.draw(ks_for(len(keys[0]) - int(not separate)))
    got = retrieval_metrics(embeddings, labels, ks=ks, metric=metric, nmi=False, **kwargs)
    expected = brute_force_metrics(embeddings, labels, ks, metric, *kwargs.values())
    assert_metrics_equal(got, expected, "brute force")
    assert_unit_interval(got)


@given(n=st.integers(2, 30), d=st.integers(1, 5), metric=METRICS, dtype=DTYPES,
       data=st.data())
@fast(100)
def test_retrieval_is_invariant_to_permutations_and_positive_scalings(n, d, metric, dtype,
                                                                       data):
    points = data.draw(grid_points(n, d))
    labels = data.draw(retrieval_labels(n))
    ks = data.draw(ks_for(n - 1))
    nmi = data.draw(st.booleans())
    base = retrieval_metrics(to_input(points, dtype), labels, ks=ks, metric=metric, nmi=nmi)
    assert_unit_interval(base)
    base.pop("nmi", None)  # k-means: see test_nmi_is_invariant_to_permutations
    perm = np.array(data.draw(st.permutations(range(n))))
    permuted = retrieval_metrics(to_input(points[perm], dtype), labels[perm], ks=ks,
                                 metric=metric, nmi=False)
    assert_metrics_equal(permuted, base, "permutation")
    factor = data.draw(st.sampled_from(EXACT_FACTORS[dtype]))
    scaled = retrieval_metrics(to_input(points * factor, dtype), labels, ks=ks, metric=metric,
                               nmi=False)
    assert_metrics_equal(scaled, base, f"scaling by {factor}")


@given(n=st.integers(2, 7), d=st.integers(1, 3), metric=METRICS, data=st.data())
@fast(200)
def test_retrieval_ranks_the_given_values_exactly(n, d, metric, data):
    """Grid points scaled by a factor that rounds them to float32 (3.7, 1e19, 0.01): their
    exact ties become orders a few float32 ulps apart, which the float32 search cannot resolve
    and kdml's float64 re-scoring does. The literal ranks the given floats as exact rationals.
    (Float32 inputs: their float64 keys are far more accurate than their gaps. Float64 inputs
    whose exact keys differ by a few float64 ulps are tied, the documented limit.)"""
    points = data.draw(grid_points(n, d, span=2, layouts=EXACT_LAYOUTS))
    factor = data.draw(st.sampled_from(FACTORS[torch.float32]))
    given = to_input(points * factor, torch.float32)
    labels = data.draw(retrieval_labels(n))
    ks = data.draw(ks_for(n - 1))
    got = retrieval_metrics(given, labels, ks=ks, metric=metric, nmi=False)
    expected = enumerated_retrieval(rank_keys(given, metric, exact_floats=True), labels, ks)
    assert_metrics_equal(got, expected, f"scaled by {factor}")


@given(n=st.integers(2, 7), d=st.integers(1, 3), dtype=DTYPES, data=st.data())
@fast(200)
def test_chart_retrieval_tie_rule_with_empty_and_single_point_charts(n, d, dtype, data):
    points = data.draw(grid_points(n, d, span=2, layouts=EXACT_LAYOUTS))
    points = np.rint(points * 2).astype(np.int64)
    # chart ids with gaps (and a negative one): most ids hold no point, some hold one
    charts = data.draw(arrays(np.int64, n, elements=st.sampled_from([-4, 0, 3, 100])))
    labels = data.draw(retrieval_labels(n))
    ks = data.draw(ks_for(n - 1))
    got = chart_retrieval_metrics(to_input(points, dtype), charts, labels, ks=ks, nmi=False)
    expected = enumerated_retrieval(rank_keys(points, "euclidean"), labels, ks, charts=charts)
    assert_metrics_equal(got, expected, "chart tie rule")
    assert_unit_interval(got)


@given(n=st.integers(2, 16), d=st.integers(1, 3), seed=st.integers(0, 2**32 - 1),
       data=st.data())
@fast(25)
def test_chart_retrieval_matches_the_manifold_distance_brute_force(n, d, seed, data):
    rng = np.random.default_rng(seed)
    coords = rng.standard_normal((n, d))
    charts = data.draw(arrays(np.int64, n, elements=st.sampled_from([0, 2, 5])))
    assume(min_relative_gap(rank_keys(coords, "euclidean"), charts=charts) > 1e-4)
    labels = data.draw(retrieval_labels(n))
    ks = data.draw(ks_for(n - 1))
    distances = full_manifold_distances(coords, charts, 6, rng)
    expected = chart_brute_force_metrics(distances, labels.tolist(), ks)
    got = chart_retrieval_metrics(coords, charts, labels, ks=ks, nmi=False)
    assert_metrics_equal(got, expected, "manifold brute force")


@given(n=st.integers(2, 30), d=st.integers(1, 4), dtype=DTYPES, data=st.data())
@fast(100)
def test_chart_retrieval_is_invariant_to_permutations_and_positive_scalings(n, d, dtype,
                                                                             data):
    points = data.draw(grid_points(n, d))
    charts = data.draw(arrays(np.int64, n, elements=st.sampled_from([-4, 0, 3, 100])))
    labels = data.draw(retrieval_labels(n))
    ks = data.draw(ks_for(n - 1))
    nmi = data.draw(st.booleans())
    base = chart_retrieval_metrics(to_input(points, dtype), charts, labels, ks=ks, nmi=nmi)
    assert_unit_interval(base)
    base.pop("nmi", None)
    perm = np.array(data.draw(st.permutations(range(n))))
    permuted = chart_retrieval_metrics(to_input(points[perm], dtype), charts[perm],
                                       labels[perm], ks=ks, nmi=False)
    assert_metrics_equal(permuted, base, "permutation")
    factor = data.draw(st.sampled_from(EXACT_FACTORS[dtype]))
    scaled = chart_retrieval_metrics(to_input(points * factor, dtype), charts, labels, ks=ks,
                                     nmi=False)
    assert_metrics_equal(scaled, base, f"scaling by {factor}")


@given(n=st.integers(3, 12), data=st.data())
@example(n=0, data=None)  # the inputs that once failed
@fast(5)
def test_nmi_is_invariant_to_permutations(n, data):
    """The NMI of ``retrieval_metrics`` and ``chart_retrieval_metrics`` does not depend on the
    order of the samples (k-means runs in an order fixed by the points' values). These inputs
    once failed: points [2, -1, -1] labelled [1, 1, 0] (0.0 vs 0.274 reversed) and points
    [2, 0, 1] labelled [1, 0, 1] in one chart (1.0 vs 0.274 reversed)."""
    if data is None:
        cases = [(np.array([[2.0], [-1.0], [-1.0]]), np.array([1, 1, 0]), np.zeros(3, int)),
                 (np.array([[2.0], [0.0], [1.0]]), np.array([1, 0, 1]), np.ones(3, int))]
    else:
        cases = [(data.draw(grid_points(n, 1)), data.draw(retrieval_labels(n)),
                  data.draw(arrays(np.int64, n, elements=st.integers(0, 1))))]
    for points, labels, charts in cases:
        reverse = np.arange(len(labels))[::-1]
        plain = [retrieval_metrics(points[o], labels[o], ks=(1,), metric="euclidean")["nmi"]
                 for o in (slice(None), reverse)]
        chart = [chart_retrieval_metrics(points[o], charts[o], labels[o], ks=(1,))["nmi"]
                 for o in (slice(None), reverse)]
        assert plain[0] == pytest.approx(plain[1], abs=1e-12)
        assert chart[0] == pytest.approx(chart[1], abs=1e-12)


@given(n=st.integers(2, 40), data=st.data())
@example(n=0, data=None)  # the input that once failed
@fast(10)
def test_nmi_is_at_most_one(n, data):
    """NMI stays in [0, 1]; a perfect clustering of 30 points in classes of 2 and 28 once
    scored ``1.0000000000000002`` (``normalized_mutual_info_score``'s rounding)."""
    if data is None:
        points = np.concatenate([[[10.0], [10.0]], np.linspace(0.0, 1.0, 28)[:, None]])
        labels = np.array([1, 1] + [0] * 28)
    else:  # two well separated classes
        labels = data.draw(retrieval_labels(n, num_classes=2))
        points = labels[:, None] * 10.0 + data.draw(grid_points(n, 1)) / 4
    charts = np.zeros(len(labels), dtype=np.int64)
    for score in (retrieval_metrics(points, labels, ks=(1,), metric="euclidean")["nmi"],
                  chart_retrieval_metrics(points, charts, labels, ks=(1,))["nmi"]):
        assert 0.0 <= score <= 1.0, score


# ----------------------------------------------------------------- piecewise linear probe


@given(n_train=st.integers(1, 16), n_test=st.integers(1, 10), d=st.integers(1, 3),
       seed=st.integers(0, 2**32 - 1), sigmoid=st.booleans(), data=st.data())
@fast(20)
def test_piecewise_linear_accuracy_in_unit_interval_and_permutation_invariant(
        n_train, n_test, d, seed, sigmoid, data):
    rng = np.random.default_rng(seed)
    train_x, test_x = rng.standard_normal((n_train, d)), rng.standard_normal((n_test, d))
    # chart ids with gaps; charts with train points only, with test points only (9)
    train_c = data.draw(arrays(np.int64, n_train, elements=st.sampled_from([0, 2, 7])))
    test_c = data.draw(arrays(np.int64, n_test, elements=st.sampled_from([0, 2, 7, 9])))
    train_y = data.draw(arrays(np.int64, n_train, elements=st.sampled_from([0, 1, 1, 2])))
    test_y = data.draw(arrays(np.int64, n_test, elements=st.integers(0, 2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # lbfgs convergence on separable toy data
        result = piecewise_linear_accuracy(train_x, train_c, train_y, test_x, test_c, test_y,
                                           sigmoid=sigmoid)
        p_train = np.array(data.draw(st.permutations(range(n_train))))
        p_test = np.array(data.draw(st.permutations(range(n_test))))
        permuted = piecewise_linear_accuracy(train_x[p_train], train_c[p_train],
                                             train_y[p_train], test_x[p_test], test_c[p_test],
                                             test_y[p_test], sigmoid=sigmoid)
    assert 0.0 <= result["accuracy"] <= 1.0
    assert result["num_test"] == n_test
    assert result["accuracy"] == result["num_correct"] / n_test
    assert sum(c["num_correct"] for c in result["charts"]) == result["num_correct"]
    assert permuted == result
    # charts without a fitted classifier, literally
    values, counts = np.unique(train_y, return_counts=True)
    majority = values[np.argmax(counts)]
    for chart in result["charts"]:
        in_train, in_test = train_c == chart["chart"], test_c == chart["chart"]
        chart_labels = set(train_y[in_train].tolist())
        assert (chart["num_train"], chart["num_test"]) == (in_train.sum(), in_test.sum())
        if not in_test.any():
            assert chart["classifier"] == "none" and chart["num_correct"] == 0
        elif len(chart_labels) >= 2:
            assert chart["classifier"] == "logistic"
        else:
            assert chart["classifier"] == ("single-class" if chart_labels else "majority")
            constant = chart_labels.pop() if chart_labels else majority
            assert chart["num_correct"] == int((test_y[in_test] == constant).sum())


# ----------------------------------------------------------------- source-NN accuracy


@st.composite
def transfer_sets(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    ns, nt, d = draw(st.integers(1, 12)), draw(st.integers(1, 8)), draw(st.integers(1, 4))
    source, target = rng.standard_normal((ns, d)), rng.standard_normal((nt, d)) + 0.3
    source_y = draw(arrays(np.int64, ns, elements=st.integers(0, 2)))
    target_y = draw(arrays(np.int64, nt, elements=st.integers(-1, 2)))
    if (target_y < 0).all():
        target_y[0] = 0
    return source, source_y, target, target_y


@given(sets=transfer_sets(), metric=METRICS, data=st.data(),
       factor=st.sampled_from([3.7, 0.01, 1e3]))
@fast(40)
def test_source_nn_accuracy_matches_vote_and_is_invariant(sets, metric, data, factor):
    source, source_y, target, target_y = sets
    assume(metric == "euclidean" or source.shape[1] > 1)  # 1-d directions all tie
    # no near tie: float32 neighbours are float64's
    assume(min_relative_gap(rank_keys(target, metric, source), exclude_self=False) > 1e-4)
    k = data.draw(st.integers(1, len(source)))
    got = source_nn_accuracy(source, source_y, target, target_y, k=k, metric=metric)
    assert 0.0 <= got <= 1.0
    assert got == pytest.approx(nn_vote_accuracy(source, source_y, target, target_y, k, metric),
                                abs=1e-12)
    p_s = np.array(data.draw(st.permutations(range(len(source)))))
    p_t = np.array(data.draw(st.permutations(range(len(target)))))
    assert source_nn_accuracy(source[p_s], source_y[p_s], target[p_t], target_y[p_t], k=k,
                              metric=metric) == pytest.approx(got, abs=1e-12)
    assert source_nn_accuracy(source * factor, source_y, target * factor, target_y, k=k,
                              metric=metric) == pytest.approx(got, abs=1e-12)


@given(sets=transfer_sets(), factor=st.sampled_from([1e-30, 1e19, 1e200]))
@example(sets=(np.array([[0.0], [10.0]]), np.array([0, 1]), np.array([[4.0], [6.0]]),
               np.array([0, 1])), factor=1e-30)  # once failed: the sets were rescaled apart
@fast(10)
def test_source_nn_accuracy_is_invariant_to_extreme_scalings(sets, factor):
    source, source_y, target, target_y = sets
    got = source_nn_accuracy(source, source_y, target, target_y, metric="euclidean")
    scaled = source_nn_accuracy(source * factor, source_y, target * factor, target_y,
                                metric="euclidean")
    assert scaled == pytest.approx(got, abs=1e-12)


@given(metric=METRICS)
@example(metric="euclidean")
@fast(2)
def test_source_nn_accuracy_is_invariant_to_permutations_with_tied_sources(metric):
    source = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 5.0]])  # two copies, different labels
    source_y = np.array([0, 1, 2])
    target, target_y = np.array([[2.0, 0.0]]), np.array([0])
    got = source_nn_accuracy(source, source_y, target, target_y, metric=metric)
    swapped = source_nn_accuracy(source[[1, 0, 2]], source_y[[1, 0, 2]], target, target_y,
                                 metric=metric)
    assert swapped == pytest.approx(got, abs=1e-12)
    assert got == pytest.approx(0.5)  # the tie counts as its expectation
