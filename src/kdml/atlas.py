r"""Geometry of the Atlas latent space (Korman, "Atlas Based Representation and Metric Learning
on Manifolds").

The latent space is :math:`\mathcal{Z} = [0, 1]^d \times \{1, \dots, n\}`: :math:`n` charts of
dimension :math:`d`. An encoder outputs, for every input :math:`x`, chart coordinates
:math:`\phi_i(x) = \sigma(c_i(x)) \in [0, 1]^d` for each chart :math:`i` and a membership
distribution :math:`q(x) \in [0, 1]^n` (a softmax). kdml keeps the *pre-sigmoid* coordinates
:math:`c_i(x) = \sigma^{-1}(\phi_i(x))`: the MMD kernel, the MTriplet distance and the chart
retrieval all work on them, and the sigmoid is only applied where :math:`\phi_i` itself is
needed (projection heads, linear probes, plots).

- :class:`ChartOutputs`: what an Atlas head returns for a batch.
- :func:`compressed_code`: the inference representation of Eq. 3.
- :func:`manifold_distance`: the semi-metric of Eq. 7.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from kdml.checks import (
    check_float_inputs,
    check_real_memberships,
    check_same_device,
    check_tensor_inputs,
)
from kdml.errors import KdmlError
from kdml.precision import full_precision

__all__ = [
    "D0_CHOICES",
    "DISTANCE_VARIANTS",
    "ChartOutputs",
    "chart_distances",
    "compressed_code",
    "manifold_distance",
    "safe_sqrt",
]

D0_CHOICES = ("euclidean", "squared", "mean_squared")
DISTANCE_VARIANTS = ("paper", "code")
# log of neurve's SMALL = 1e-12 (distance.py), the "code" variant's threshold on the shared
# membership sum_i q_i(x) q_i(y)
CODE_LOG_SMALL = math.log(1e-12)


class ChartOutputs(NamedTuple):
    r"""The Atlas encoder's output for a batch of :math:`B` inputs.

    Attributes:
        coords: :math:`(B, n, d)` pre-sigmoid chart coordinates :math:`c_i(x)`; the chart
            coordinates of the paper are :math:`\phi_i(x) = \sigma(c_i(x))`.
        q: :math:`(B, n)` chart membership probabilities (softmax, rows sum to 1).
        log_q: :math:`(B, n)` ``log_softmax`` of the same logits, or ``None``. Unlike ``log(q)``
            it stays finite when ``q`` underflows in float32, so the MTriplet distance uses it
            (``manifold_distance(..., q_is_log=True)``).
    """

    coords: Tensor
    q: Tensor
    log_q: Tensor | None = None


def compressed_code(outputs: ChartOutputs) -> tuple[Tensor, Tensor]:
    r"""The inference representation of Eq. 3: :math:`x \mapsto (\phi_i(x), i)`,
    :math:`i = \operatorname{argmax}_j q_j(x)`.

    Returns the *pre-sigmoid* coordinates of the most probable chart (apply ``torch.sigmoid``
    for :math:`\phi_i(x) \in [0, 1]^d`) and the chart's index.

    Inputs: ``outputs`` with ``coords`` :math:`(B, n, d)` and ``q`` :math:`(B, n)` (real:
    probabilities, or a bool or integer one-hot).

    Shape: returns ``chart_coords`` :math:`(B, d)` and ``chart_index`` :math:`(B,)` (int64).

    Example::

        >>> coords = torch.arange(12.0).reshape(2, 3, 2)
        >>> q = torch.tensor([[0.1, 0.7, 0.2], [0.5, 0.2, 0.3]])
        >>> chart_coords, chart_index = compressed_code(ChartOutputs(coords, q))
        >>> chart_coords.tolist(), chart_index.tolist()
        ([[2.0, 3.0], [6.0, 7.0]], [1, 0])
    """
    coords, q = outputs.coords, outputs.q
    check_tensor_inputs("compressed_code", [coords, q], "chart coordinates and memberships")
    if coords.ndim != 3 or q.shape != coords.shape[:2] or coords.shape[1] == 0:
        raise KdmlError(
            f"compressed_code needs coords [B, n, d] and q [B, n] with n >= 1, got "
            f"{tuple(coords.shape)} and {tuple(q.shape)}"
        )
    # devices only, no host sync: a meta and a CPU tensor had given a code on mixed devices
    check_same_device("compressed_code", [coords, q], "chart coordinates and memberships")
    check_real_memberships("compressed_code", q)
    # a bool one-hot, which ManifoldMMD and manifold_distance take, as 0 and 1: torch has no
    # argmax of bools ("argmax(): does not support bool input")
    chart_index = (q.to(torch.uint8) if q.dtype == torch.bool else q).argmax(dim=1)
    chart_coords = coords[torch.arange(len(coords), device=coords.device), chart_index]
    return chart_coords, chart_index


def safe_sqrt(x: Tensor) -> Tensor:
    """``sqrt(x)`` for ``x >= 0`` whose gradient at ``x = 0`` is 0 instead of ``inf``.

    ``sqrt`` has an infinite derivative at 0, so the distance of a point to itself (the
    diagonal of a distance matrix) would put ``inf * 0 = NaN`` into the backward pass. The
    inner ``where`` keeps the discarded branch away from 0 so that no ``inf`` is formed. A NaN
    stays NaN (a diverged encoder's distances must not read as 0).
    """
    positive = x > 0
    root = torch.sqrt(torch.where(positive, x, torch.ones_like(x)))
    return torch.where(positive, root, torch.where(torch.isnan(x), x, 0.0))


@full_precision
def chart_distances(c1: Tensor, c2: Tensor, d0: str = "euclidean") -> Tensor:
    r"""Chart-wise distances :math:`d_0(\phi_i(x_a), \phi_i(y_b))` on pre-sigmoid coordinates.

    ``d0``:

    - ``"euclidean"``: :math:`\|c_i(x) - c_i(y)\|` (the paper's MTriplet choice, Sec. 3.2:
      :math:`d_0(x, y) = \|\sigma^{-1}(x) - \sigma^{-1}(y)\|`), through :func:`safe_sqrt`;
    - ``"squared"``: :math:`\|c_i(x) - c_i(y)\|^2`;
    - ``"mean_squared"``: :math:`\frac1d \|c_i(x) - c_i(y)\|^2` (the authors' code).

    Differences are formed explicitly (no :math:`\|a\|^2 + \|b\|^2 - 2ab` expansion), so a
    point is at exactly 0 from itself; memory is :math:`O(N_1 N_2 n d)`, meant for
    training batches.

    Shape: ``c1`` :math:`(N_1, n, d)`, ``c2`` :math:`(N_2, n, d)`; output :math:`(N_1, N_2, n)`.
    """
    if d0 not in D0_CHOICES:
        raise KdmlError(f"d0 must be one of {', '.join(D0_CHOICES)}, got {d0!r}")
    check_tensor_inputs("chart_distances", [c1, c2], "pre-sigmoid chart coordinates")
    check_float_inputs("chart_distances", [c1, c2], "chart coordinates")
    if c1.ndim != 3 or c2.ndim != 3 or c1.shape[1:] != c2.shape[1:] or c1.shape[2] == 0:
        raise KdmlError(f"chart_distances needs c1 [N1, n, d] and c2 [N2, n, d] with the same "
                        f"(n, d), d >= 1, got {tuple(c1.shape)} and {tuple(c2.shape)}")
    check_same_device("chart_distances", [c1, c2], "chart coordinates")
    squared = (c1[:, None] - c2[None, :]).pow(2).sum(dim=-1)
    if d0 == "euclidean":
        return safe_sqrt(squared)
    if d0 == "mean_squared":
        return squared / c1.shape[-1]
    return squared


def _log_membership(q: Tensor) -> Tensor:
    """``log(q)`` with ``-inf`` (and no gradient) where ``q == 0``: the gradient of ``log`` at
    0 is infinite and would turn the zero weight of an unshared chart into NaN. A NaN or
    negative membership gives NaN, as ``log`` does (not "no share of this chart")."""
    zero = q == 0
    return torch.where(zero, -torch.inf, torch.log(torch.where(zero, torch.ones_like(q), q)))


@full_precision
def manifold_distance(
    q1: Tensor,
    c1: Tensor,
    q2: Tensor,
    c2: Tensor,
    d0: str | None = None,
    variant: str = "paper",
    q_is_log: bool = False,
) -> Tensor:
    r"""The manifold semi-metric of Eq. 7 between two sets of points, differentiable.

    .. math::
        d_{\mathcal{M}}(x, y) =
        \frac{\sum_i q_i(x) q_i(y)\, d_0(\phi_i(x), \phi_i(y))}{\sum_i q_i(x) q_i(y)},
        \qquad d_{\mathcal{M}}(x, y) = \infty \text{ when } \textstyle\sum_i q_i(x) q_i(y) = 0,

    i.e. the average of the chart-wise distances weighted by the charts' shared membership.
    With one-hot memberships (argmax charts) two points are at :math:`d_0` when they share a
    chart and at :math:`\infty` otherwise. It is only a semi-metric (the triangle inequality
    may fail).

    ``variant``:

    - ``"paper"`` (default): Eq. 7 as printed, with ``d0="euclidean"`` by default:
      :math:`d_0 = \|\sigma^{-1}(x) - \sigma^{-1}(y)\|`, the Euclidean distance of the
      pre-sigmoid coordinates used by MTriplet (Sec. 3.2), and :math:`+\infty` when the charts
      share no mass.
    - ``"code"``: the authors' public code (neurve's ``pdist_mfld``), with
      ``d0="mean_squared"`` by default (the squared distance averaged over the :math:`d`
      coordinates), the denominator :math:`\sum_i q_i(x) q_i(y) + 10^{-12}`, and 1 instead of
      :math:`\infty` wherever that shared membership is at most :math:`10^{-12}` (points
      confidently in different charts), as the code does.

    ``d0`` (``"euclidean"``, ``"squared"``, ``"mean_squared"``; see :func:`chart_distances`)
    overrides the variant's choice.

    The weights :math:`q_i(x) q_i(y) / \sum_j q_j(x) q_j(y)` are computed as a softmax over
    charts of :math:`\log q_i(x) + \log q_i(y)`: identical values, but no product of two small
    float32 probabilities can underflow to a spurious zero denominator, and the gradient never
    divides by it. The result is :math:`\infty` exactly when, for every chart, one of the two
    memberships is exactly 0 (``-inf`` in log space). No NaN reaches the backward pass: zero
    distances go through :func:`safe_sqrt`, zero memberships get no gradient, and the
    :math:`\infty` entries are constants.

    Args:
        q1: :math:`(N_1, n)` memberships :math:`q(x)` (non-negative), or log-memberships when
            ``q_is_log``.
        c1: :math:`(N_1, n, d)` pre-sigmoid chart coordinates of the first set.
        q2: :math:`(N_2, n)` memberships of the second set.
        c2: :math:`(N_2, n, d)` pre-sigmoid chart coordinates of the second set.
        d0: chart metric, or ``None`` for the variant's default.
        variant: ``"paper"`` or ``"code"``.
        q_is_log: ``q1`` and ``q2`` hold log-probabilities (e.g. ``ChartOutputs.log_q``;
            ``-inf`` for an exact 0). For the ``"paper"`` variant any per-row constant shift
            gives the same result, so membership logits work too; the ``"code"`` variant's
            :math:`10^{-12}` reads the membership itself and needs log-probabilities.

    Shape: output :math:`(N_1, N_2)`; memory :math:`O(N_1 N_2 n d)` (use
    :func:`kdml.evaluation.charts.chart_retrieval_metrics` for large retrieval sets).

    Example::

        >>> q = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # one-hot charts
        >>> c = torch.tensor([[[0.0], [5.0]], [[3.0], [5.0]], [[3.0], [0.0]]])
        >>> manifold_distance(q, c, q, c)
        tensor([[0., 3., inf],
                [3., 0., inf],
                [inf, inf, 0.]])
        >>> manifold_distance(q, c, q, c, variant="code")[0]
        tensor([0., 9., 1.])
    """
    if variant not in DISTANCE_VARIANTS:
        raise KdmlError(f"variant must be one of {', '.join(DISTANCE_VARIANTS)}, got {variant!r}")
    check_tensor_inputs("manifold_distance", [q1, c1, q2, c2], "memberships and coordinates")
    for name, q, c in (("first", q1, c1), ("second", q2, c2)):
        if c.ndim != 3 or q.shape != c.shape[:2] or c.shape[1] == 0:
            raise KdmlError(
                f"manifold_distance: the {name} set needs q [N, n] and coords [N, n, d] with "
                f"n >= 1, got {tuple(q.shape)} and {tuple(c.shape)}"
            )
    if c1.shape[1:] != c2.shape[1:]:
        raise KdmlError(
            f"manifold_distance: both sets need the same (n, d), got {tuple(c1.shape[1:])} and "
            f"{tuple(c2.shape[1:])}"
        )
    check_same_device("manifold_distance", [q1, c1, q2, c2], "memberships and coordinates")
    for q in (q1, q2):
        check_real_memberships("manifold_distance", q)
    if d0 is None:
        d0 = "euclidean" if variant == "paper" else "mean_squared"
    per_chart = chart_distances(c1, c2, d0)  # [N1, N2, n]
    log_q1, log_q2 = (q1, q2) if q_is_log else (_log_membership(q1), _log_membership(q2))
    log_weights = log_q1[:, None, :] + log_q2[None, :, :]  # log q_i(x) q_i(y)
    # "not -inf", so that a NaN (a NaN membership) goes on to a NaN distance
    shares_a_chart = log_weights.amax(dim=-1) != -torch.inf
    # Rows without a shared chart would be softmax(-inf, ..., -inf) = NaN: give them dummy
    # weights (their value is replaced below, and `where` sends them no gradient).
    log_weights = torch.where(shares_a_chart[..., None], log_weights, 0.0)
    weights = torch.softmax(log_weights, dim=-1)
    distance = (weights * per_chart).sum(dim=-1)
    if variant == "paper":
        return torch.where(shares_a_chart, distance, torch.inf)
    # pdist_mfld divides by (shared + 1e-12) and gives 1 where shared <= 1e-12: in log space,
    # shared / (shared + 1e-12) = sigmoid(log shared - log 1e-12), with no small product that
    # could underflow to 0 (the masked rows' log-mass is finite, so no NaN gradient either)
    log_shared = torch.logsumexp(log_weights, dim=-1) - CODE_LOG_SMALL
    shares_a_chart = shares_a_chart & ~(log_shared <= 0)  # a NaN stays NaN, as above
    return torch.where(shares_a_chart, distance * torch.sigmoid(log_shared), 1.0)
