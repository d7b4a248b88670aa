r"""The marginal Fisher analysis criterion of DTML (Hu, Lu & Tan, CVPR 2015, Eq. 3-5).

Intra-class compactness over each sample's :math:`k_1` nearest same-class neighbours, and
inter-class separability over its :math:`k_2` nearest different-class neighbours (Yan et al.'s
graph embedding framework, T-PAMI 2007), both measured with the squared Euclidean distance of
the embeddings.
"""

from __future__ import annotations

import warnings
from typing import SupportsFloat, cast

import torch
from torch import Tensor, nn

from kdml.checks import (
    Count,
    Number,
    as_number,
    check_float_inputs,
    check_labels,
    is_finite_number,
    is_positive_int,
)
from kdml.errors import KdmlError
from kdml.kernels import squared_distances
from kdml.losses.pml_call import check_pml_call
from kdml.precision import full_precision


def _check_k(name: str, value: Count) -> int:
    if not is_positive_int(value):
        raise KdmlError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def nearest_neighbour_graph(sq_dists: Tensor, candidates: Tensor, k: int) -> Tensor:
    """0/1 matrix marking, in each row, the ``k`` nearest of that row's candidate columns.

    Rows with fewer than ``k`` candidates mark all of them. Ties are broken by column index
    (lower first, as a stable sort), so the graph is deterministic. A candidate whose distance
    overflowed to ``inf`` or is NaN still ranks after every finite one and before every
    non-candidate (NaN ranked as ``inf``), so it is marked when the row has room for it.

    Args:
        sq_dists: :math:`(N, N)` distances (only their order matters; not differentiated).
        candidates: :math:`(N, N)` bool, which columns row :math:`i` may pick.
        k: neighbours per row.

    Returns:
        :math:`(N, N)` matrix of the dtype of ``sq_dists``.
    """
    # a candidate's NaN becomes inf; non-candidates are NaN, which compares false with every
    # distance and which topk ranks after every number, inf included
    masked = torch.where(candidates, sq_dists.detach().nan_to_num(
        nan=float("inf"), posinf=float("inf")), float("nan"))
    if masked.shape[1] == 0:
        return torch.zeros_like(sq_dists)
    # the k-th nearest distance by topk, not a sort of every row (a full batch of 5,000,
    # configs/dtml-paper.yaml, spent half of each step sorting its graphs' rows); a row of
    # fewer than k candidates has a NaN k-th, taken as inf: every candidate is at most that
    kth = masked.topk(min(k, masked.shape[1]), dim=1, largest=False).values[:, -1:]
    kth = kth.nan_to_num(nan=float("inf"), posinf=float("inf"))
    nearer, tied = masked < kth, masked == kth
    room = k - nearer.sum(1, keepdim=True, dtype=torch.int32)
    # of the candidates at the k-th distance, the lowest columns fill the row, as the stable
    # sort this replaces took them
    graph = nearer | (tied & (tied.cumsum(1, dtype=torch.int32) <= room))
    return graph.to(sq_dists.dtype)


