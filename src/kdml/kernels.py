r"""Reproducing kernels shared by JRD, Atlas and DTML.

Every kernel is a small :class:`torch.nn.Module` called as ``kernel(x, y)`` with ``x`` of
shape :math:`(M, D)` and ``y`` of shape :math:`(N, D)`; it returns the :math:`(M, N)` matrix
:math:`K_{ij} = k(x_i, y_j)`. ``kernel(x)`` means ``kernel(x, x)``.

Kernels with a data-driven ("self-adaptive") bandwidth follow the JRD authors' code: the
bandwidth is the mean pairwise distance of the batch, recomputed on every call and detached
from the autograd graph (see :func:`adaptive_bandwidth`).

Example::

    >>> import torch
    >>> from kdml.kernels import build_kernel
    >>> kernel = build_kernel("gaussian", num_kernels=3)
    >>> kernel(torch.randn(5, 8)).shape
    torch.Size([5, 5])
    >>> kernel(torch.randn(5, 8), torch.randn(3, 8)).shape
    torch.Size([5, 3])
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
from torch import Tensor, nn

from kdml.checks import (
    Count,
    Number,
    as_number,
    check_float_inputs,
    check_same_device,
    check_tensor_inputs,
    is_finite_number,
    is_positive_int,
)
from kdml.errors import KdmlError
from kdml.precision import full_precision

__all__ = [
    "FLOAT32_SETTING_RANGE",
    "KERNELS",
    "GaussianMixtureKernel",
    "InverseMultiquadricKernel",
    "Kernel",
    "LaplaceKernel",
    "MomentGeneratingKernel",
    "PolynomialKernel",
    "adaptive_bandwidth",
    "build_kernel",
    "l1_distances",
    "resolution_floor",
    "smallest_bandwidth",
    "squared_distances",
]


# ----------------------------------------------------------------------------- helpers


class _SelfSquaredDistances(torch.autograd.Function):
    r""":math:`D_{ij} = \|c_i\|^2 + \|c_j\|^2 - 2 c_i^\top c_j`, clamped at 0, for the rows of
    one matrix ``c``, with the backward :math:`\partial L / \partial c = 2 (\mathrm{diag}(S
    \mathbf{1}) - S) c`, :math:`S = G + G^\top` for the incoming gradient :math:`G`.

    Hand-written because autograd treats the two operands of ``c @ c.T`` as different tensors
    (two matmuls in the backward) and records each elementwise step: this is one matmul and
    four other kernels each way, and on a GPU a JRD step's cost is mostly launching kernels.
    The gradient is that of the unclamped expression: the clamp only removes round-off below
    0 (coincident points, the diagonal), where the true gradient :math:`2 (c_i - c_j)` is 0
    anyway. The backward is made of differentiable ops, so double backward works.
    """

    @staticmethod
    def forward(ctx: Any, c: Tensor) -> Tensor:
        ctx.save_for_backward(c)
        sq_norms = c.pow(2).sum(dim=1)
        distances = torch.addmm(sq_norms[:, None] + sq_norms[None, :], c, c.T, alpha=-2.0)
        # A point's distance to itself is 0 exactly: the matmul's c_i . c_i need not round as
        # ||c_i||^2 does (it did not with an Intel CPU's BLAS, 2026-12-03), and a narrow
        # kernel turned that round-off into a self-similarity of 0.59 instead of 1.
        return distances.clamp_min_(0.0).fill_diagonal_(0.0)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        (c,) = ctx.saved_tensors
        both = grad + grad.T
        return torch.addmm(both.sum(dim=1, keepdim=True) * c, both, c, beta=2.0, alpha=-2.0)


@full_precision
def squared_distances(x: Tensor, y: Tensor) -> Tensor:
    r"""Matrix of squared Euclidean distances :math:`\|x_i - y_j\|^2`, shape :math:`(M, N)`.

    Computed as :math:`\|a\|^2 + \|b\|^2 - 2 a^\top b` (one matmul, no :math:`(M, N, D)`
    difference tensor) after shifting both sets by a common detached centre: distances are
    translation invariant, so value and gradient are unchanged, but the cancellation error of
    the expansion for features far from the origin (e.g. un-normalised pooled features) mostly
    disappears. The result is clamped at 0; there is no square root, so the gradient at
    coincident points is finite (zero). A float32 and a float64 set are computed in float64, as
    :func:`l1_distances`.
    """
    _check_pair("squared_distances", x, y)
    if y is x:
        return _SelfSquaredDistances.apply(x - x.detach().mean(dim=0))
    # in the wider dtype: the centre is the mean of the sets that have points, so a float32
    # set beside an empty float64 one left the two in their own dtypes, which addmm refused
    # ("mat1 and mat2 must have the same dtype")
    common = torch.promote_types(x.dtype, y.dtype)
    x, y = x.to(common), y.to(common)
    # the mean of the sets that have points: an empty one's mean is NaN, which made the
    # gradient of an empty [M, 0] result NaN
    means = [points.detach().mean(dim=0) for points in (x, y) if len(points)]
    centre = sum(means) / len(means) if means else 0.0
    x_c, y_c = x - centre, y - centre
    x_sq_norms, y_sq_norms = x_c.pow(2).sum(dim=1), y_c.pow(2).sum(dim=1)
    return torch.addmm(x_sq_norms[:, None] + y_sq_norms[None, :], x_c, y_c.T, alpha=-2.0
                       ).clamp_min(0.0)


@full_precision
def l1_distances(x: Tensor, y: Tensor) -> Tensor:
    r"""Matrix of L1 distances :math:`\|x_i - y_j\|_1`, shape :math:`(M, N)`, in float32 or
    wider, as :func:`squared_distances` (torch's cdist takes neither half precision nor two
    dtypes: a float32 and a float64 set are computed in float64).

    ``torch.cdist(p=1)`` differentiates :math:`|t|` with ``sign(t)``, which is 0 at
    :math:`t = 0`, so coincident points get a zero (finite) gradient.
    """
    _check_pair("l1_distances", x, y)
    common = torch.promote_types(x.dtype, y.dtype)
    return torch.cdist(x.to(common), y.to(common), p=1.0)


def _check_pair(owner: str, x: Tensor, y: Tensor) -> None:
    """Two float sets of points :math:`(M, D)` and :math:`(N, D)` on one device: torch's own
    errors (an index out of range, "cdist only supports floating-point dtypes", "Tensor on
    device cpu is not on the expected device meta!") come from deep inside."""
    check_tensor_inputs(owner, [x, y], "points")
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise KdmlError(f"{owner} expects 2-D points [M, D] and [N, D], got "
                        f"{tuple(x.shape)} and {tuple(y.shape)}")
    check_float_inputs(owner, [x, y], "points")
    check_same_device(owner, [x, y], "points")


def adaptive_bandwidth(dists: Tensor, floor: Tensor | float | None = None) -> Tensor:
    r"""Self-adaptive bandwidth: the mean off-diagonal entry of a square distance matrix.

    .. math::
        \tau = \frac{\sum_{i, j} D_{ij}}{M^2 - M}

    for an :math:`(M, M)` matrix ``dists`` of pairwise distances of one sample with itself
    (zero diagonal), exactly as in the JRD authors' code. The Gaussian kernels pass squared
    Euclidean distances, the Laplace kernel L1 distances.

    The result is detached from the autograd graph (the bandwidth is treated as a constant of
    the batch, no gradient flows through it) and floored at ``floor``: when all points coincide
    (:math:`\tau = 0`), or there is a single point, kernels built on it stay finite and equal 1
    at distance 0. The kernels pass :func:`resolution_floor` of their points, which scales with
    them (a fixed floor would flatten the kernels of a batch of small embeddings); the default
    is :func:`smallest_bandwidth`.

    Args:
        dists: :math:`(M, M)` pairwise distances (floating point).
        floor: the smallest bandwidth returned (a 0-dim tensor or a number).

    Returns:
        A 0-dim tensor with the dtype and device of ``dists``.
    """
    check_tensor_inputs("adaptive_bandwidth", [dists], "distances")
    if dists.ndim != 2 or dists.shape[0] != dists.shape[1]:
        raise KdmlError(
            f"adaptive_bandwidth needs a square [M, M] matrix, got {tuple(dists.shape)}"
        )
    check_float_inputs("adaptive_bandwidth", [dists], "distances")
    # a number is checked (-1 gave tau 0 and kernels of 0/0); a tensor, the kernels' own
    # resolution_floor, is not: reading it would be a host sync every step
    if floor is not None and not isinstance(floor, Tensor) and not is_finite_number(
            floor, above=0):
        raise KdmlError(f"adaptive_bandwidth's floor must be a finite number > 0, got {floor!r}")
    m = dists.shape[0]
    num_off_diagonal = max(m * m - m, 1)  # a single point has no pair: tau = 0 -> floor
    # summed in float32 or wider: a float16 sum overflows to inf (65504) where the mean does
    # not, e.g. 100 points whose mean squared distance is 69 gave tau = inf
    tau = (dists.detach().sum(dtype=_summing_dtype(dists.dtype)) / num_off_diagonal
           ).to(dists.dtype)
    if floor is None:
        return tau.clamp_min(smallest_bandwidth(dists.dtype))
    return torch.maximum(tau, torch.as_tensor(floor, dtype=tau.dtype, device=tau.device))


def _summing_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype to sum a ``dtype`` tensor in: float32 or wider, as a float16 sum overflows
    (beyond 65504) where the mean it is divided into does not."""
    return torch.promote_types(dtype, torch.float32)


def smallest_bandwidth(dtype: torch.dtype) -> float:
    """The dtype's smallest normal number over its epsilon: the floor of every adaptive
    bandwidth, whose reciprocal leaves room (1 / epsilon) for the gradients built on it."""
    info = torch.finfo(dtype)
    return info.tiny / info.eps


def resolution_floor(points: Tensor, power: int) -> Tensor:
    r"""The smallest adaptive bandwidth for ``points`` :math:`(M, D)`: distances below
    :math:`\sqrt{\epsilon}` times the points' own size count as rounding (:math:`\epsilon` the
    dtype's epsilon). For squared distances (``power=2``) :math:`\epsilon` times the mean
    :math:`\|p\|_2^2`, for L1 distances (``power=1``) :math:`\sqrt{\epsilon}` times the mean
    :math:`\|p\|_1`; at least :func:`smallest_bandwidth`.

    For unit-norm embeddings this is the fixed floor kdml had, :math:`\epsilon`, and it scales
    with the points, so that a kernel takes ``x`` and ``a x`` alike (the fixed floor flattened
    the kernels of small float32 embeddings). A batch collapsed to one point up to rounding
    (rows a few ulps apart) gets kernels of 1 to within :math:`10^{-3}` and gradients of the
    order of :math:`1 / \|p\|`. The floor depends on the points' distance from the origin, not
    only on their spread: float32 points 1000 from the origin get it for a spread below about
    0.35. Detached; a 0-dim tensor with the dtype and device of ``points``.
    """
    check_tensor_inputs("resolution_floor", [points], "points")
    if points.ndim != 2:
        raise KdmlError(f"resolution_floor takes [M, D] points, got shape "
                        f"{tuple(points.shape)}")
    check_float_inputs("resolution_floor", [points], "points")
    # a bool is refused, not read as its int (True == 1), and a float such as 2.0
    if not is_positive_int(power) or power not in (1, 2):
        raise KdmlError(f"resolution_floor's power is 1 (L1 distances) or 2 (squared "
                        f"Euclidean ones), got {power!r}")
    # in float32 or wider, back in the points' dtype: float16's squares and sums overflow
    # (points of 300 gave inf where the floor is 176)
    detached = points.detach().to(_summing_dtype(points.dtype))
    eps, smallest = torch.finfo(points.dtype).eps, smallest_bandwidth(points.dtype)
    if not len(points):
        return torch.tensor(smallest, dtype=points.dtype, device=points.device)
    if power == 2:
        floor = eps * detached.pow(2).sum(dim=1).mean()
    else:
        floor = math.sqrt(eps) * detached.abs().sum(dim=1).mean()
    return floor.clamp_min(smallest).to(points.dtype)


def _check_inputs(kernel: Kernel, x: Tensor, y: Tensor) -> None:
    name = type(kernel).__name__
    check_tensor_inputs(name, [x, y], "inputs")
    if x.ndim != 2 or y.ndim != 2:
        raise KdmlError(
            f"{name} expects 2-D inputs [M, D] and [N, D], "
            f"got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    if x.shape[1] != y.shape[1]:
        raise KdmlError(
            f"{name}: x and y must have the same feature size, got {x.shape[1]} and {y.shape[1]}"
        )
    check_float_inputs(name, [x, y], "inputs")
    # devices only (no host sync): torch's own error comes from deep inside the maths, and the
    # Laplace, polynomial and MGF kernels of a meta and a CPU set had returned a meta matrix
    check_same_device(name, [x, y], "inputs")


def _check_positive(name: str, value: Number) -> float:
    value = as_number(value, name)  # type: ignore[assignment]
    if not is_finite_number(value, above=0):
        raise KdmlError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


#: The range [2^-126, 2^126] of a kernel's fixed bandwidths and scales (and the Gaussian
#: mixture's bandwidth ratios): a number in it and its reciprocal are both normal float32
#: numbers. Every kernel computes in float32 or wider (bfloat16 and float16 inputs are upcast
#: to float32), where a setting outside it, or its reciprocal, rounds to 0 or infinity and
#: puts 0 * inf = NaN on the diagonal (float64 would have given 1).
FLOAT32_SETTING_RANGE = (torch.finfo(torch.float32).tiny, 1.0 / torch.finfo(torch.float32).tiny)


def _check_setting(name: str, value: Number) -> float:
    """:func:`_check_positive`, within :data:`FLOAT32_SETTING_RANGE`."""
    number = _check_positive(name, value)
    low, high = FLOAT32_SETTING_RANGE
    if not low <= number <= high:
        raise KdmlError(f"{name}={number!r} is outside [{low:.3g}, {high:.3g}], where it and its "
                        "reciprocal are normal float32 numbers (the kernel computes in float32 "
                        f"or wider): rescale the inputs and choose a {name} inside it")
    return number


# ----------------------------------------------------------------------------- kernels


class Kernel(nn.Module):
    r"""Base class of the kernels: ``kernel(x, y=None)`` returns the :math:`(M, N)` matrix.

    Subclasses implement :meth:`matrix`. ``forward`` validates the shapes and passes ``y = x``
    (the same object) when ``y`` is omitted, so :meth:`matrix` can recognise the one-sample
    case with ``y is x``.

    Inputs: ``x`` of shape :math:`(M, D)`, optional ``y`` of shape :math:`(N, D)`.
    Shape: output :math:`(M, N)` (:math:`(M, M)` without ``y``).
    """

    @full_precision
    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        if y is None:
            y = x
        _check_inputs(self, x, y)
        if y is not x and x.dtype != y.dtype:
            # float32 against float64: every kernel works in the wider one, as torch's own
            # arithmetic promotes (matmul and cdist would refuse the pair)
            wider = torch.promote_types(x.dtype, y.dtype)
            x, y = x.to(wider), y.to(wider)
        return self.matrix(x, y)

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        """The kernel matrix of ``x`` [M, D] against ``y`` [N, D]."""
        raise NotImplementedError


class GaussianMixtureKernel(Kernel):
    r"""Mixture of :math:`K` Gaussian kernels (JRD, Sec. 5.1).

    .. math::
        k(x, x') = \frac{1}{K} \sum_{i=0}^{K-1} \exp\left(-\frac{\|x - x'\|^2}{\sigma_i^2}\right),
        \qquad \sigma_i^2 = \tau \cdot m^{\,i - \lfloor K/2 \rfloor}

    With :math:`K = 3, m = 2` the bandwidths are :math:`\{0.5\tau, \tau, 2\tau\}` (JRD's pooling
    and embedding kernels); :math:`K = 1` gives :math:`\sigma^2 = \tau` (class-level kernel).
    Note there is no factor 2 in the exponent: ``GaussianMixtureKernel(1, bandwidth=2.0)`` is
    :math:`\exp(-\frac12\|x - x'\|^2)`.

    :math:`\tau` is ``bandwidth`` if given; otherwise it is self-adaptive
    (:func:`adaptive_bandwidth`): the mean squared distance over the off-diagonal pairs of the
    batch, detached from the graph, recomputed on every call. For ``kernel(x)`` (or
    ``kernel(x, x)`` with the same tensor object) the pairs are those of ``x``; for two
    different batches ``kernel(x, y)`` they are the pairs of the concatenation ``[x; y]``, as
    in the DAN / JAN (JMMD) code, so that :math:`K(x, y)` is the off-diagonal block of the
    kernel matrix of the joint sample. It is floored at :func:`resolution_floor` of those
    points (``power=2``): a batch collapsed to float rounding reaches it, and so does one
    whose spread is small beside its distance from the origin (float32 points 1e4 from
    the origin with a unit spread), whose kernels it flattens.

    **Range.** The kernel computes in float32 or wider (bfloat16 and float16 inputs are upcast
    to float32) with the coefficients :math:`-1 / m^{\,i - \lfloor K/2 \rfloor}`, so every
    ratio :math:`\sigma_i^2 / \tau = m^{\,i - \lfloor K/2 \rfloor}` and a fixed :math:`\tau`
    must lie in :data:`FLOAT32_SETTING_RANGE`, :math:`[2^{-126}, 2^{126}]`, where they and
    their reciprocals are normal float32 numbers; others are refused when the kernel is built
    (outside it a float32 coefficient rounded to infinity and put :math:`0 \cdot \infty` =
    NaN on the diagonal). Inside it the float32 result is the float64 one to float32 rounding.

    Args:
        num_kernels: number :math:`K` of Gaussians. Default: 3.
        multiplier: ratio :math:`m` between consecutive bandwidths. Default: 2.0.
        bandwidth: fixed :math:`\tau`, or ``None`` for the self-adaptive one. Default: ``None``.

    Inputs: ``x`` :math:`(M, D)`, optional ``y`` :math:`(N, D)`.
    Shape: output :math:`(M, N)`, values in :math:`(0, 1]`.

    Example::

        >>> kernel = GaussianMixtureKernel(num_kernels=3, multiplier=2.0)
        >>> kernel(torch.zeros(4, 2)).tolist()[0]  # all points coincide: tau is floored
        [1.0, 1.0, 1.0, 1.0]
    """

    def __init__(
        self, num_kernels: Count = 3, multiplier: Number = 2.0, bandwidth: Number | None = None
    ) -> None:
        super().__init__()
        if not is_positive_int(num_kernels):
            raise KdmlError(f"num_kernels must be an integer >= 1, got {num_kernels!r}")
        self.num_kernels = num_kernels = int(num_kernels)
        self.multiplier = _check_positive("multiplier", multiplier)
        self.bandwidth = None if bandwidth is None else _check_setting("bandwidth", bandwidth)
        # sigma_i^2 / tau for i = 0..K-1
        try:
            self.scales = tuple(self.multiplier ** (i - num_kernels // 2)
                                for i in range(num_kernels))
        except OverflowError:
            low, high = -(num_kernels // 2), num_kernels - 1 - num_kernels // 2
            raise KdmlError(f"multiplier={multiplier!r} to the powers {low} to {high} (the "
                            f"{num_kernels} kernels' bandwidths) overflows a float: choose a "
                            "multiplier nearer 1 or fewer kernels") from None
        # 1e300 ** -4 is 0 in float64; 1e20 ** -2 is a float64 number whose reciprocal,
        # -1e40, overflows float32 (the coefficient below), and 0 * -inf is NaN
        smallest, largest = FLOAT32_SETTING_RANGE
        outside = [scale for scale in self.scales if not smallest <= scale <= largest]
        if outside:
            raise KdmlError(f"multiplier={multiplier!r} makes a bandwidth sigma_i^2 = "
                            f"{outside[0]:.3g} * tau across {num_kernels} kernels, outside "
                            f"[{smallest:.3g}, {largest:.3g}] where it and its reciprocal are "
                            "normal float32 numbers (the kernel computes in float32 or wider): "
                            "choose a multiplier nearer 1 or fewer kernels")
        # -tau / sigma_i^2 per (device, dtype), made once from float64: all K Gaussians then
        # take one broadcast product, a few GPU kernels instead of 5K (a JRD step on a GPU
        # spends its time launching them). Not a buffer: .half() would round it.
        self._neg_inverse_scales: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        if y is x:
            sq_dists = squared_distances(x, x)
            tau = self.bandwidth if self.bandwidth is not None else adaptive_bandwidth(
                sq_dists, resolution_floor(x, 2))
        elif self.bandwidth is not None:
            sq_dists, tau = squared_distances(x, y), self.bandwidth
        else:
            joint = torch.cat([x, y])
            joint_sq_dists = squared_distances(joint, joint)
            sq_dists = joint_sq_dists[: len(x), len(x) :]
            tau = adaptive_bandwidth(joint_sq_dists, resolution_floor(joint, 2))
        return torch.exp((sq_dists / tau).unsqueeze(-1) * self._coefficients(sq_dists)
                         ).mean(dim=-1)

    def _coefficients(self, like: Tensor) -> Tensor:
        # a constant of a compiled graph, where a cache would recompile it; and not cached
        # from inference mode, whose tensors autograd refuses to save in a later training step
        if torch.compiler.is_compiling() or torch.is_inference_mode_enabled():
            return self._new_coefficients(like)
        key = (like.device, like.dtype)
        if key not in self._neg_inverse_scales:
            self._neg_inverse_scales[key] = self._new_coefficients(like)
        return self._neg_inverse_scales[key]

    def __getstate__(self) -> dict[str, Any]:
        # pickled (torch.save of a whole model, deepcopy) without the cache: it keeps the
        # devices it was made on, which .to() does not move, so a model trained on a GPU and
        # moved to the CPU had been saved holding CUDA tensors that a CPU-only machine cannot
        # load; it is made again on first use
        state = dict(super().__getstate__())
        state["_neg_inverse_scales"] = {}
        return state

    def _new_coefficients(self, like: Tensor) -> Tensor:
        """-tau / sigma_i^2 for i = 0..K-1, made in float64, on ``like``'s device and dtype."""
        values = torch.tensor([-1.0 / scale for scale in self.scales], dtype=torch.float64)
        return values.to(like.device, like.dtype)

    def extra_repr(self) -> str:
        bw = "adaptive" if self.bandwidth is None else self.bandwidth
        return f"num_kernels={self.num_kernels}, multiplier={self.multiplier}, bandwidth={bw}"


