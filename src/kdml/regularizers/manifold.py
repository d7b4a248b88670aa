r"""The Atlas regularizers (Korman, Sec. 2.2): a manifold MMD to the uniform prior and a chart
membership loss, combined as :math:`\ell_{reg} = \lambda_1 \ell_{\mathcal{Z}} +
\lambda_2 \ell_{\mathcal{J}}` (Eq. 6).

- :class:`ManifoldMMD`: :math:`\ell_{\mathcal{Z}}`, the U-statistic estimate of
  :math:`\mathrm{MMD}^2(p, \mathcal{U}_{\mathcal{Z}})` of Prop. 1 / Eq. 5.
- :class:`ChartMembershipLoss`: :math:`\ell_{\mathcal{J}}`, which pushes each :math:`q(x)`
  away from uniform (towards one chart per point).

With one chart (:math:`n = 1`) :class:`ManifoldMMD` is the Euclidean MMD-to-uniform regularizer
of Sec. 3.2.2 and can be added to any metric-learning loss (see its example).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kdml.checks import (
    Count,
    Number,
    as_number,
    check_float_inputs,
    check_real_memberships,
    check_same_device,
    check_tensor_inputs,
    is_finite_number,
    is_positive_int,
)
from kdml.errors import KdmlError
from kdml.kernels import InverseMultiquadricKernel
from kdml.precision import full_precision

__all__ = ["ChartMembershipLoss", "ManifoldMMD"]


def _off_diagonal_sum(matrix: Tensor) -> Tensor:
    off_diagonal = ~torch.eye(len(matrix), dtype=torch.bool, device=matrix.device)
    return torch.where(off_diagonal, matrix, 0.0).sum()


class ManifoldMMD(nn.Module):
    r"""Manifold MMD between the encoded batch and the uniform prior on
    :math:`[0, 1]^d \times \{1, \dots, n\}` (Korman, Prop. 1, Eq. 5).

    For a batch :math:`x_1..x_N` and a prior sample :math:`w_1..w_M \sim U[0, 1]^d`
    (:math:`M = N` in the paper):

    .. math::
        \ell_{\mathcal{Z}} =
        \frac{1}{N(N-1)} \sum_{j \ne k} \sum_{i=1}^n q_i(x_j) q_i(x_k)\,
            k_0(\phi_i(x_j), \phi_i(x_k))
        - \frac{2}{n N M} \sum_{j, k} \sum_{i=1}^n q_i(x_j)\, k_0(\phi_i(x_j), w_k)
        + \frac{1}{n M(M-1)} \sum_{j \ne k} k_0(w_j, w_k)

    with the inverse multiquadric kernel pulled back through the sigmoid,
    :math:`k_0(x, y) = C / (C + \|\sigma^{-1}(x) - \sigma^{-1}(y)\|^2)`, :math:`C = d / 6`
    (:class:`~kdml.kernels.InverseMultiquadricKernel`). It is evaluated on the pre-sigmoid
    coordinates :math:`c_i = \sigma^{-1}(\phi_i)` and on :math:`\sigma^{-1}(w)`, with
    :math:`w` clamped to :math:`[\varepsilon, 1 - \varepsilon]` so that the logit is finite.
    The last term does not depend on the model; it is kept so that the value is the unbiased
    MMD² estimate (it can be slightly negative).

    The prior sample is ``prior_sample`` when given (tests, reproducible evaluation),
    otherwise :math:`N` fresh points drawn on every call from the call's ``generator``, else
    the module's, else torch's global generator (seeded by ``torch.manual_seed``). The
    trainer passes each step's own generator, seeded from (seed, epoch, step).

    With ``n_charts=1`` the call also accepts plain embeddings ``mmd(embeddings)`` of shape
    :math:`(N, d)` (membership 1): the Euclidean regularizer of Sec. 3.2.2.

    Args:
        dim: chart dimension :math:`d` (sets :math:`C = d / 6`).
        n_charts: number of charts :math:`n`.
        generator: ``torch.Generator`` for the prior sample, or ``None``.
        eps: clamp of the prior sample before the logit, in :math:`(0, 0.5)`; a number, or a
            0-d tensor or array (stored as a Python float). Default: 1e-6
            (:math:`|\sigma^{-1}| \le 13.8`).

    Inputs:
        - ``coords``: :math:`(N, n, d)` pre-sigmoid chart coordinates (or :math:`(N, d)` when
          :math:`n = 1`), :math:`N \ge 2`.
        - ``q``: :math:`(N, n)` chart memberships (``None`` only when :math:`n = 1`).
        - ``prior_sample``: optional :math:`(M, d)` uniform sample in :math:`[0, 1]^d`,
          :math:`M \ge 2`.
        - ``generator``: optional ``torch.Generator`` for this call's prior sample.

    Shape: output is a scalar.

    Raises:
        KdmlError: for a batch or prior sample of fewer than 2 points (the U-statistic needs
        pairs), for shapes that do not match ``dim`` / ``n_charts``, for inputs that are not
        torch tensors, integer coordinates, complex memberships and memberships on another
        device than the coordinates.

    Example (the Sec. 3.2.2 regularizer next to a pytorch-metric-learning loss)::

        >>> from pytorch_metric_learning.losses import TripletMarginLoss
        >>> mmd = ManifoldMMD(dim=64, n_charts=1, generator=torch.Generator().manual_seed(0))
        >>> embeddings = torch.randn(32, 64, requires_grad=True)  # head output, no sigmoid
        >>> labels = torch.arange(8).repeat_interleave(4)
        >>> loss = TripletMarginLoss(margin=0.2)(embeddings, labels) + 1.0 * mmd(embeddings)
        >>> loss.backward()
    """

    def __init__(self, dim: Count, n_charts: Count, generator: torch.Generator | None = None,
                 eps: Number = 1e-6) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("n_charts", n_charts)):
            if not is_positive_int(value):
                raise KdmlError(f"ManifoldMMD: {name} must be a positive integer, got {value!r}")
        # a 0-d tensor or array: a float
        eps = as_number(eps, "ManifoldMMD: eps")  # type: ignore[assignment]
        if not is_finite_number(eps, above=0) or not eps < 0.5:
            raise KdmlError(f"ManifoldMMD: eps must be a number in (0, 0.5), got {eps!r}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise KdmlError(f"ManifoldMMD: generator must be a torch.Generator (e.g. "
                            f"torch.Generator().manual_seed(0)) or None, got {generator!r}")
        self.dim, self.n_charts, self.eps = int(dim), int(n_charts), float(eps)
        self.generator = generator
        self.kernel = InverseMultiquadricKernel(dim / 6)

    @full_precision
    def forward(self, coords: Tensor, q: Tensor | None = None,
                prior_sample: Tensor | None = None,
                generator: torch.Generator | None = None) -> Tensor:
        coords, q = self._check_batch(coords, q)
        num_points = len(coords)
        if prior_sample is None:
            prior_sample = self.sample_prior(num_points, coords, generator)
        else:
            check_tensor_inputs("ManifoldMMD", [prior_sample], "prior_sample")
        if prior_sample.ndim != 2 or prior_sample.shape[1] != self.dim or len(prior_sample) < 2:
            raise KdmlError(
                f"ManifoldMMD: prior_sample must be [M, {self.dim}] with M >= 2, "
                f"got {tuple(prior_sample.shape)}"
            )
        if not prior_sample.is_floating_point():  # integers 0 and 1: the cube's corners only
            raise KdmlError(f"ManifoldMMD: prior_sample must be a float sample of the uniform "
                            f"prior on [0, 1]^d, got dtype {prior_sample.dtype}")
        # its values are read where that is free (a GPU step would wait for the device): a
        # normal sample given for the uniform one had been clamped into [eps, 1 - eps]
        if prior_sample.device.type == "cpu" and not torch.compiler.is_compiling() and not (
                (prior_sample >= 0) & (prior_sample <= 1)).all():
            raise KdmlError("ManifoldMMD: prior_sample must be a sample of the uniform prior "
                            "on [0, 1]^d (Korman, Eq. 5), but holds values outside [0, 1]; "
                            "leave it out for kdml to draw one")
        # in float64: in float32, 1 - eps rounds to 1 for eps below 2^-24, a logit of inf
        prior = torch.logit(prior_sample.to(coords.device, torch.float64)
                            .clamp(self.eps, 1.0 - self.eps)).to(coords.dtype)
        num_prior, n = len(prior), self.n_charts

        # sum_{j != k} sum_i q_i(x_j) q_i(x_k) k0(c_i(x_j), c_i(x_k)), one chart at a time
        data_pairs = sum(
            _off_diagonal_sum(q[:, i, None] * q[None, :, i] * self.kernel(coords[:, i]))
            for i in range(n)
        )
        # sum_{j, k} sum_i q_i(x_j) k0(c_i(x_j), logit(w_k)): all charts in one kernel call
        to_prior = self.kernel(coords.reshape(num_points * n, self.dim), prior)
        cross = (q * to_prior.view(num_points, n, num_prior).sum(dim=2)).sum()
        prior_pairs = _off_diagonal_sum(self.kernel(prior))
        return (
            data_pairs / (num_points * (num_points - 1))
            - 2.0 * cross / (n * num_points * num_prior)
            + prior_pairs / (n * num_prior * (num_prior - 1))
        )

    def sample_prior(self, num_points: int, like: Tensor,
                     generator: torch.Generator | None = None) -> Tensor:
        """``num_points`` uniform points in :math:`[0, 1]^d` with the dtype/device of ``like``,
        drawn from ``generator`` (default: the module's)."""
        if generator is not None and not isinstance(generator, torch.Generator):
            raise KdmlError(f"ManifoldMMD: the generator of a call must be a torch.Generator "
                            f"(e.g. torch.Generator().manual_seed(0)) or None, got "
                            f"{generator!r}")
        generator = generator if generator is not None else self.generator
        device = generator.device if generator is not None else like.device
        sample = torch.rand(num_points, self.dim, generator=generator, device=device,
                            dtype=like.dtype)
        return sample.to(like.device)

    def _check_batch(self, coords: Tensor, q: Tensor | None) -> tuple[Tensor, Tensor]:
        # types, shapes, dtypes and devices: no host sync
        check_tensor_inputs("ManifoldMMD", [coords] if q is None else [coords, q],
                            "chart coordinates and memberships")
        if coords.ndim == 2 and self.n_charts == 1:
            coords = coords[:, None, :]
        expected = f"[N, {self.n_charts}, {self.dim}]"
        if coords.ndim != 3 or coords.shape[1:] != (self.n_charts, self.dim):
            raise KdmlError(f"ManifoldMMD expects coords {expected}, got {tuple(coords.shape)}")
        if len(coords) < 2:
            raise KdmlError(
                f"ManifoldMMD needs at least 2 points (pairs j != k), got {len(coords)}"
            )
        if q is None:
            if self.n_charts != 1:
                raise KdmlError("ManifoldMMD needs the memberships q when n_charts > 1")
            q = coords.new_ones(len(coords), 1)
        if q.shape != coords.shape[:2]:
            raise KdmlError(
                f"ManifoldMMD: q must be [N, n] = {tuple(coords.shape[:2])}, got {tuple(q.shape)}"
            )
        check_float_inputs("ManifoldMMD", [coords], "chart coordinates")
        check_real_memberships("ManifoldMMD", q)
        check_same_device("ManifoldMMD", [coords, q], "chart coordinates and memberships")
        return coords, q

    def extra_repr(self) -> str:
        return f"dim={self.dim}, n_charts={self.n_charts}, eps={self.eps}"


class ChartMembershipLoss(nn.Module):
    r"""Chart membership loss :math:`\ell_{\mathcal{J}}` (Korman, Sec. 2.2).

    .. math::
        \ell_{\mathcal{J}}(q) = -\mathbb{E}_x\,
        \mathrm{MMD}_{k_{\mathcal{J}}}(q(x), \mathcal{U}_{\mathcal{J}})
        = -\frac{1}{N} \sum_{j=1}^N \sum_{i=1}^n \left(q_i(x_j) - \frac1n\right)^2

    with the discrete kernel :math:`k_{\mathcal{J}}(i, j) = \delta_{ij}`. Minimising it makes
    each :math:`q(x)` concentrated on few charts (an efficient atlas); its minimum
    :math:`-(1 - 1/n)` is reached by one-hot memberships. With :math:`n = 1` it is 0.

    Inputs: ``q`` :math:`(N, n)` memberships, :math:`N \ge 1` (bool or integer one-hot
    memberships are taken as floats; complex ones are refused).

    Shape: output is a scalar.

    Example::

        >>> ChartMembershipLoss()(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
        tensor(-0.2500)
    """

    @full_precision
    def forward(self, q: Tensor) -> Tensor:
        check_tensor_inputs("ChartMembershipLoss", [q], "memberships q")
        if q.ndim != 2 or q.shape[0] == 0 or q.shape[1] == 0:
            raise KdmlError(f"ChartMembershipLoss expects q [N, n] with N, n >= 1, "
                            f"got {tuple(q.shape)}")
        check_real_memberships("ChartMembershipLoss", q)
        if not q.is_floating_point():  # one-hot memberships as bool or int, as ManifoldMMD takes
            q = q.float()
        # 0 - x, not -x: one chart's loss (q = 1) is then 0, not the -0 train.log and
        # metrics.csv had shown
        return 0.0 - (q - 1.0 / q.shape[1]).pow(2).sum(dim=1).mean()