class MarginalFisherLoss(nn.Module):
    r"""The marginal Fisher criterion :math:`S_c - \alpha S_b` of DTML (Eq. 3-5).

    .. math::
        S_c = \frac{1}{N k_1} \sum_{i=1}^N \sum_{j=1}^N P_{ij}\, d^2(x_i, x_j), \qquad
        S_b = \frac{1}{N k_2} \sum_{i=1}^N \sum_{j=1}^N Q_{ij}\, d^2(x_i, x_j)

    with :math:`d^2(x_i, x_j) = \|f(x_i) - f(x_j)\|_2^2` on the embeddings, :math:`P_{ij} = 1`
    when :math:`x_j` is one of the :math:`k_1` nearest same-class neighbours of :math:`x_i`
    (:math:`i` itself excluded) and :math:`Q_{ij} = 1` when :math:`x_j` is one of its
    :math:`k_2` nearest different-class neighbours. :math:`P` and :math:`Q` are rebuilt on every
    call from the current embeddings of the batch, without gradient (equal computed distances:
    lower index first; distances equal only in exact arithmetic may differ in the last bit
    and go either way, which leaves :math:`S_c` and :math:`S_b` unchanged).

    **Small batches.** A sample whose class has fewer than :math:`k_1 + 1` members in the batch
    takes all its same-class samples; one with fewer than :math:`k_2` samples of other classes
    takes all of those. The first batch a loss object sees is checked for this, and warned of
    (later batches are not checked: the check is a host sync), with the remedy of each graph:
    more samples per class (``data.samples_per_class``) fill :math:`P`, only more classes per
    batch (a larger ``data.batch_size`` at the same samples per class) fill :math:`Q`.
    :math:`S_c` and :math:`S_b` are divided by the number of neighbour pairs actually used,
    :math:`\sum_{ij} P_{ij}` and :math:`\sum_{ij} Q_{ij}`: this *is* :math:`N k_1` and
    :math:`N k_2` whenever the graphs are complete (so Eq. 4-5 hold exactly), and otherwise
    keeps :math:`S_c, S_b` the mean squared distance to a neighbour, instead of shrinking them
    by the share of samples that lack neighbours. A batch with no pair at all gives 0 (still
    attached to the graph).

    Args:
        k1: same-class neighbours per sample (5 in the paper, 3 for re-id). Default: 5.
        k2: different-class neighbours per sample. Default: 10.
        alpha: weight :math:`\alpha \ge 0` of the separability. Default: 0.1. The paper
            (Eq. 3) takes :math:`\alpha > 0` (0.1 in its experiments); 0 is accepted as the
            compactness-only ablation, which alone is minimised by collapsing the batch.

    Inputs: ``embeddings`` :math:`(N, D)` float, ``labels`` :math:`(N,)` integer tensor on
    the embeddings' device.
    Shape: output is a scalar.

    **pytorch-metric-learning.** The call takes PML's signature, ``loss(embeddings, labels,
    indices_tuple=None, ref_emb=None, ref_labels=None)``, so the loss works inside PML's
    ``MultipleLosses``. :math:`P, Q` are the loss's own mining: a miner's ``indices_tuple`` and
    a reference batch (``ref_emb``, ``ref_labels``, ``CrossBatchMemory``) are refused with
    :class:`~kdml.errors.KdmlError`.

    Example::

        >>> loss = MarginalFisherLoss(k1=1, k2=1, alpha=0.1)
        >>> x = torch.tensor([[0.0], [1.0], [3.0], [5.0]])
        >>> loss.terms(x, torch.tensor([0, 0, 1, 1]))  # S_c = (1 + 1 + 4 + 4)/4, S_b = (9+4+4+16)/4
        (tensor(2.5000), tensor(8.2500))
        >>> loss(x, torch.tensor([0, 0, 1, 1]))
        tensor(1.6750)
    """

    def __init__(self, k1: Count = 5, k2: Count = 10, alpha: Number = 0.1) -> None:
        super().__init__()
        self.k1 = _check_k("k1", k1)
        self.k2 = _check_k("k2", k2)
        given = as_number(alpha, "alpha")  # a 0-d tensor or array: its float
        if not is_finite_number(given, at_least=0):
            raise KdmlError(f"alpha must be a finite number >= 0, got {alpha!r}")
        self.alpha = float(cast(SupportsFloat, given))  # a real number: checked above
        self._checked = False

    def graphs(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """The neighbour graphs :math:`P` (intra-class) and :math:`Q` (inter-class), 0/1
        :math:`(N, N)` matrices built on the detached embeddings."""
        self._check_inputs(embeddings, labels)
        detached = embeddings.detach()
        return self._graphs(squared_distances(detached, detached), labels)

    def terms(self, embeddings: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        r"""The intra-class compactness :math:`S_c` and inter-class separability :math:`S_b`."""
        self._check_inputs(embeddings, labels)
        sq_dists = squared_distances(embeddings, embeddings)
        intra_graph, inter_graph = self._graphs(sq_dists.detach(), labels)
        return _graph_mean(intra_graph, sq_dists), _graph_mean(inter_graph, sq_dists)

    def _graphs(self, sq_dists: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        same_class = labels[:, None] == labels[None, :]
        not_self = ~torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        same_candidates, other_candidates = same_class & not_self, ~same_class
        self._warn_if_clamped(same_candidates.sum(1), other_candidates.sum(1))
        return (nearest_neighbour_graph(sq_dists, same_candidates, self.k1),
                nearest_neighbour_graph(sq_dists, other_candidates, self.k2))

    @full_precision
    def forward(self, embeddings: Tensor, labels: Tensor | None = None,
                indices_tuple: object = None, ref_emb: Tensor | None = None,
                ref_labels: Tensor | None = None) -> Tensor:
        r""":math:`S_c - \alpha S_b` of ``embeddings`` :math:`(N, D)` and ``labels``
        :math:`(N,)`; PML's other arguments must be ``None`` (see the class docstring)."""
        labels = check_pml_call(type(self).__name__, "builds its neighbour pairs from the "
                                "whole batch", labels, indices_tuple, ref_emb, ref_labels)
        compactness, separability = self.terms(embeddings, labels)
        return compactness - self.alpha * separability

    def _check_inputs(self, embeddings: Tensor, labels: Tensor) -> None:
        check_labels(type(self).__name__, labels, [embeddings])
        if embeddings.ndim != 2 or labels.ndim != 1 or len(labels) != len(embeddings):
            raise KdmlError(f"MarginalFisherLoss expects embeddings [N, D] and labels [N], got "
                            f"{tuple(embeddings.shape)} and {tuple(labels.shape)}")
        check_float_inputs(type(self).__name__, [embeddings])

    def _warn_if_clamped(self, num_same: Tensor, num_other: Tensor) -> None:
        # The first batch only: reading the counts makes a GPU wait for them, once per loss
        # rather than every step; a run's batches share one sampler, so the first is typical.
        if self._checked or len(num_same) == 0 or num_same.device.type == "meta":
            return
        self._checked = True
        fewest_same, fewest_other = int(num_same.min()), int(num_other.min())
        # name only the graph that is short, each with what fills it: more samples of each
        # class give same-class neighbours (k1), only more classes give other-class ones (k2)
        short, advice = [], []
        if fewest_same < self.k1:
            short.append(f"{fewest_same} same-class neighbours for k1={self.k1}")
            advice.append(f"For k1: class-balanced batches with at least {self.k1 + 1} samples "
                          f"of each class (data.samples_per_class >= {self.k1 + 1}), or a "
                          "smaller k1.")
        if fewest_other < self.k2:
            needed = _batch_for_k2(len(num_other) - fewest_other, self.k2)
            short.append(f"{fewest_other} other-class neighbours for k2={self.k2}")
            advice.append(f"For k2: more classes per batch, batches of at least {needed} at the "
                          "same samples per class (a larger data.batch_size, "
                          "data.samples_per_class unchanged), or a smaller k2.")
        if short:
            warnings.warn(
                f"MarginalFisherLoss: a batch has samples with only {' and '.join(short)}; "
                f"they use all they have. {' '.join(advice)} Checked on the first batch.",
                stacklevel=3,
            )

    def extra_repr(self) -> str:
        return f"k1={self.k1}, k2={self.k2}, alpha={self.alpha}"


def _batch_for_k2(largest: int, k2: int) -> int:
    """The smallest batch of whole classes of ``largest`` samples each (the batch's largest
    class, where the sample with the fewest other-class neighbours is) that gives every sample
    ``k2`` of another class: ``largest`` times one class more than ``k2 / largest`` rounded up.
    A multiple of the samples per class, as ``data.batch_size`` must be (``largest + k2``,
    e.g. 14 at 4 per class, was refused when set)."""
    return largest * (1 + -(-k2 // largest))


def _graph_mean(graph: Tensor, sq_dists: Tensor) -> Tensor:
    """Mean of ``sq_dists`` over the graph's edges; 0 (attached to the graph) without edges."""
    return (graph * sq_dists).sum() / graph.sum().clamp_min(1.0)