class LaplaceKernel(Kernel):
    r"""Laplace kernel :math:`k(x, x') = \exp(-\|x - x'\|_1 / \sigma)` (JRD, Table 4).

    :math:`\sigma` is ``bandwidth`` if given; otherwise self-adaptive: the mean L1 distance over
    the off-diagonal pairs of the batch (of ``[x; y]`` for two different batches), detached and
    floored at :func:`resolution_floor` of the points (``power=1``). Table 4 gives no
    :math:`\sigma`; the self-adaptive one is kdml's reading of Sec. 5.1's rule for the
    Gaussians (the average of the distances in the exponent), with L1 distances.

    Args:
        bandwidth: fixed :math:`\sigma` in :data:`FLOAT32_SETTING_RANGE` (the kernel
            computes in float32 or wider), or ``None`` for the self-adaptive one.
            Default: ``None``.

    Inputs: ``x`` :math:`(M, D)`, optional ``y`` :math:`(N, D)`.
    Shape: output :math:`(M, N)`, values in :math:`(0, 1]`.

    Unlike the Gaussian's, its gradient has no gradient of its own (the L1 distances are
    ``torch.cdist``'s, whose backward torch does not differentiate): a gradient penalty
    through it raises torch's NotImplementedError.
    """

    def __init__(self, bandwidth: Number | None = None) -> None:
        super().__init__()
        self.bandwidth = None if bandwidth is None else _check_setting("bandwidth", bandwidth)

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        if y is x:
            dists = l1_distances(x, x)
            sigma = self.bandwidth if self.bandwidth is not None else adaptive_bandwidth(
                dists, resolution_floor(x, 1))
        elif self.bandwidth is not None:
            dists, sigma = l1_distances(x, y), self.bandwidth
        else:
            joint = torch.cat([x, y])
            joint_dists = l1_distances(joint, joint)
            dists = joint_dists[: len(x), len(x) :]
            sigma = adaptive_bandwidth(joint_dists, resolution_floor(joint, 1))
        return torch.exp(dists * (-1.0 / sigma))

    def extra_repr(self) -> str:
        return f"bandwidth={'adaptive' if self.bandwidth is None else self.bandwidth}"


