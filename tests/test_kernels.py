"""Kernels against their formulas, written out with plain Python loops over pairs."""

from __future__ import annotations

import doctest
import math
import re
from pathlib import Path

import pytest
import torch
from torch.autograd import gradcheck, gradgradcheck

from kdml import kernels as kernels_module
from kdml.errors import KdmlError
from kdml.kernels import (
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    LaplaceKernel,
    MomentGeneratingKernel,
    PolynomialKernel,
    adaptive_bandwidth,
    build_kernel,
    l1_distances,
    resolution_floor,
    smallest_bandwidth,
    squared_distances,
)

# ----------------------------------------------------------------- literal references


def sq_dist(a: list[float], b: list[float]) -> float:
    return sum((ai - bi) ** 2 for ai, bi in zip(a, b, strict=True))


def l1_dist(a: list[float], b: list[float]) -> float:
    return sum(abs(ai - bi) for ai, bi in zip(a, b, strict=True))


def dot(a: list[float], b: list[float]) -> float:
    return sum(ai * bi for ai, bi in zip(a, b, strict=True))


def mean_over_pairs(points: list[list[float]], dist) -> float:
    """Mean distance over ordered pairs of different points (the adaptive bandwidth)."""
    values = [dist(p, q) for i, p in enumerate(points) for j, q in enumerate(points) if i != j]
    return sum(values) / len(values)


