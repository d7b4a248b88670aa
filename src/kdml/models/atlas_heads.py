r"""Heads of the Atlas methods (Korman, Sec. 2.4 and Table 1).

- :class:`AtlasHead`: :math:`n` linear chart heads and a membership head on the backbone's
  pooled feature, returning :class:`~kdml.atlas.ChartOutputs`.
- :class:`ProjectionHeads`: MSimCLR's :math:`n` projection heads :math:`h_i` and the
  membership-weighted projection :math:`\sum_i q_i(x)\, h_i(\phi_i(x))`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from kdml.atlas import ChartOutputs
from kdml.checks import (
    check_feature_matrix,
    check_float_inputs,
    check_tensor_inputs,
    is_positive_int,
)
from kdml.errors import KdmlError
from kdml.precision import upcast

__all__ = ["PROJECTION_INPUTS", "AtlasHead", "ProjectionHeads"]

PROJECTION_INPUTS = ("sigmoid", "pre-sigmoid")


def _check_sizes(**sizes: int) -> None:
    for name, value in sizes.items():
        if not is_positive_int(value):
            raise KdmlError(f"{name} must be a positive integer, got {value!r}")


class AtlasHead(nn.Module):
    r"""Chart coordinates and chart membership (Korman, Sec. 2.4).

    .. math::
        c_i(x) = W_i f(x) + b_i \in \mathbb{R}^d, \qquad
        \phi_i(x) = \sigma(c_i(x)) \in [0, 1]^d, \qquad
        q(x) = \operatorname{softmax}(V f(x) + a) \in [0, 1]^n

    for the pooled backbone feature :math:`f(x)`. The :math:`n` coordinate heads are one
    ``Linear(in_features, n * d)`` (the same maps as :math:`n` separate heads, one matmul).
    The sigmoid is *not* applied: ``coords`` are the pre-sigmoid :math:`c_i(x)` used by the MMD
    kernel and by the MTriplet distance.

    Args:
        in_features: size of the pooled feature.
        dim: chart dimension :math:`d`.
        n_charts: number of charts :math:`n`.

    Inputs: ``features`` :math:`(B, \text{in\_features})`.

    Shape: :class:`~kdml.atlas.ChartOutputs` with ``coords`` :math:`(B, n, d)`, ``q`` and
    ``log_q`` :math:`(B, n)`.

    Example::

        >>> head = AtlasHead(128, dim=2, n_charts=16)
        >>> out = head(torch.randn(4, 128))
        >>> out.coords.shape, out.q.shape
        (torch.Size([4, 16, 2]), torch.Size([4, 16]))
    """

    def __init__(self, in_features: int, dim: int, n_charts: int) -> None:
        super().__init__()
        _check_sizes(in_features=in_features, dim=dim, n_charts=n_charts)
        self.dim, self.n_charts = int(dim), int(n_charts)
        self.coordinates = nn.Linear(in_features, n_charts * dim)
        self.membership = nn.Linear(in_features, n_charts)

    def forward(self, features: Tensor) -> ChartOutputs:
        check_feature_matrix("AtlasHead", features, self.coordinates.in_features)
        coords = self.coordinates(features).view(len(features), self.n_charts, self.dim)
        logits = self.membership(features)
        return ChartOutputs(coords, torch.softmax(logits, dim=1), torch.log_softmax(logits, dim=1))

    def extra_repr(self) -> str:
        return f"dim={self.dim}, n_charts={self.n_charts}"


class ProjectionHeads(nn.Module):
    r"""MSimCLR's projection: one SimCLR projection head per chart, mixed by membership.

    .. math::
        z(x) = \sum_{i=1}^n q_i(x)\, h_i(\phi_i(x)), \qquad
        h_i(u) = W^{(2)}_i \operatorname{ReLU}(W^{(1)}_i u)

    (Table 1). Each :math:`h_i` is the SimCLR head: a two-layer MLP without biases whose
    hidden width is the input dimension :math:`d` (as in SimCLR and the authors' code). The
    heads take :math:`\phi_i(x) = \sigma(c_i(x)) \in [0, 1]^d`, the chart coordinates of the
    paper; the authors' code does the same (it applies the sigmoid before the heads).
    ``head_input="pre-sigmoid"`` feeds :math:`c_i(x)` instead. With ``n_charts=1`` and
    ``q = 1`` this is the plain SimCLR head.

    All :math:`n` heads run as two batched matmuls. Weights are initialised like
    ``nn.Linear``: :math:`U(-1/\sqrt{\text{fan\_in}}, 1/\sqrt{\text{fan\_in}})`.

    Args:
        dim: chart dimension :math:`d`.
        n_charts: number of charts :math:`n`.
        out_features: projection dimension :math:`\tilde d`. Default: 128.
        hidden: hidden width; ``None`` for :math:`d`.
        head_input: ``"sigmoid"`` (paper) or ``"pre-sigmoid"``.

    Inputs: ``coords`` :math:`(B, n, d)` pre-sigmoid coordinates, ``q`` :math:`(B, n)`.

    Shape: output :math:`(B, \tilde d)`; :meth:`per_chart` gives :math:`(B, n, \tilde d)`.

    Example::

        >>> heads = ProjectionHeads(dim=2, n_charts=16, out_features=32)
        >>> out = AtlasHead(128, 2, 16)(torch.randn(4, 128))
        >>> heads(out.coords, out.q).shape
        torch.Size([4, 32])
    """

    def __init__(self, dim: int, n_charts: int, out_features: int = 128,
                 hidden: int | None = None, head_input: str = "sigmoid") -> None:
        super().__init__()
        hidden = dim if hidden is None else hidden
        _check_sizes(dim=dim, n_charts=n_charts, out_features=out_features, hidden=hidden)
        if head_input not in PROJECTION_INPUTS:
            raise KdmlError(
                f"head_input must be one of {', '.join(PROJECTION_INPUTS)}, got {head_input!r}"
            )
        self.dim, self.n_charts, self.head_input = int(dim), int(n_charts), head_input
        self.hidden_weight = nn.Parameter(torch.empty(n_charts, dim, hidden))
        self.output_weight = nn.Parameter(torch.empty(n_charts, hidden, out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for weight in (self.hidden_weight, self.output_weight):
            bound = 1.0 / math.sqrt(weight.shape[1])  # fan_in of each chart's layer
            nn.init.uniform_(weight, -bound, bound)

    def per_chart(self, coords: Tensor) -> Tensor:
        r""":math:`h_i(\phi_i(x))` for every chart, shape :math:`(B, n, \tilde d)`."""
        return self._per_chart_of(self.hidden_preactivations(coords))

    def hidden_preactivations(self, coords: Tensor) -> Tensor:
        r""":math:`W^{(1)}_i \phi_i(x)` for every chart, shape :math:`(B, n, h)`."""
        check_tensor_inputs("ProjectionHeads", [coords], "coords")
        if coords.ndim != 3 or coords.shape[1:] != (self.n_charts, self.dim):
            raise KdmlError(
                f"ProjectionHeads expects coords [B, {self.n_charts}, {self.dim}], got "
                f"{tuple(coords.shape)}"
            )
        check_float_inputs("ProjectionHeads", [coords], "coords")
        inputs = torch.sigmoid(coords) if self.head_input == "sigmoid" else coords
        return torch.einsum("bnd,ndh->bnh", inputs, self.hidden_weight)

    def active_share(self, coords: Tensor, q: Tensor) -> Tensor:
        r"""The membership-weighted share of hidden units a sample activates,
        :math:`\frac{1}{B} \sum_b \sum_i q_i(x_b) \frac{1}{h} |\{k : (W^{(1)}_i
        \phi_i(x_b))_k > 0\}|`, a scalar in [0, 1], without gradient.

        A diagnostic: the heads have no bias and, on the paper's sigmoid coordinates
        (:math:`\phi \ge 0`), a unit whose weights are all negative is off for every input.
        With :math:`h = d = 2` units, a sample with fewer than two on projects onto one
        direction at most (zero when none is on), so NT-Xent, which compares directions,
        cannot tell the samples apart. :meth:`project` gives it with the projection, from the
        same pre-activations."""
        self._check_memberships(coords, q)  # a [B, 1] q had broadcast over the charts
        return _active_share_of(self.hidden_preactivations(coords), q)

    def project(self, coords: Tensor, q: Tensor) -> tuple[Tensor, Tensor]:
        """The projection of :meth:`forward` and the :meth:`active_share` of the same pass."""
        self._check_memberships(coords, q)
        preactivations = self.hidden_preactivations(coords)
        return self._projection_of(preactivations, q), _active_share_of(preactivations, q)

    def forward(self, coords: Tensor, q: Tensor) -> Tensor:
        self._check_memberships(coords, q)
        return self._projection_of(self.hidden_preactivations(coords), q)

    def _projection_of(self, preactivations: Tensor, q: Tensor) -> Tensor:
        return torch.einsum("bn,bnp->bp", q, self._per_chart_of(preactivations))

    def _per_chart_of(self, preactivations: Tensor) -> Tensor:
        return torch.einsum("bnh,nhp->bnp", torch.relu(preactivations), self.output_weight)

    @staticmethod
    def _check_memberships(coords: Tensor, q: Tensor) -> None:
        check_tensor_inputs("ProjectionHeads", [coords, q], "coords and memberships q")
        check_float_inputs("ProjectionHeads", [q], "memberships q")
        if q.shape != coords.shape[:2]:
            raise KdmlError(
                f"ProjectionHeads: q must be [B, n] = {tuple(coords.shape[:2])}, "
                f"got {tuple(q.shape)}"
            )

    def extra_repr(self) -> str:
        return (f"dim={self.dim}, n_charts={self.n_charts}, hidden={self.hidden_weight.shape[2]}, "
                f"out_features={self.output_weight.shape[2]}, head_input={self.head_input!r}")


def _active_share_of(preactivations: Tensor, q: Tensor) -> Tensor:
    """:meth:`ProjectionHeads.active_share` from the heads' pre-activations [B, n, h]."""
    with torch.no_grad():  # at least float32: a bf16 q under autocast had rounded the share
        q = upcast(q)
        active = (preactivations > 0).to(q.dtype).mean(dim=2)
        return (q * active).sum(dim=1).mean()