class PolynomialKernel(Kernel):
    r"""Inhomogeneous polynomial kernel :math:`k(x, x') = (x^\top x' + c)^p` (JRD, Table 4).

    Args:
        degree: :math:`p`, an integer >= 1. Default: 2.
        bias: :math:`c \ge 0` (``0`` gives the homogeneous kernel); a number, or a 0-d tensor
            or array (stored as a Python float). Default: 1.0.

    Inputs: ``x`` :math:`(M, D)`, optional ``y`` :math:`(N, D)`. Shape: output :math:`(M, N)`.
    """

    def __init__(self, degree: Count = 2, bias: Number = 1.0) -> None:
        super().__init__()
        if not is_positive_int(degree):
            raise KdmlError(f"degree must be an integer >= 1, got {degree!r}")
        bias = as_number(bias, "bias")  # type: ignore[assignment]
        # a negative offset is not a positive-definite kernel; an infinite one gives inf
        if not is_finite_number(bias, at_least=0):
            raise KdmlError(f"bias must be a finite number >= 0, got {bias!r}")
        self.degree = int(degree)
        self.bias = float(bias)

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        return (x @ y.T + self.bias).pow(self.degree)

    def extra_repr(self) -> str:
        return f"degree={self.degree}, bias={self.bias}"


class MomentGeneratingKernel(Kernel):
    r"""Kernel inducing the moment-generating function: :math:`k(x, x') = \exp(x^\top x')`.

    Its mean embedding is the moment-generating function of the distribution (JRD, Table 4).
    Meant for bounded inputs such as L2-normalised embeddings: large dot products overflow.

    Inputs: ``x`` :math:`(M, D)`, optional ``y`` :math:`(N, D)`. Shape: output :math:`(M, N)`.
    """

    def __init__(self) -> None:  # no settings; explicit, so build_kernel refuses any it is given
        super().__init__()

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.exp(x @ y.T)