def gaussian_mixture(a, b, tau: float, num_kernels: int, multiplier: float) -> float:
    sigma2s = [tau * multiplier ** (i - num_kernels // 2) for i in range(num_kernels)]
    return sum(math.exp(-sq_dist(a, b) / s2) for s2 in sigma2s) / num_kernels


def loop_matrix(xs, ys, k) -> torch.Tensor:
    return torch.tensor([[k(a, b) for b in ys] for a in xs], dtype=torch.float64)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


@pytest.fixture
def y() -> torch.Tensor:
    return torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


# ----------------------------------------------------------------- bandwidth


def test_adaptive_bandwidth_is_mean_over_off_diagonal_pairs(x):
    points = x.tolist()
    sq_dists = loop_matrix(points, points, sq_dist)
    expected = mean_over_pairs(points, sq_dist)
    assert adaptive_bandwidth(sq_dists).item() == pytest.approx(expected, rel=1e-12)
    assert adaptive_bandwidth(squared_distances(x, x)).item() == pytest.approx(expected, rel=1e-12)


def test_adaptive_bandwidth_is_detached_and_floored(x):
    x = x.clone().requires_grad_()
    assert not adaptive_bandwidth(squared_distances(x, x)).requires_grad
    smallest = torch.finfo(torch.float64).tiny / torch.finfo(torch.float64).eps
    assert smallest == smallest_bandwidth(torch.float64)
    assert adaptive_bandwidth(torch.zeros(5, 5, dtype=torch.float64)).item() == smallest
    assert adaptive_bandwidth(torch.zeros(1, 1, dtype=torch.float64)).item() == smallest
    assert adaptive_bandwidth(torch.zeros(5, 5, dtype=torch.float64), 0.25).item() == 0.25
    assert adaptive_bandwidth(torch.full((2, 2), 3.0) - 3 * torch.eye(2), 0.25).item() == 3.0
    with pytest.raises(KdmlError):
        adaptive_bandwidth(torch.zeros(3, 4))


def test_the_resolution_floor_is_the_points_own_rounding():
    points = torch.tensor([[3.0, -4.0], [0.0, 0.0]])  # mean |p|^2 = 12.5, mean |p|_1 = 3.5
    eps = torch.finfo(torch.float32).eps
    assert resolution_floor(points, 2).item() == pytest.approx(eps * 12.5, rel=1e-6)
    assert resolution_floor(points, 1).item() == pytest.approx(math.sqrt(eps) * 3.5, rel=1e-6)
    unit = torch.nn.functional.normalize(torch.randn(5, 8), dim=1)  # the fixed floor kdml had
    assert resolution_floor(unit, 2).item() == pytest.approx(eps, rel=1e-6)
    smallest = torch.finfo(torch.float32).tiny / eps
    assert resolution_floor(torch.zeros(3, 2), 2).item() == pytest.approx(smallest, rel=1e-6)
    assert resolution_floor(torch.zeros(0, 2), 1).item() == pytest.approx(smallest, rel=1e-6)


def test_half_precision_bandwidths_and_floors_do_not_overflow_in_their_sums():
    """adaptive_bandwidth and resolution_floor summed float16 inputs in float16: 100 points'
    squared distances, of mean 16, summed past 65504 and gave tau = inf (kernels of 1), and
    points of 300 squared to inf and gave a floor of inf where it is 176. Both sum in float32
    now and return the inputs' dtype."""
    points = torch.randn(100, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    sq_dists = squared_distances(points, points)
    tau = adaptive_bandwidth(sq_dists.half())
    assert tau.dtype == torch.float16
    assert tau.item() == pytest.approx(adaptive_bandwidth(sq_dists).item(), rel=1e-3)
    large = torch.full((4, 2), 300.0, dtype=torch.float64)
    floor = resolution_floor(large.half(), 2)
    assert floor.dtype == torch.float16
    assert floor.item() == pytest.approx(torch.finfo(torch.float16).eps * 180000, rel=1e-3)


@pytest.mark.parametrize("kernel", [GaussianMixtureKernel(), LaplaceKernel()], ids=str)
@pytest.mark.parametrize("scale", [1e-5, 2e-4, 1.0, 1e3])
def test_self_adaptive_kernels_of_small_float32_embeddings_are_those_of_unit_ones(kernel,
                                                                                  scale):
    """The bandwidth is the batch's own mean distance, so scaling the batch changes nothing,
    down to embeddings whose mean squared distance is below float32's epsilon (a fixed floor
    there had made every kernel value about 1)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.randn(32, 64, generator=generator), dim=1)
    y = torch.randn(5, 64, generator=generator) / 8
    expected_xx, expected_xy = kernel(x.double()), kernel(x.double(), y.double())
    torch.testing.assert_close(kernel(scale * x).double(), expected_xx, atol=2e-5, rtol=0)
    torch.testing.assert_close(kernel(scale * x, scale * y).double(), expected_xy, atol=2e-5,
                               rtol=0)


@pytest.mark.parametrize(("kernel", "largest_gradient"), [
    (GaussianMixtureKernel(), 100),  # of the order of 1 / |p| per pair
    (LaplaceKernel(), 1e4),  # sign(x - y) / sigma per pair: 1 / (sqrt(eps) |p|_1)
], ids=str)
def test_a_batch_collapsed_up_to_rounding_has_kernels_of_one(kernel, largest_gradient):
    """Rows a few ulps apart, as a collapsed embedding's rows come out of a network: kernels
    above 0.999 and bounded gradients at any scale (a floor at the rounding itself, eps^2
    |p|^2, gave Gaussian kernels of 0.6 and gradients 1e4 times larger; the fixed floor eps
    gave the Laplace kernel gradients of 1 / eps)."""
    generator = torch.Generator().manual_seed(3)
    row = torch.randn(1, 64, generator=generator)
    for scale in (1e-6, 1.0, 1e6):
        collapsed = (scale * row).repeat(16, 1)
        assert torch.equal(kernel(collapsed), torch.ones(16, 16))  # identical rows: exactly 1
        nudged = collapsed.clone()
        for _ in range(3):  # up to 3 ulps, up or down, on random coordinates
            step = torch.randint(0, 3, nudged.shape, generator=generator) - 1
            towards = torch.where(step == 0, nudged, step * torch.inf)
            nudged = torch.nextafter(nudged, towards)
        nudged.requires_grad_()
        values = kernel(nudged)
        assert values.min() > 0.999, (scale, values.min())
        (gradient,) = torch.autograd.grad(values.sum(), nudged)
        assert gradient.abs().max() * scale < largest_gradient, (scale, gradient.abs().max())


def test_a_kernel_called_in_inference_mode_still_trains_afterwards():
    """An evaluation under torch.inference_mode (Lightning's sanity check) before training
    must not leave inference tensors in the kernel for autograd to save later."""
    kernel = GaussianMixtureKernel()
    with torch.inference_mode():
        kernel(torch.randn(6, 4))
    x = torch.randn(6, 4, requires_grad=True)
    kernel(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize(
    ("num_kernels", "sigma2_over_tau"),
    [(3, [0.5, 1.0, 2.0]), (1, [1.0]), (4, [0.25, 0.5, 1.0, 2.0])],
)
def test_mixture_bandwidths(num_kernels, sigma2_over_tau):
    tau, d2 = 1.7, 0.9
    pair = torch.tensor([[0.0, 0.0], [math.sqrt(d2), 0.0]], dtype=torch.float64)
    kernel = GaussianMixtureKernel(num_kernels=num_kernels, multiplier=2.0, bandwidth=tau)
    expected = sum(math.exp(-d2 / (tau * r)) for r in sigma2_over_tau) / len(sigma2_over_tau)
    assert kernel(pair)[0, 1].item() == pytest.approx(expected, rel=1e-12)
    assert kernel.scales == pytest.approx(sigma2_over_tau)


# ----------------------------------------------------------------- values against loops


@pytest.mark.parametrize("num_kernels", [1, 3])
def test_gaussian_adaptive_matches_loops(x, num_kernels):
    points = x.tolist()
    tau = mean_over_pairs(points, sq_dist)
    expected = loop_matrix(points, points, lambda a, b: gaussian_mixture(a, b, tau, num_kernels, 2))
    kernel = GaussianMixtureKernel(num_kernels=num_kernels)
    torch.testing.assert_close(kernel(x), expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(kernel(x, x), expected, rtol=1e-10, atol=1e-12)


def test_gaussian_cross_batch_bandwidth_is_over_the_concatenation(x, y):
    joint = x.tolist() + y.tolist()
    tau = mean_over_pairs(joint, sq_dist)
    expected = loop_matrix(x.tolist(), y.tolist(), lambda a, b: gaussian_mixture(a, b, tau, 3, 2))
    kernel = GaussianMixtureKernel()
    torch.testing.assert_close(kernel(x, y), expected, rtol=1e-10, atol=1e-12)
    # a copy of x is "another batch": its bandwidth is over [x; x], unlike kernel(x)
    tau_doubled = mean_over_pairs(x.tolist() * 2, sq_dist)
    expected_copy = loop_matrix(
        x.tolist(), x.tolist(), lambda a, b: gaussian_mixture(a, b, tau_doubled, 3, 2)
    )
    torch.testing.assert_close(kernel(x, x.clone()), expected_copy, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(kernel(x, x.clone()), kernel(x))


def test_gaussian_fixed_bandwidth_matches_loops(x, y):
    expected = loop_matrix(x.tolist(), y.tolist(), lambda a, b: gaussian_mixture(a, b, 0.8, 3, 3))
    kernel = GaussianMixtureKernel(num_kernels=3, multiplier=3.0, bandwidth=0.8)
    torch.testing.assert_close(kernel(x, y), expected, rtol=1e-10, atol=1e-12)


def test_laplace_matches_loops(x, y):
    points = x.tolist()
    sigma = mean_over_pairs(points, l1_dist)
    expected = loop_matrix(points, points, lambda a, b: math.exp(-l1_dist(a, b) / sigma))
    torch.testing.assert_close(LaplaceKernel()(x), expected, rtol=1e-10, atol=1e-12)

    joint_sigma = mean_over_pairs(points + y.tolist(), l1_dist)
    expected_xy = loop_matrix(
        points, y.tolist(), lambda a, b: math.exp(-l1_dist(a, b) / joint_sigma)
    )
    torch.testing.assert_close(LaplaceKernel()(x, y), expected_xy, rtol=1e-10, atol=1e-12)

    expected_fixed = loop_matrix(points, y.tolist(), lambda a, b: math.exp(-l1_dist(a, b) / 1.3))
    torch.testing.assert_close(LaplaceKernel(bandwidth=1.3)(x, y), expected_fixed)


def test_laplace_cross_batch_floor_is_the_l1_one_over_the_concatenation():
    """Two batches of nearly equal points far from the origin: k(x, y)'s bandwidth is floored at
    resolution_floor([x; y], power=1), as k([x; y])'s is, so they agree and stay near 1. The
    squared-distance floor (power=2) there gave about 0.4 and had passed every test."""
    generator = torch.Generator().manual_seed(0)
    base = torch.full((4, 8), 1000.0, dtype=torch.float64)
    x = base + 1e-9 * torch.randn(4, 8, dtype=torch.float64, generator=generator)
    y = base + 1e-9 * torch.randn(4, 8, dtype=torch.float64, generator=generator)
    cross = LaplaceKernel()(x, y)
    torch.testing.assert_close(cross, LaplaceKernel()(torch.cat([x, y]))[:4, 4:])
    assert cross.min() > 0.99


@pytest.mark.parametrize(("degree", "bias"), [(2, 1.0), (5, 1.0), (3, 0.0)])
def test_polynomial_matches_loops(x, y, degree, bias):
    expected = loop_matrix(x.tolist(), y.tolist(), lambda a, b: (dot(a, b) + bias) ** degree)
    torch.testing.assert_close(PolynomialKernel(degree, bias)(x, y), expected)


def test_moment_generating_matches_loops(x, y):
    expected = loop_matrix(x.tolist(), y.tolist(), lambda a, b: math.exp(dot(a, b)))
    torch.testing.assert_close(MomentGeneratingKernel()(x, y), expected)


def test_inverse_multiquadric_matches_loops(x, y):
    scale = 3 / 6  # Atlas: d / 6

    def imq(a, b):
        return scale / (scale + sq_dist(a, b))

    kernel = InverseMultiquadricKernel(scale)
    torch.testing.assert_close(kernel(x, y), loop_matrix(x.tolist(), y.tolist(), imq))
    torch.testing.assert_close(kernel(x), loop_matrix(x.tolist(), x.tolist(), imq))


def test_squared_distances_are_accurate_far_from_the_origin():
    # un-normalised features with a large common offset: the plain expansion
    # ||a||^2 + ||b||^2 - 2ab loses most digits in float32, centring keeps them
    gen = torch.Generator().manual_seed(2)
    x64 = 1000.0 + torch.randn(8, 16, generator=gen, dtype=torch.float64)
    points = x64.tolist()
    expected = loop_matrix(points, points, sq_dist)
    got = squared_distances(x64.float(), x64.float()).double()
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(("x_rows", "y_rows"), [(3, 0), (0, 4), (3, 4)])
def test_squared_distances_of_a_float32_and_a_float64_set_are_float64(x_rows, y_rows):
    """The centre is the mean of the sets that have points: a float32 set beside an empty
    float64 one was left in float32 and addmm raised "mat1 and mat2 must have the same
    dtype" (the empty set first, or two non-empty sets, were promoted)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(x_rows, 2, generator=gen)
    y = torch.randn(y_rows, 2, generator=gen, dtype=torch.float64)
    got = squared_distances(x, y)
    assert got.dtype == torch.float64 and got.shape == (x_rows, y_rows)
    torch.testing.assert_close(got, loop_matrix(x.tolist(), y.tolist(), sq_dist).reshape(
        x_rows, y_rows))


def test_a_points_squared_distance_to_itself_is_zero_whatever_the_matmul_rounds(monkeypatch):
    """An Intel CPU's BLAS rounded c_i . c_i otherwise than ||c_i||^2: the diagonal was not 0,
    and a narrow Gaussian gave a point a similarity of 0.59 with itself. A matmul that is off
    by 1e-3 everywhere stands in for any such rounding here."""
    addmm = torch.addmm
    # above 0: the clamp at 0 would hide a round-off below it
    monkeypatch.setattr(torch, "addmm", lambda *args, **kwargs: addmm(*args, **kwargs) + 1e-3)
    x = 3 * torch.randn(6, 3, generator=torch.Generator().manual_seed(3))
    distances = squared_distances(x, x)
    assert torch.equal(distances.diag(), torch.zeros(6))
    points = x.double().tolist()
    off_diagonal = ~torch.eye(6, dtype=torch.bool)
    torch.testing.assert_close(distances.double()[off_diagonal],
                               loop_matrix(points, points, sq_dist)[off_diagonal],
                               rtol=0, atol=2e-3)


# ----------------------------------------------------------------- gradients


FIXED_BANDWIDTH_KERNELS = [
    GaussianMixtureKernel(num_kernels=3, bandwidth=1.5),
    GaussianMixtureKernel(num_kernels=1, bandwidth=0.7),
    LaplaceKernel(bandwidth=2.0),
    PolynomialKernel(degree=2),
    PolynomialKernel(degree=5),
    MomentGeneratingKernel(),
    InverseMultiquadricKernel(0.5),
]


@pytest.mark.parametrize("kernel", FIXED_BANDWIDTH_KERNELS, ids=lambda k: repr(k))
def test_gradcheck(kernel, x, y):
    x = x.clone().requires_grad_()
    y = y.clone().requires_grad_()
    assert gradcheck(lambda a: kernel(a), (x,))
    assert gradcheck(lambda a, b: kernel(a, b), (x, y))


def test_second_derivatives_of_squared_distances(x):
    # the one-sample Gram matrix has a hand-written backward: check it twice
    x = x.clone().requires_grad_()
    assert gradgradcheck(lambda a: squared_distances(a, a), (x,))
    assert gradgradcheck(lambda a: GaussianMixtureKernel(bandwidth=2.0)(a), (x,))


@pytest.mark.parametrize("kernel_class", [GaussianMixtureKernel, LaplaceKernel])
def test_adaptive_gradient_treats_bandwidth_as_constant(kernel_class, x):
    """tau is detached: the gradient equals that of the fixed-bandwidth kernel at the same tau."""
    weights = torch.randn(6, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    points = x.tolist()
    if kernel_class is GaussianMixtureKernel:
        tau = mean_over_pairs(points, sq_dist)
    else:
        tau = mean_over_pairs(points, l1_dist)

    def grad_of(kernel) -> torch.Tensor:
        leaf = x.clone().requires_grad_()
        (kernel(leaf) * weights).sum().backward()
        return leaf.grad

    torch.testing.assert_close(grad_of(kernel_class()), grad_of(kernel_class(bandwidth=tau)))


@pytest.mark.parametrize(
    "kernel",
    [GaussianMixtureKernel(), LaplaceKernel(), InverseMultiquadricKernel(1.0)],
    ids=lambda k: type(k).__name__,
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_coincident_points_are_finite(kernel, dtype):
    x = torch.full((5, 4), 0.3, dtype=dtype, requires_grad=True)
    values = kernel(x)
    torch.testing.assert_close(values, torch.ones(5, 5, dtype=dtype))
    values.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert x.grad.abs().max() < 1e-3


def test_single_point_batch():
    x = torch.randn(1, 3, requires_grad=True)
    for kernel in (GaussianMixtureKernel(), LaplaceKernel()):
        value = kernel(x)
        assert value.item() == 1.0
        (grad,) = torch.autograd.grad(value.sum(), x)
        assert torch.isfinite(grad).all()


# ----------------------------------------------------------------- factory and validation


@pytest.mark.parametrize(
    ("name", "kwargs", "expected_class"),
    [
        ("gaussian", {"num_kernels": 1}, GaussianMixtureKernel),
        ("laplace", {}, LaplaceKernel),
        ("polynomial", {"degree": 5}, PolynomialKernel),
        ("mgf", {}, MomentGeneratingKernel),
        ("imq", {"scale": 2.0}, InverseMultiquadricKernel),
    ],
)
def test_build_kernel(name, kwargs, expected_class):
    kernel = build_kernel(name, **kwargs)
    assert type(kernel) is expected_class
    for key, value in kwargs.items():
        assert getattr(kernel, key) == value


def test_build_kernel_unknown_name_lists_valid_names():
    with pytest.raises(KdmlError) as info:
        build_kernel("rbf")
    for name in ("gaussian", "laplace", "polynomial", "mgf", "imq"):
        assert name in str(info.value)


def test_build_kernel_bad_argument():
    with pytest.raises(KdmlError, match="num_kernels"):
        build_kernel("gaussian", sigma=1.0)
    with pytest.raises(KdmlError):
        build_kernel("imq")  # scale is required


@pytest.mark.parametrize(
    "make",
    [
        lambda: GaussianMixtureKernel(num_kernels=0),
        lambda: GaussianMixtureKernel(bandwidth=0.0),
        lambda: GaussianMixtureKernel(multiplier=-2.0),
        lambda: LaplaceKernel(bandwidth=-1.0),
        lambda: PolynomialKernel(degree=0),
        lambda: PolynomialKernel(bias=-1.0),
        lambda: InverseMultiquadricKernel(0.0),
    ],
)
def test_invalid_parameters(make):
    with pytest.raises(KdmlError):
        make()


def test_invalid_shapes():
    kernel = GaussianMixtureKernel()
    with pytest.raises(KdmlError):
        kernel(torch.randn(5))
    with pytest.raises(KdmlError):
        kernel(torch.randn(5, 3), torch.randn(4, 2))


def test_docstring_examples():
    results = doctest.testmod(kernels_module)
    assert results.attempted > 0
    assert results.failed == 0


def test_build_kernel_refuses_settings_the_moment_generating_kernel_does_not_take():
    """It had no __init__ of its own, so nn.Module's (*args, **kwargs) accepted anything and the
    constructor raised a raw TypeError."""
    with pytest.raises(KdmlError, match=r"^kernel 'mgf': got an unexpected keyword argument "
                                        r"'bandwidth' \(it accepts: no arguments\)$"):
        build_kernel("mgf", bandwidth=1.0)
    assert isinstance(build_kernel("mgf"), MomentGeneratingKernel)


@pytest.mark.parametrize("multiplier", [math.inf, math.nan, 0.0, "2", True])
def test_a_gaussian_mixture_refuses_a_multiplier_that_is_not_a_finite_positive_number(multiplier):
    """inf used to fail with a ZeroDivisionError while building the bandwidths."""
    with pytest.raises(KdmlError, match=r"^multiplier must be a finite number > 0, got "):
        GaussianMixtureKernel(multiplier=multiplier)


def test_kernel_settings_take_zero_dimensional_tensors_and_arrays():
    import numpy as np

    assert GaussianMixtureKernel(bandwidth=torch.tensor(2.0)).bandwidth == 2.0
    assert GaussianMixtureKernel(multiplier=np.array(3.0)).multiplier == 3.0
    # the polynomial bias had been refused as "bias must be a finite number >= 0"
    for bias in (torch.tensor(1.5), np.array(1.5), torch.tensor(0.0, dtype=torch.float64)):
        kernel = PolynomialKernel(2, bias)
        assert type(kernel.bias) is float and kernel.bias == float(bias)
    with pytest.raises(KdmlError, match=r"^bias must be a finite number >= 0, got "):
        PolynomialKernel(2, torch.tensor(-1.0))
    with pytest.raises(KdmlError, match=r"^bias must be a finite number >= 0, got "):
        PolynomialKernel(2, torch.tensor([1.0]))  # one value, but not a 0-d tensor


FLOAT32_LOW, FLOAT32_HIGH = 2.0**-126, 2.0**126  # normal float32 numbers with their reciprocals


@pytest.mark.parametrize(("num_kernels", "multiplier"), [
    (3, 1e39), (5, 1e20), (3, 1e-39), (254, 2.0), (2, 2.0**127)])
def test_a_gaussian_mixture_refuses_bandwidth_ratios_float32_cannot_take(num_kernels,
                                                                          multiplier):
    """Checked in float64 only, they had passed, and -1 / ratio overflowed to -inf in the
    float32 coefficients: 0 * -inf put NaN on the diagonal (float64 inputs gave ones)."""
    with pytest.raises(KdmlError, match=rf"^multiplier={re.escape(repr(multiplier))} makes a "
                                        r"bandwidth sigma_i\^2 = \S+ \* tau across "
                                        rf"{num_kernels} kernels, outside \[1.18e-38, 8.51e\+37\]"
                                        r" where .*: choose a multiplier nearer 1 or fewer "
                                        r"kernels$"):
        GaussianMixtureKernel(num_kernels, multiplier=multiplier)


@pytest.mark.parametrize("make", [
    lambda value: GaussianMixtureKernel(1, bandwidth=value),
    lambda value: GaussianMixtureKernel(3, bandwidth=value),
    lambda value: LaplaceKernel(bandwidth=value),
    InverseMultiquadricKernel,
], ids=["gaussian-1", "gaussian-3", "laplace", "imq"])
@pytest.mark.parametrize("value", [1e-300, 1e-39, 1e38, 1e300])
def test_fixed_bandwidths_and_scales_float32_cannot_take_are_refused(make, value):
    """The same defect: 1e-300 became 0 in float32 (0 / 0 = NaN on the diagonal), 1e300
    infinity (inf / inf = NaN everywhere for the inverse multiquadric)."""
    with pytest.raises(KdmlError, match=r"^(bandwidth|scale)=\S+ is outside \[1.18e-38, "
                                        r"8.51e\+37\], where .*inside it$"):
        make(value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("num_kernels", "multiplier", "bandwidth"), [
    (5, 1e18, None), (3, FLOAT32_HIGH, None), (3, FLOAT32_LOW, None), (253, 2.0, None),
    (5, 1e18, 0.5), (3, FLOAT32_HIGH, 1e-20), (1, 3.0, FLOAT32_LOW), (1, 3.0, FLOAT32_HIGH),
])
def test_a_gaussian_mixture_in_float32_is_its_float64_formula_up_to_the_range_ends(
        dtype, num_kernels, multiplier, bandwidth):
    """At the ends of the range taken, the float32 kernel (bfloat16 and float16 inputs are
    computed in it) is the literal float64 formula of the rounded inputs, to float32 rounding:
    no NaN, ones on the diagonal."""
    generator = torch.Generator().manual_seed(num_kernels)
    x = (3 * torch.randn(6, 3, generator=generator)).to(dtype)
    y = (3 * torch.randn(4, 3, generator=generator)).to(dtype)
    xs, ys = x.double().tolist(), y.double().tolist()
    kernel = GaussianMixtureKernel(num_kernels, multiplier, bandwidth)
    for first, second, points in ((x, None, xs), (x, y, xs + ys)):
        tau = bandwidth if bandwidth is not None else mean_over_pairs(points, sq_dist)
        expected = loop_matrix(xs, xs if second is None else ys,
                               lambda a, b, tau=tau: gaussian_mixture(a, b, tau, num_kernels,
                                                                      multiplier))
        value = kernel(first, second)
        assert value.dtype == torch.float32
        torch.testing.assert_close(value.double(), expected, rtol=0, atol=1e-6)
    assert torch.equal(kernel(x).diag(), torch.ones(6))


@pytest.mark.parametrize("kernel", [GaussianMixtureKernel(), LaplaceKernel(), LaplaceKernel(1.0),
                                    PolynomialKernel(), MomentGeneratingKernel(),
                                    InverseMultiquadricKernel(0.5)], ids=repr)
def test_a_float32_and_a_float64_input_are_taken_in_float64(kernel):
    """Fixed-bandwidth Laplace, polynomial and MGF raised torch's dtype mismatch where the
    Gaussian kernels promoted: each now computes in the wider dtype."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, generator=generator, dtype=torch.float64)
    y = torch.randn(4, 3, generator=generator, dtype=torch.float64)
    mixed = kernel(x.float(), y)
    assert mixed.dtype == torch.float64
    assert torch.allclose(mixed, kernel(x.float().double(), y), rtol=1e-12, atol=0)


@pytest.mark.parametrize("kernel", [GaussianMixtureKernel(), GaussianMixtureKernel(bandwidth=1.0),
                                    LaplaceKernel(), LaplaceKernel(1.0), PolynomialKernel(),
                                    MomentGeneratingKernel(), InverseMultiquadricKernel(0.5)],
                         ids=repr)
def test_a_kernel_of_two_sets_on_two_devices_is_refused_in_one_line(kernel):
    """A kernel of a CPU set and a set on another device raised torch's "Tensor on device cpu
    is not on the expected device meta!" from inside the maths (the Gaussian and inverse
    multiquadric kernels), or returned a matrix on the other device (the fixed Laplace, the
    polynomial and the MGF kernels on the meta device), where DomainMMD and JRS refuse two
    devices in one line."""
    on_cpu, elsewhere = torch.randn(4, 3), torch.randn(5, 3, device="meta")
    name = type(kernel).__name__
    with pytest.raises(KdmlError, match=rf"^{name}: the inputs are on different devices "
                                        r"\(cpu, meta\); put them on one device$"):
        kernel(on_cpu, elsewhere)
    assert kernel(on_cpu.to("meta"), elsewhere).device.type == "meta"  # one device: taken


@pytest.mark.parametrize("distances", [squared_distances, l1_distances])
def test_distances_of_two_sets_on_two_devices_are_refused_in_one_line(distances):
    on_cpu, elsewhere = torch.randn(4, 3), torch.randn(5, 3, device="meta")
    with pytest.raises(KdmlError, match=rf"^{distances.__name__}: the points are on different "
                                        r"devices \(meta, cpu\); put them on one device$"):
        distances(elsewhere, on_cpu)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_the_laplace_kernel_under_torch_func_is_as_the_readme_says():
    """README ("Using the library") had said that the Laplace kernel works under torch.func's
    grad, vmap, jacrev and jvp; under jvp it raises torch's NotImplementedError (cdist has no
    forward-mode derivative). The others give autograd's numbers."""
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    kernel = LaplaceKernel()

    def total(points: torch.Tensor) -> torch.Tensor:
        return kernel(points).sum()

    leaf = x.clone().requires_grad_()
    (expected,) = torch.autograd.grad(total(leaf), leaf)
    torch.testing.assert_close(torch.func.grad(total)(x), expected)
    torch.testing.assert_close(torch.func.jacrev(total)(x), expected)
    torch.testing.assert_close(torch.func.vmap(total)(torch.stack([x, 2 * x])),
                               torch.stack([total(x), total(2 * x)]))
    with pytest.raises(NotImplementedError, match="forward AD with _cdist_forward"):
        torch.func.jvp(total, (x,), (torch.ones_like(x),))
    readme = " ".join((Path(__file__).resolve().parents[1] / "README.md").read_text().split())
    assert "the Laplace kernel works under all but `jvp`" in readme


def test_a_saved_gaussian_mixture_kernel_holds_no_tensor_of_the_device_it_ran_on():
    """Its coefficient cache keeps the devices it was made on, which .to() does not move: a
    model trained on a GPU, moved to the CPU and saved whole (torch.save(model)) had held CUDA
    tensors, which torch.load on a CPU-only machine refuses. The meta device stands in for the
    GPU. Pickled and copied without it, the kernel makes it again and gives the same matrix."""
    import copy
    import io

    kernel = kernels_module.GaussianMixtureKernel()
    kernel(torch.randn(4, 3, device="meta"))
    x = torch.randn(5, 3)
    expected = kernel(x)
    assert kernel._neg_inverse_scales  # meta and cpu
    buffer = io.BytesIO()
    torch.save(torch.nn.Sequential(kernel).to("cpu"), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)[0]
    for copied in (loaded, copy.deepcopy(kernel)):
        assert copied._neg_inverse_scales == {}
        assert torch.equal(copied(x), expected)
    assert kernel._neg_inverse_scales  # the original keeps its own


@pytest.mark.parametrize(("floor", "power"), [(-1.0, 2), (None, 3)])
def test_a_bad_floor_or_power_is_refused_in_one_line(floor, power):
    """adaptive_bandwidth's floor of -1 gave tau 0 and kernels of 0/0; resolution_floor has
    L1 (power 1) and squared Euclidean (power 2) floors only."""
    from kdml.kernels import adaptive_bandwidth, resolution_floor

    with pytest.raises(KdmlError, match="floor must be|power is 1"):
        if floor is not None:
            adaptive_bandwidth(torch.ones(3, 3), floor=floor)
        else:
            resolution_floor(torch.ones(3, 2), power)


@pytest.mark.parametrize("floor", [0.0, math.inf, math.nan])
def test_a_floor_that_is_not_above_zero_is_refused(floor):
    """The floor is a number > 0: 0 let a collapsed batch's tau be 0 and its kernels 0/0
    (mutation audit: at_least=0 for above=0 passed 0)."""
    with pytest.raises(KdmlError, match=r"^adaptive_bandwidth's floor must be a finite number "
                                        r"> 0, got"):
        adaptive_bandwidth(torch.zeros(3, 3), floor=floor)


@pytest.mark.parametrize("power", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_resolution_floor_of_no_point_is_the_smallest_bandwidth(power, dtype):
    """At least smallest_bandwidth, as the docstring says, also without points (mutation
    audit: a floor of 0 there went unnoticed)."""
    floor = resolution_floor(torch.empty(0, 3, dtype=dtype), power)
    assert floor.dtype == dtype and floor.item() == smallest_bandwidth(dtype)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_the_resolution_floor_refuses_points_that_are_not_floating_point(dtype):
    """Integer or bool points have no epsilon: torch.finfo's raw TypeError "torch.finfo()
    requires a floating point input type" came out without the check (mutation audit)."""
    with pytest.raises(KdmlError, match=r"^resolution_floor expects floating point points, "
                                        r"got torch\.(int64|bool); convert with \.float\(\)$"):
        resolution_floor(torch.ones(3, 2, dtype=dtype), 2)
