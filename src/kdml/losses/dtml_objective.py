r"""The objectives of DTML (Eq. 7) and DSTML (Hu, Lu & Tan, CVPR 2015).

DTML: the marginal Fisher criterion and the domain MMD on the top layer, plus weight decay in
the objective. DSTML adds the same criterion on every hidden layer behind a hinge.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol, SupportsFloat, cast

import torch
from torch import Tensor, nn

from kdml.checks import Count, Number, as_number, is_finite_number
from kdml.errors import KdmlError
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.precision import full_precision
from kdml.regularizers.domain import DomainMMD
from kdml.regularizers.jrs import check_batch


class WeightPenalized(Protocol):
    """A network with the gamma terms of Eq. 7 and 13, one per layer, bottom first
    (:class:`~kdml.models.dtml.DTMLNetwork`)."""

    def layer_penalties(self) -> Tensor: ...


class ObjectiveOutput(NamedTuple):
    """The total objective (differentiable) and its named terms (detached 0-dim tensors)."""

    total: Tensor
    terms: dict[str, Tensor]


def _check_number(name: str, value: object, nonnegative: bool) -> float:
    """``value`` as a float if it is a finite real number, a 0-d tensor or array too (and >= 0
    if ``nonnegative``)."""
    # a 0-d tensor had been refused as "not a finite number"
    value = as_number(value, f"DTMLObjective: {name}")
    if not is_finite_number(value, at_least=0 if nonnegative else None):
        bound = " >= 0" if nonnegative else ""
        raise KdmlError(f"DTMLObjective: {name} must be a finite number{bound}, got {value!r}")
    return float(cast(SupportsFloat, value))  # a real number: checked above


def _check_per_layer(name: str, value: Number | Sequence[Number],
                     nonnegative: bool) -> float | tuple[float, ...]:
    """One number for all hidden layers, or a sequence of one per hidden layer, checked."""
    # a 0-d tensor or array: a float
    value = as_number(value, f"DTMLObjective: {name}")  # type: ignore[assignment]
    if isinstance(value, Iterable) and not isinstance(value, str | numbers.Real):
        return tuple(_check_number(name, v, nonnegative) for v in value)
    return _check_number(name, value, nonnegative)  # a number, or refused as not one


def _per_hidden_layer(name: str, value: float | tuple[float, ...],
                      count: int) -> tuple[float, ...]:
    values = (value,) * count if isinstance(value, float) else value
    if len(values) != count:
        raise KdmlError(f"{name} needs one value per hidden layer ({count}), got {len(values)}")
    return values


class DTMLObjective(nn.Module):
    r"""The DTML objective (Eq. 7) and, with ``hidden_weight`` > 0, the DSTML objective.

    For layer :math:`m`, with :math:`S_c^{(m)}, S_b^{(m)}` of
    :class:`~kdml.losses.marginal_fisher.MarginalFisherLoss` and :math:`D_{ts}^{(m)}` of
    :class:`~kdml.regularizers.domain.DomainMMD`, all on layer :math:`m`'s outputs,

    .. math::
        J^{(m)} = S_c^{(m)} - \alpha S_b^{(m)} + \beta D_{ts}^{(m)}.

    With :math:`P^{(m)} = \|W^{(m)}\|_F^2 + \|b^{(m)}\|_2^2`, DTML (Eq. 7) minimises

    .. math::
        J = J^{(M)} + \gamma \sum_{m=1}^{M} P^{(m)}

    (:math:`\gamma` is weight decay *in the objective*; leave the optimiser's decay at 0), and
    DSTML (Eq. 12) adds the hinged criteria of the hidden layers, each with its own layer's
    penalty (Eq. 13; the gradients of Eq. 18-19 carry it as :math:`2\gamma\delta(\ell - m)`),

    .. math::
        J_{\mathrm{DSTML}} = J^{(M)} + \gamma P^{(M)} + \sum_{m=1}^{M-1} \omega^{(m)}
        \max\left(J^{(m)} + \gamma P^{(m)} - \tau^{(m)}, 0\right).

    So every layer's penalty counts once: inside its hinge where the layer is supervised
    (:math:`\omega^{(m)} > 0`), in the top term where it is not, which gives Eq. 7 when no
    layer is (a literal Eq. 12 with :math:`\omega = 0` would drop the hidden layers' decay).
    The neighbour graphs of :math:`S_c^{(m)}, S_b^{(m)}` are built on layer :math:`m`'s own
    outputs.

    ``beta = 0`` (the DDML baseline) needs no target batch; given one, :math:`D_{ts}` is still
    reported (computed without gradient). ``beta > 0`` without a target batch raises
    :class:`~kdml.errors.KdmlError`.

    The weights :math:`\alpha, \beta, \gamma, \omega^{(m)}` must be finite and
    :math:`\ge 0` (a negative one would turn a penalty into a reward); :math:`\tau^{(m)}`
    finite, of either sign (:math:`J^{(m)}` can be negative).

    Args:
        alpha: :math:`\alpha`, weight of :math:`S_b`. Default: 0.1.
        beta: :math:`\beta`, weight of :math:`D_{ts}`. Default: 10.
        gamma: :math:`\gamma`, weight decay. Default: 0.1.
        k1: same-class neighbours. Default: 5.
        k2: different-class neighbours. Default: 10.
        mmd: the discrepancy; ``None`` is Eq. 6 (``DomainMMD()``). Default: ``None``.
        hidden_weight: :math:`\omega^{(m)}`, one float for all hidden layers or one per hidden
            layer; 0 gives DTML. Default: 0.
        hidden_threshold: :math:`\tau^{(m)}`, likewise. Default: 0.

    Inputs:
        - ``source_layers``: list of the :math:`M` layer outputs of the labelled source batch,
          :math:`(N_s, p^{(m)})` each (as returned by
          :class:`~kdml.models.dtml.DTMLNetwork`).
        - ``labels``: :math:`(N_s,)` integer source labels, on the layer outputs' device.
        - ``target_layers``: the same list for the unlabelled target batch, or ``None``.
        - ``network``: a module with ``layer_penalties()`` (:math:`(M,)`); ``None`` only when
          ``gamma = 0``.

    Returns: :class:`ObjectiveOutput` ``(total, terms)``; terms are ``s_c``, ``s_b``, ``d_ts``
    (top layer; ``d_ts`` only with a target batch), ``weight_penalty`` (:math:`\sum_m P^{(m)}`),
    ``j_top`` (:math:`J^{(M)}` without the penalty) and, for DSTML, ``j@m``
    (:math:`J^{(m)} + \gamma P^{(m)}`, Eq. 13) and ``hinge@m`` per supervised hidden layer
    :math:`m = 1..M-1`.

    Example::

        >>> from kdml.models.dtml import DTMLNetwork
        >>> net = DTMLNetwork([4, 4, 3])
        >>> objective = DTMLObjective(k1=1, k2=2, hidden_weight=1.0)
        >>> source, target = net(torch.randn(6, 4)), net(torch.randn(5, 4))
        >>> out = objective(source, torch.tensor([0, 0, 1, 1, 2, 2]), target, net)
        >>> sorted(out.terms)
        ['d_ts', 'hinge@1', 'j@1', 'j_top', 's_b', 's_c', 'weight_penalty']
    """

    def __init__(self, alpha: Number = 0.1, beta: Number = 10.0, gamma: Number = 0.1,
                 k1: Count = 5, k2: Count = 10, mmd: DomainMMD | None = None,
                 hidden_weight: Number | Sequence[Number] = 0.0,
                 hidden_threshold: Number | Sequence[Number] = 0.0) -> None:
        super().__init__()
        self.beta = _check_number("beta", beta, nonnegative=True)
        self.gamma = _check_number("gamma", gamma, nonnegative=True)
        self.hidden_weight = _check_per_layer("hidden_weight", hidden_weight, nonnegative=True)
        self.hidden_threshold = _check_per_layer("hidden_threshold", hidden_threshold,
                                                 nonnegative=False)
        self.fisher = MarginalFisherLoss(k1, k2, alpha)
        if mmd is not None and not isinstance(mmd, DomainMMD):
            # a kernel gave a matrix "loss", a string failed at the first batch
            raise KdmlError(f"DTMLObjective: mmd must be a DomainMMD (e.g. "
                            f"DomainMMD(GaussianMixtureKernel(1))), got {type(mmd).__name__}; "
                            "wrap a kernel in DomainMMD")
        self.mmd = mmd if mmd is not None else DomainMMD()

    def layer_criterion(self, source: Tensor, labels: Tensor,
                        target: Tensor | None) -> tuple[Tensor, dict[str, Tensor]]:
        r""":math:`J^{(m)} = S_c - \alpha S_b + \beta D_{ts}` of one layer, and its terms."""
        compactness, separability = self.fisher.terms(source, labels)
        criterion = compactness - self.fisher.alpha * separability
        terms = {"s_c": compactness, "s_b": separability}
        if target is None:
            if self.beta > 0:
                raise KdmlError(f"beta={self.beta} > 0 needs a target-domain batch; pass "
                                "target inputs or set beta=0")
            return criterion, terms
        if self.beta > 0:
            discrepancy = self.mmd(source, target)
            criterion = criterion + self.beta * discrepancy
        else:  # reported only (DDML baseline): no graph, no cost in the backward pass
            with torch.no_grad():
                discrepancy = self.mmd(source, target)
        terms["d_ts"] = discrepancy
        return criterion, terms

    @full_precision
    def forward(self, source_layers: Sequence[Tensor], labels: Tensor,
                target_layers: Sequence[Tensor] | None = None,
                network: WeightPenalized | None = None) -> ObjectiveOutput:
        check_batch(type(self).__name__, source_layers, labels)
        num_layers = len(source_layers)
        if target_layers is not None and (isinstance(target_layers, Tensor)
                                          or not isinstance(target_layers, Sequence)):
            raise KdmlError(f"{type(self).__name__} takes the target's layer outputs as a "
                            f"sequence, as the source's, got {type(target_layers).__name__}; "
                            "pass a list")
        if target_layers is not None and len(target_layers) != num_layers:
            raise KdmlError(f"{num_layers} source layer outputs but {len(target_layers)} target")
        weights = _per_hidden_layer("hidden_weight", self.hidden_weight, num_layers - 1)
        thresholds = _per_hidden_layer("hidden_threshold", self.hidden_threshold, num_layers - 1)

        def target_at(m: int) -> Tensor | None:
            return None if target_layers is None else target_layers[m]

        top, terms = self.layer_criterion(source_layers[-1], labels, target_at(-1))
        terms["j_top"] = top
        total = top
        penalties: Tensor | None = None
        if self.gamma > 0:
            if network is None or not hasattr(network, "layer_penalties"):
                raise KdmlError(f"gamma={self.gamma} > 0 needs the network, with "
                                "layer_penalties(): ||W||_F^2 + ||b||^2 of each layer, [M] "
                                "(as DTMLNetwork has)")
            penalties = network.layer_penalties()
            if penalties.shape != (num_layers,):
                raise KdmlError(f"the network's layer_penalties() has shape "
                                f"{tuple(penalties.shape)}, not ({num_layers},) for "
                                f"{num_layers} layer outputs; pass the network that made them")
            terms["weight_penalty"] = penalties.sum()
            # the top layer's, and those of hidden layers without a hinged criterion of their own
            in_top = [penalties[-1], *(penalties[m] for m, omega in enumerate(weights)
                                       if omega == 0)]
            total = total + self.gamma * torch.stack(in_top).sum()
        for m, (omega, tau) in enumerate(zip(weights, thresholds, strict=True)):
            if omega == 0:
                continue
            hidden, _ = self.layer_criterion(source_layers[m], labels, target_at(m))
            if penalties is not None:  # Eq. 13: the layer's own weights
                hidden = hidden + self.gamma * penalties[m]
            hinge = torch.relu(hidden - tau)
            terms[f"j@{m + 1}"], terms[f"hinge@{m + 1}"] = hidden, hinge
            total = total + omega * hinge
        return ObjectiveOutput(total, {name: value.detach() for name, value in terms.items()})