class InverseMultiquadricKernel(Kernel):
    r"""Inverse multiquadric kernel :math:`k(x, x') = C / (C + \|x - x'\|^2)`.

    Atlas uses :math:`C = d / 6` on pre-sigmoid chart coordinates of dimension :math:`d`.

    Args:
        scale: :math:`C > 0`, in :data:`FLOAT32_SETTING_RANGE` (the kernel computes in
            float32 or wider).

    Inputs: ``x`` :math:`(M, D)`, optional ``y`` :math:`(N, D)`.
    Shape: output :math:`(M, N)`, values in :math:`(0, 1]`.
    """

    def __init__(self, scale: Number) -> None:
        super().__init__()
        self.scale = _check_setting("scale", scale)

    def matrix(self, x: Tensor, y: Tensor) -> Tensor:
        return self.scale / (self.scale + squared_distances(x, y))

    def extra_repr(self) -> str:
        return f"scale={self.scale}"


KERNELS: dict[str, type[Kernel]] = {
    "gaussian": GaussianMixtureKernel,
    "laplace": LaplaceKernel,
    "polynomial": PolynomialKernel,
    "mgf": MomentGeneratingKernel,
    "imq": InverseMultiquadricKernel,
}


def build_kernel(name: str, **kwargs: object) -> Kernel:
    """Build a kernel by name (for configs): ``build_kernel("gaussian", num_kernels=1)``.

    Valid names: ``"gaussian"``, ``"laplace"``, ``"polynomial"``, ``"mgf"``, ``"imq"``; the
    keyword arguments are those of the class. Unknown names or arguments raise
    :class:`~kdml.errors.KdmlError`.
    """
    try:
        kernel_class = KERNELS[name]
    except KeyError:
        raise KdmlError(f"unknown kernel {name!r}; valid names are: {', '.join(KERNELS)}") from None
    signature = inspect.signature(kernel_class)
    try:
        signature.bind(**kwargs)
    except TypeError as err:
        accepted = ", ".join(signature.parameters) or "no arguments"
        raise KdmlError(f"kernel {name!r}: {err} (it accepts: {accepted})") from None
    return kernel_class(**kwargs)
