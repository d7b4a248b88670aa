r"""The pairwise generalized logistic loss of DDML (Hu, Lu & Tan, CVPR 2014).

Discriminative Deep Metric Learning ("Discriminative Deep Metric Learning for Face Verification
in the Wild", CVPR 2014) asks the squared Euclidean distance of every positive pair (same
class) to fall below :math:`\tau - 1` and that of every negative pair above :math:`\tau + 1`,
i.e. :math:`l_{ij} (\tau - d^2_{ij}) > 1`, and softens the violation with the generalized
logistic loss :math:`g(z) = \frac{1}{\beta} \log(1 + e^{\beta z})` (a smooth hinge whose
sharpness grows with :math:`\beta`). Its objective is

.. math::
    J = \frac{1}{2} \sum_{i, j} g\left(1 - l_{ij} (\tau - d^2_{ij})\right)
        + \frac{\lambda}{2} \sum_m \left(\|W^{(m)}\|_F^2 + \|b^{(m)}\|_2^2\right);

this module holds the data term. It is the method of the DTML paper's (CVPR 2015) "DDML" row;
kdml's ``ddml`` recipe is the different "DTML, beta = 0" row (marginal Fisher, no transfer).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kdml.checks import Number, as_number, check_labels, is_finite_number
from kdml.errors import KdmlError
from kdml.kernels import FLOAT32_SETTING_RANGE, squared_distances
from kdml.losses.pml_call import check_pml_call
from kdml.precision import full_precision

REDUCTIONS = ("mean", "sum")


def _check_sharpness(sharpness: Number) -> float:
    sharpness = as_number(sharpness, "sharpness")  # type: ignore[assignment]
    if not is_finite_number(sharpness, above=0):
        raise KdmlError(f"sharpness (DDML's beta) must be a finite number > 0, got {sharpness!r}")
    # as the kernels' settings: the loss computes in float32 or wider, where a beta outside
    # this range, or its reciprocal, is 0 or inf (beta = 1e39 gave a NaN loss and gradient)
    low, high = FLOAT32_SETTING_RANGE
    if not low <= float(sharpness) <= high:
        raise KdmlError(f"sharpness (DDML's beta) {sharpness!r} is outside [{low:.3g}, "
                        f"{high:.3g}], where it and its reciprocal are normal float32 numbers "
                        "(the loss computes in float32 or wider)")
    return float(sharpness)


def _check_threshold(threshold: Number) -> float:
    threshold = as_number(threshold, "threshold")  # type: ignore[assignment]
    if not is_finite_number(threshold):
        raise KdmlError(f"threshold (DDML's tau) must be a finite number, got {threshold!r}")
    return float(threshold)


def _check_reduction(reduction: str) -> str:
    if reduction not in REDUCTIONS:
        raise KdmlError(f"reduction must be one of {', '.join(REDUCTIONS)}, got {reduction!r}")
    return reduction


def _check_inputs(embeddings: Tensor, labels: Tensor) -> None:
    check_labels("pairwise_logistic_loss", labels, [embeddings])
    if embeddings.ndim != 2 or labels.ndim != 1 or len(labels) != len(embeddings):
        raise KdmlError(f"the pairwise logistic loss expects embeddings [N, D] and labels [N], "
                        f"got {tuple(embeddings.shape)} and {tuple(labels.shape)}")
    if not embeddings.is_floating_point():
        raise KdmlError(f"the pairwise logistic loss expects float embeddings, got "
                        f"{embeddings.dtype}")


@full_precision
def pairwise_logistic_loss(embeddings: Tensor, labels: Tensor, threshold: Number = 3.0,
                           sharpness: Number = 2.0, reduction: str = "mean") -> Tensor:
    r"""DDML's data term over every unordered pair :math:`i < j` of the batch.

    .. math::
        \ell_{ij} = g\left(1 - l_{ij} (\tau - d^2_{ij})\right), \qquad
        g(z) = \frac{1}{\beta} \log\left(1 + e^{\beta z}\right), \qquad
        d^2_{ij} = \|x_i - x_j\|_2^2,

    with :math:`l_{ij} = +1` when :math:`x_i, x_j` share a class and :math:`-1` otherwise.
    :math:`g` is computed as ``softplus(z, beta=beta)``, which is linear where
    :math:`\beta z > 20` and so never overflows (``softplus(beta * z) / beta`` was ``inf``
    once :math:`\beta z` left the float32 range, e.g. :math:`\beta = 10^{37}`,
    :math:`z = 98`). :math:`\beta` lies in :data:`~kdml.kernels.FLOAT32_SETTING_RANGE`.

    **Pairs.** The paper's :math:`\frac{1}{2} \sum_{i,j}` runs over ordered pairs; the
    :math:`\frac{1}{2}` undoes the double count, and the :math:`i = j` terms are the constant
    :math:`g(1 - \tau)` (:math:`d^2_{ii} \equiv 0`), without gradient. So kdml sums each
    unordered pair :math:`i < j` once and leaves out the constant: ``reduction="sum"`` is the
    paper's :math:`J_1` up to that constant.

    **Normalisation.** ``reduction="mean"`` (default) divides by the :math:`N (N - 1) / 2` pairs
    (the same value as the mean over the ordered pairs :math:`i \ne j`). The paper descends one
    pair at a time; the mean over a mini-batch's pairs is the expectation of that per-pair step,
    so the learning rate and the weight of :math:`\frac{\lambda}{2} \|W\|^2` relative to the data
    term do not depend on the batch size (with the sum, the data term's gradient grows as
    :math:`N^2`). A batch with fewer than two samples has no pair: the result is 0, still
    attached to the graph.

    Args:
        embeddings: :math:`(N, D)` float, the top-layer outputs :math:`f(x)`.
        labels: :math:`(N,)` integer class labels, on the embeddings' device.
        threshold: :math:`\tau`; positive pairs are pushed below :math:`\tau - 1`, negative
            ones above :math:`\tau + 1`. Default: 3.
        sharpness: :math:`\beta > 0` of :math:`g` (DDML's :math:`\beta`; not DTML's domain
            weight). Default: 2.
        reduction: ``"mean"`` or ``"sum"`` over the pairs. Default: ``"mean"``.

    :math:`\tau` and :math:`\beta` are numbers or 0-d tensors or arrays holding one, read as
    Python floats on every call (for a GPU tensor, a host sync: :class:`PairwiseLogisticLoss`
    reads them once, when made).

    Returns: a scalar (float32 or wider, whatever the input dtype).

    Example::

        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> pairwise_logistic_loss(x, torch.tensor([0, 0, 1]), threshold=3.0, sharpness=1.0)
        tensor(0.3377)
    """
    _check_inputs(embeddings, labels)
    threshold, sharpness = _check_threshold(threshold), _check_sharpness(sharpness)
    reduction = _check_reduction(reduction)
    rows, cols = torch.triu_indices(len(labels), len(labels), offset=1,
                                    device=embeddings.device)
    sq_dists = squared_distances(embeddings, embeddings)[rows, cols]
    same = labels[rows] == labels[cols]
    signs = torch.where(same, 1.0, -1.0).to(sq_dists.dtype)
    losses = F.softplus(1.0 - signs * (threshold - sq_dists), beta=sharpness)
    if reduction == "sum":
        return losses.sum()
    return losses.sum() / max(len(losses), 1)


class PairwiseLogisticLoss(nn.Module):
    r"""DDML's pairwise generalized logistic loss (Hu, Lu & Tan, CVPR 2014) as a module:
    :func:`pairwise_logistic_loss` with fixed :math:`\tau, \beta`.

    .. math::
        \frac{1}{P} \sum_{i < j} \frac{1}{\beta} \log\left(1 + e^{\beta \left(1 - l_{ij}
        (\tau - \|x_i - x_j\|_2^2)\right)}\right), \qquad P = \frac{N (N - 1)}{2}

    (``reduction="sum"`` drops the :math:`1/P`). The weight decay of the paper's objective is
    not part of the loss: the ``ddml-logistic`` recipe adds it from the network.

    Args:
        threshold: :math:`\tau`. Default: 3.
        sharpness: :math:`\beta > 0`. Default: 2.
        reduction: ``"mean"`` or ``"sum"``. Default: ``"mean"``.

    :math:`\tau` and :math:`\beta` may be 0-d tensors or arrays, read once, here, as numbers.

    Inputs: ``embeddings`` :math:`(N, D)` float, ``labels`` :math:`(N,)` integer tensor on
    the embeddings' device.
    Shape: output is a scalar.

    **pytorch-metric-learning.** The call takes PML's signature, ``loss(embeddings, labels,
    indices_tuple=None, ref_emb=None, ref_labels=None)``, so the loss works inside PML's
    ``MultipleLosses``. It uses every pair of the batch: a miner's ``indices_tuple`` and a
    reference batch (``ref_emb``, ``ref_labels``, ``CrossBatchMemory``) are refused with
    :class:`~kdml.errors.KdmlError`.

    Example::

        >>> loss = PairwiseLogisticLoss(threshold=3.0, sharpness=1.0)
        >>> x = torch.tensor([[0.0], [1.0], [3.0]])
        >>> # pairs (0,1) same d2=1, (0,2) other d2=9, (1,2) other d2=4: z = -1, -5, 0
        >>> loss(x, torch.tensor([0, 0, 1]))
        tensor(0.3377)
    """

    def __init__(self, threshold: Number = 3.0, sharpness: Number = 2.0,
                 reduction: str = "mean") -> None:
        super().__init__()
        self.threshold = _check_threshold(threshold)
        self.sharpness = _check_sharpness(sharpness)
        self.reduction = _check_reduction(reduction)

    def forward(self, embeddings: Tensor, labels: Tensor | None = None,
                indices_tuple: object = None, ref_emb: Tensor | None = None,
                ref_labels: Tensor | None = None) -> Tensor:
        """The loss of ``embeddings`` :math:`(N, D)` and ``labels`` :math:`(N,)`; PML's other
        arguments must be ``None`` (see the class docstring)."""
        labels = check_pml_call(type(self).__name__, "uses every pair of the batch", labels,
                                indices_tuple, ref_emb, ref_labels)
        return pairwise_logistic_loss(embeddings, labels, self.threshold, self.sharpness,
                                      self.reduction)

    def extra_repr(self) -> str:
        return (f"threshold={self.threshold}, sharpness={self.sharpness}, "
                f"reduction={self.reduction!r}")
