r"""Kernel-embedding regularizers of JRD (Chu et al., ICML 2020) and its baselines.

All four are :class:`torch.nn.Module` s called as ``reg(representations, labels)`` and return a
scalar to be *added* to the loss (times a weight :math:`\alpha`):

- :class:`JointRepresentationSimilarity`: the JRS regularizer (Eq. 10 / 11), the mean joint
  kernel over inter-class sample pairs; minimising it diversifies the classes.
- :class:`JointMMD` (Eq. 15) and :class:`JointIntra` (Eq. 16): the norm-based baselines of
  Fig. 5 / Table 3.
- :class:`IntraClassPenalty`: the explicit intra-class penalty of Eq. 4 (Fig. 2).

``representations`` is a sequence of :math:`L` tensors of shape :math:`(M, D_l)`, the same
batch seen at :math:`L` layers, with one kernel per layer given at construction. The joint
kernel of two samples is the product of the layer kernels,
:math:`K_{ij} = \prod_l k^l(x_i^l, x_j^l)`, the inner product of their tensor-product feature
maps :math:`\otimes_l k^l(\cdot, x^l)`. JRD uses [pooling, embedding, class level]; MRD is
[embedding]; JRD-C is [pooling, embedding]; JRD-Pooling is [embedding, class level].

Everything is vectorised over samples and classes (only the layers are looped over). The
regularizers work next to any metric-learning loss, e.g. from pytorch-metric-learning (PML).
They compare the batch's classes over all its pairs of samples, so what a PML loop passes its
losses besides the batch, a miner's ``indices_tuple`` and a reference batch (``ref_emb``,
``ref_labels``), is refused in one line: the miner's tuple goes to the PML loss beside them.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from kdml.checks import check_labels, check_pml_extras
from kdml.errors import KdmlError
from kdml.kernels import GaussianMixtureKernel, Kernel
from kdml.precision import full_precision

__all__ = ["IntraClassPenalty", "JointIntra", "JointMMD", "JointRepresentationSimilarity"]


def required_labels(owner: str, labels: Tensor | None) -> Tensor:
    """``labels``, or a one-line error where they are missing: pytorch-metric-learning calls
    an ``embedding_regularizer=`` with the embeddings alone, which had been a TypeError."""
    if labels is None:
        raise KdmlError(
            f"{owner} needs the batch's labels, as {owner}(...)([embeddings], labels); "
            "pytorch-metric-learning's embedding_regularizer= passes the embeddings alone, so "
            "add it to the loss instead: loss = metric_loss + alpha * regularizer([embeddings], "
            "labels)"
        )
    return labels


def check_batch(owner: str, representations: Sequence[Tensor], labels: Tensor) -> None:
    """Refuse, in one line naming ``owner``, a batch that is not a sequence of float [M, D_l]
    representations with integer [M] labels on their device (JRS, its baselines, the sharded
    JRS and the DTML objective). Shapes, dtypes and devices only: no host sync."""
    if isinstance(representations, Tensor):
        raise KdmlError(
            f"{owner} takes a sequence of representations (one tensor per layer), e.g. "
            "[embeddings], not a bare tensor"
        )
    if not isinstance(representations, Sequence):  # a generator has no len() and runs out
        raise KdmlError(
            f"{owner} takes a sequence of representations (one tensor per layer), e.g. "
            f"[embeddings], got {type(representations).__name__}; pass a list"
        )
    if len(representations) == 0:
        raise KdmlError(f"{owner} needs at least one representation")
    check_labels(owner, labels, representations, "representations", "representations[0]")
    if not all(rep.is_floating_point() for rep in representations):
        raise KdmlError(f"{owner}: representations must be floating point, got "
                        f"{[rep.dtype for rep in representations]}")
    if labels.ndim != 1:
        raise KdmlError(f"{owner}: labels must be 1-D [M], got shape {tuple(labels.shape)}")
    for layer, rep in enumerate(representations):
        if rep.ndim != 2 or rep.shape[0] != labels.shape[0]:
            raise KdmlError(
                f"{owner}: representation {layer} must be [M, D] with M = {labels.shape[0]} "
                f"(the number of labels), got shape {tuple(rep.shape)}"
            )


def check_kernel(owner: str, kernel: object) -> nn.Module:
    """``kernel`` if it can be a kernel: a :class:`~kdml.kernels.Kernel`, or another
    ``nn.Module`` whose ``forward`` takes ``(x)`` and ``(x, y)`` as kernels do. A module of
    one input (``nn.Identity``, ``nn.Linear``) or of two (``nn.Bilinear``) is refused here, at
    construction, rather than by a shape error at the first batch; one that passes and still
    returns no :math:`(M, M)` matrix is refused at the call (:func:`kernel_matrix`). A module
    with no ``forward`` of its own (``nn.ModuleList``, ``nn.ModuleDict``), whose unimplemented
    ``forward(*input)`` takes any call, is refused here too (it failed at the first batch)."""
    if isinstance(kernel, Kernel):
        return kernel
    if getattr(kernel, "is_inverted", None) is False:  # pytorch-metric-learning's LpDistance
        raise KdmlError(f"{owner}: {type(kernel).__name__} is a distance (larger is farther), "
                        "not a kernel (larger is more alike): a regularizer of it would pull "
                        "what it should push apart; use a kernel of kdml.kernels")
    # a container (nn.ModuleList of kernels) has nn.Module's unimplemented forward(*input);
    # read on the instance, where torch.compile's wrapper puts its forward
    if isinstance(kernel, nn.Module) and getattr(kernel.forward, "__func__", None) is not (
            nn.Module.forward):
        try:
            signature = inspect.signature(kernel.forward)
            signature.bind(None)
            signature.bind(None, None)
        except (TypeError, ValueError):  # ValueError: no signature to read
            pass
        else:
            return kernel
    raise KdmlError(f"{owner}: kernels must be kernel modules called as kernel(x, y) "
                    f"(see kdml.kernels), got {type(kernel).__name__}")


def check_no_miner(owner: str, reason: str, indices_tuple: object, ref_emb: object,
                   ref_labels: object) -> None:
    """Refuse, in one line naming ``owner``, what a pytorch-metric-learning loop passes its
    losses besides the batch: a miner's ``indices_tuple`` (its pairs or triplets) and a
    reference batch (``ref_emb``, ``ref_labels``, from ``CrossBatchMemory``). The regularizers
    compare the batch's classes over every pair of samples (``reason`` says which), so a
    miner's subset of pairs has no place in them; the miner feeds the PML loss beside them."""
    check_pml_extras(owner, reason, "give the miner's tuple to the PML loss beside it and call "
                     "this as reg([embeddings], labels)", indices_tuple, ref_emb, ref_labels)


def kernel_matrix(owner: str, layer: int, kernel: nn.Module, representation: Tensor) -> Tensor:
    """The :math:`(M, M)` matrix ``kernel(representation)`` of an :math:`(M, D)`
    representation; any other shape or a value that is no tensor (a module that is not a
    kernel) is refused in one line (:func:`checked_kernel_output`). Shapes only: no host
    sync."""
    return checked_kernel_output(owner, f"kernel {layer}", kernel, kernel(representation),
                                 representation.shape[0], representation.shape[0],
                                 "its [M, D] representation")


def checked_kernel_output(owner: str, which: str, kernel: nn.Module, matrix: object, rows: int,
                          columns: int, of: str) -> Tensor:
    """``matrix``, what ``kernel`` (called ``which``, e.g. "kernel 0") returned for ``of`` (the
    points it was given), if it is the :math:`(rows, columns)` kernel matrix; anything else is
    refused in one line naming ``owner``. A kernel-like module of another output had given a
    torch error (its [M, D] input), an AttributeError (PML's ``BatchedDistance``, whose
    ``forward`` returns None) or, read as blocks of a matrix (DomainMMD, the sharded JRS), a
    number computed from the wrong values. Shapes only: no host sync."""
    if not isinstance(matrix, Tensor) or matrix.shape != (rows, columns):
        got = (f"shape {tuple(matrix.shape)}" if isinstance(matrix, Tensor)
               else f"a {type(matrix).__name__}")
        shape = "[M, M]" if rows == columns else "[m, M]"
        raise KdmlError(f"{owner}: {which} ({type(kernel).__name__}) returned {got}, not the "
                        f"{shape} = [{rows}, {columns}] kernel matrix of {of}; pass kernels "
                        "from kdml.kernels")
    return matrix


class _ClassSums(NamedTuple):
    """Sums over the classes present in a batch (see :func:`_class_sums`)."""

    products: Tensor  # sum over all ordered class pairs (I, J), I = J included, of S_IJ
    norms: Tensor  # sum over the classes of S_II = ||C(P_I)||^2
    classes: Tensor  # C, the number of classes present (a float tensor holding an integer)


def _class_sums(joint: Tensor, labels: Tensor) -> _ClassSums:
    r"""With :math:`S_{IJ} = \langle C(P_I), C(P_J) \rangle = \frac{1}{n_I n_J}
    \sum_{i \in I, j \in J} K_{ij}` (V-statistic, :math:`i = j` included), the sums
    :math:`\sum_{I, J} S_{IJ} = w^\top K w`, :math:`\sum_I S_{II} = w^\top (K \circ
    [y_i = y_j]) w` and :math:`C = \sum_i w_i`, with :math:`w_i = 1 / n_{y_i}`.

    Written through per-sample weights rather than by listing the classes (``torch.unique``),
    which would make a GPU step wait for the host."""
    same_class = labels[:, None] == labels[None, :]
    weights = 1.0 / same_class.sum(dim=1).to(joint.dtype)  # 1 / n_{y_i}
    weighted = joint * (weights[:, None] * weights[None, :])
    return _ClassSums(weighted.sum(), torch.where(same_class, weighted, 0.0).sum(),
                      weights.sum().round())


def _negated(value: Tensor) -> Tensor:
    """``-value``, written ``0 - value`` so that the exact 0 of a batch without the pairs a
    regularizer needs is 0, not the -0.0 it had printed (``tensor(-0.)``), as
    ChartMembershipLoss's one chart is."""
    return 0.0 - value


def _mean_over_class_pairs(total: Tensor, classes: Tensor) -> Tensor:
    """``total`` over the C (C - 1) ordered pairs of different classes; 0 when C < 2."""
    return total / (classes * (classes - 1)).clamp_min(1)


class _JointKernelRegularizer(nn.Module):
    """Holds one kernel per representation and computes the joint (product) kernel matrix."""

    def __init__(self, kernels: Sequence[Kernel | nn.Module]) -> None:
        super().__init__()
        # a kernel, or its class (GaussianMixtureKernel without the brackets), had failed in
        # list() with "'type' object is not iterable"; an nn.ModuleList of kernels (another
        # regularizer's .kernels) is a sequence of them, as sharded_jrs takes it
        if (isinstance(kernels, type) or not isinstance(kernels, Iterable)
                or (isinstance(kernels, nn.Module) and not isinstance(kernels, nn.ModuleList))):
            raise KdmlError(
                f"{type(self).__name__} takes a sequence of kernels, one per representation, "
                "e.g. [GaussianMixtureKernel()]"
            )
        kernels = list(kernels)
        if not kernels:
            raise KdmlError(f"{type(self).__name__} needs at least one kernel")
        self.kernels = nn.ModuleList(check_kernel(type(self).__name__, kernel)
                                     for kernel in kernels)

    def joint_kernel(self, representations: Sequence[Tensor], labels: Tensor) -> Tensor:
        r""":math:`(M, M)` matrix :math:`K_{ij} = \prod_l k^l(x_i^l, x_j^l)`."""
        owner = type(self).__name__
        check_batch(owner, representations, labels)
        if len(representations) != len(self.kernels):
            raise KdmlError(
                f"{owner} was built with {len(self.kernels)} kernel(s) but got "
                f"{len(representations)} representation(s); pass one kernel per representation"
            )
        matrices = [kernel_matrix(owner, layer, kernel, rep) for layer, (kernel, rep)
                    in enumerate(zip(self.kernels, representations, strict=True))]
        joint: Tensor = matrices[0]
        for matrix in matrices[1:]:
            joint = joint * matrix
        return joint


class JointRepresentationSimilarity(_JointKernelRegularizer):
    r"""Joint representation similarity (JRS) regularizer of JRD (Chu et al., *Distance
    Metric Learning with Joint Representation Diversification*, ICML 2020): Eq. 10 divided by
    :math:`N_{pairs}` as in Eq. 11.

    The empirical joint representation similarity of two classes (Eq. 8) is the inner product
    of their joint kernel embeddings,
    :math:`\hat S(P, Q) = \frac{1}{n n'} \sum_{i, j} \prod_{l=1}^L k^l(x_i^l, x_j'^l)`. JRS sums
    it over ordered class pairs weighted by :math:`n^I n^J` (Eq. 10), and JRD divides by the
    number of inter-class sample pairs (Eq. 11):

    .. math::
        \frac{\mathcal{L}_{JRS}}{N_{pairs}} = \frac{1}{N_{pairs}} \sum_{I \neq J}
        \sum_{i \in I} \sum_{j \in J} \prod_{l=1}^L k^l(x_i^l, x_j^l),

    where :math:`N_{pairs}` is the number of ordered pairs :math:`(i, j)` with
    :math:`y_i \neq y_j`. So the value is the mean joint kernel over inter-class sample pairs;
    the JRD objective is ``ams_loss + alpha * jrs(representations, labels)``. A batch with
    fewer than two classes gives 0 (still attached to the graph).

    Args:
        kernels: one kernel per representation, e.g. ``[GaussianMixtureKernel(3),
            GaussianMixtureKernel(3), GaussianMixtureKernel(1)]`` for JRD's [pooling,
            embedding, class level]: kdml's kernels, or other modules called as
            ``kernel(x, y)`` (:func:`check_kernel`).

    Inputs:
        - representations: sequence of :math:`L` tensors, the :math:`l`-th of shape
          :math:`(M, D_l)`.
        - labels: :math:`(M,)` class labels.

    Shape:
        - Output: scalar.

    Example::

        >>> import torch
        >>> from pytorch_metric_learning.losses import TripletMarginLoss
        >>> from kdml.kernels import GaussianMixtureKernel
        >>> from kdml.regularizers import JointRepresentationSimilarity
        >>> _ = torch.manual_seed(0)
        >>> emb = torch.randn(12, 8, requires_grad=True)
        >>> y = torch.arange(4).repeat_interleave(3)
        >>> triplet = TripletMarginLoss(margin=0.2)
        >>> jrs = JointRepresentationSimilarity([GaussianMixtureKernel()])
        >>> alpha = 1.0
        >>> loss = triplet(emb, y) + alpha * jrs([emb], y)
        >>> loss.backward()
        >>> emb.grad.shape
        torch.Size([12, 8])

        JRD proper regularizes three layers jointly:

        >>> jrd = JointRepresentationSimilarity(
        ...     [GaussianMixtureKernel(3), GaussianMixtureKernel(3), GaussianMixtureKernel(1)])
        >>> pooled, cls = torch.randn(12, 32), torch.randn(12, 5)
        >>> jrd([pooled, emb, cls], y).shape
        torch.Size([])
    """

    @full_precision
    def forward(self, representations: Sequence[Tensor], labels: Tensor | None = None,
                indices_tuple: object = None, ref_emb: object = None,
                ref_labels: object = None) -> Tensor:
        labels = required_labels(type(self).__name__, labels)
        check_no_miner(type(self).__name__, "averages the joint kernel over every inter-class "
                       "pair of the batch", indices_tuple, ref_emb, ref_labels)
        joint = self.joint_kernel(representations, labels)
        inter_class = labels[:, None] != labels[None, :]
        # With < 2 classes the mask is empty: the masked sum is an exact 0 that keeps the graph.
        num_pairs = inter_class.sum().clamp_min(1)
        return torch.where(inter_class, joint, 0.0).sum() / num_pairs


class JointMMD(_JointKernelRegularizer):
    r"""Joint MMD regularizer, the norm-based baseline of JRD (Chu et al., *Distance
    Metric Learning with Joint Representation Diversification*, ICML 2020), Eq. 15: the JMMD of
    Long et al. (2017) between classes.

    With the empirical joint embedding of class :math:`I`,
    :math:`C_I = \frac{1}{n_I} \sum_{i \in I} \otimes_l k^l(\cdot, x_i^l)`, so that
    :math:`\|C_I\|^2 = \frac{1}{n_I^2} \sum_{i, i' \in I} K_{ii'}` (V-statistic, diagonal
    included) and :math:`\langle C_I, C_J \rangle = \frac{1}{n_I n_J}
    \sum_{i \in I, j \in J} K_{ij}`, the value is

    .. math::
        \frac{1}{C (C - 1)} \sum_{I \neq J} -\|C_I - C_J\|^2
        = \frac{1}{C (C - 1)} \sum_{I \neq J}
          -\left(\|C_I\|^2 + \|C_J\|^2 - 2 \langle C_I, C_J \rangle\right)

    over the :math:`C` classes present in the batch. Adding it to the loss maximises the joint
    MMD between classes, which also maximises the within-class norms :math:`\|C_I\|^2`
    (explicit intra-class compactness).

    Normalisation (the paper is vague here): Eq. 15 prints :math:`-\|C(P), C(Q)\|` for one
    pair of classes and does not say how pairs are combined; we read it as the squared MMD
    (Eq. 14, and the JMMD of Long et al.) and take the unweighted mean over ordered class pairs
    of the batch. The inner-product part then has the same scale as
    :class:`JointRepresentationSimilarity` (which weights class pairs by :math:`n_I n_J`): for
    a balanced batch, ``JointMMD = JointIntra + 2 * JointRepresentationSimilarity`` exactly. A
    batch with fewer than two classes gives 0.

    Args:
        kernels: one kernel per representation.

    Inputs:
        - representations: sequence of :math:`L` tensors of shape :math:`(M, D_l)`.
        - labels: :math:`(M,)` class labels.

    Shape:
        - Output: scalar.

    Example::

        >>> from kdml.kernels import GaussianMixtureKernel
        >>> jmmd = JointMMD([GaussianMixtureKernel()])
        >>> emb, y = torch.randn(12, 8), torch.arange(4).repeat_interleave(3)
        >>> bool(jmmd([emb], y) <= 0)
        True
    """

    @full_precision
    def forward(self, representations: Sequence[Tensor], labels: Tensor | None = None,
                indices_tuple: object = None, ref_emb: object = None,
                ref_labels: object = None) -> Tensor:
        labels = required_labels(type(self).__name__, labels)
        check_no_miner(type(self).__name__, "compares the kernel embeddings of the batch's "
                       "classes, each over all its samples", indices_tuple, ref_emb, ref_labels)
        sums = _class_sums(self.joint_kernel(representations, labels), labels)
        # sum over I != J of ||C_I||^2 + ||C_J||^2 - 2 <C_I, C_J>
        total = 2.0 * (sums.classes - 1) * sums.norms - 2.0 * (sums.products - sums.norms)
        return _negated(_mean_over_class_pairs(total, sums.classes))


class JointIntra(_JointKernelRegularizer):
    r"""Joint intra-class regularizer, the norm-only baseline of JRD (Chu et al.,
    *Distance Metric Learning with Joint Representation Diversification*, ICML 2020), Eq. 16.

    With the class embeddings :math:`C_I` and norms
    :math:`\|C_I\|^2 = \frac{1}{n_I^2} \sum_{i, i' \in I} K_{ii'}` of :class:`JointMMD`,

    .. math::
        \frac{1}{C (C - 1)} \sum_{I \neq J} -\left(\|C_I\|^2 + \|C_J\|^2\right)
        = -\frac{2}{C} \sum_I \|C_I\|^2

    over the :math:`C` classes of the batch: only the norms, i.e. an explicit intra-class
    compactness term. Eq. 16 prints unsquared norms; we use squared ones, consistent with
    :class:`JointMMD` (``JointMMD = JointIntra + 2 * JointRepresentationSimilarity`` on a
    balanced batch) and with the paper's Sec. 4.3.2. Normalised as :class:`JointMMD` (mean
    over ordered class pairs). A batch with fewer than two classes gives 0.

    Args:
        kernels: one kernel per representation.

    Inputs:
        - representations: sequence of :math:`L` tensors of shape :math:`(M, D_l)`.
        - labels: :math:`(M,)` class labels.

    Shape:
        - Output: scalar.

    Example::

        >>> from kdml.kernels import GaussianMixtureKernel
        >>> jintra = JointIntra([GaussianMixtureKernel()])
        >>> emb, y = torch.randn(12, 8), torch.arange(4).repeat_interleave(3)
        >>> bool(jintra([emb], y) < 0)
        True
    """

    @full_precision
    def forward(self, representations: Sequence[Tensor], labels: Tensor | None = None,
                indices_tuple: object = None, ref_emb: object = None,
                ref_labels: object = None) -> Tensor:
        labels = required_labels(type(self).__name__, labels)
        check_no_miner(type(self).__name__, "uses the kernel embeddings of the batch's "
                       "classes, each over all its samples", indices_tuple, ref_emb, ref_labels)
        sums = _class_sums(self.joint_kernel(representations, labels), labels)
        # sum over I != J of ||C_I||^2 + ||C_J||^2
        return _negated(_mean_over_class_pairs(2.0 * (sums.classes - 1) * sums.norms,
                                               sums.classes))


class IntraClassPenalty(nn.Module):
    r"""Explicit intra-class penalty of JRD (Chu et al., *Distance Metric Learning with
    Joint Representation Diversification*, ICML 2020), Eq. 4 (the study of Fig. 2).

    .. math::
        -\sum_I \frac{1}{N^I_{pairs}} \sum_{i \neq j \in I} k(x_i, x_j),
        \qquad k(x, x') = \exp\left(-\tfrac12 \|x - x'\|^2\right) \text{ by default},

    on one representation (the embedding). :math:`N^I_{pairs} = n_I (n_I - 1)` counts the
    *ordered* pairs of different samples of class :math:`I`, so each class contributes the mean
    kernel over its distinct pairs (the same value as with unordered pairs, the kernel being
    symmetric); classes with one sample contribute 0. As in Eq. 4 the classes are summed, not
    averaged. Eq. 4 reads ``ams_loss - alpha * sum(...)``, so the loss is
    ``ams_loss + alpha * penalty(representations, labels)``: minimising it pulls same-class
    points together.

    Args:
        kernels: ``None`` for :math:`\exp(-\frac12 \|x - x'\|^2)`
            (``GaussianMixtureKernel(1, bandwidth=2.0)``), or one kernel (alone or in a
            one-element sequence).

    Inputs:
        - representations: sequence of tensors of shape :math:`(M, D_l)`; only the last one is
          used (pass ``[embeddings]``).
        - labels: :math:`(M,)` class labels.

    Shape:
        - Output: scalar.

    Example::

        >>> penalty = IntraClassPenalty()
        >>> emb, y = torch.randn(12, 8), torch.arange(4).repeat_interleave(3)
        >>> bool(penalty([emb], y) < 0)
        True
    """

    def __init__(self, kernels: Kernel | nn.Module | Sequence[Kernel | nn.Module] | None = None
                 ) -> None:
        super().__init__()
        if kernels is None:
            kernel: nn.Module = GaussianMixtureKernel(num_kernels=1, bandwidth=2.0)
        elif isinstance(kernels, nn.Module) and not isinstance(kernels, nn.ModuleList):
            kernel = kernels
        elif isinstance(kernels, str):
            raise KdmlError(f"IntraClassPenalty takes a kernel module, not the name {kernels!r}; "
                            f"e.g. kdml.kernels.build_kernel({kernels!r})")
        elif isinstance(kernels, type) or not isinstance(kernels, Iterable):
            raise KdmlError(f"IntraClassPenalty takes a kernel module, e.g. "
                            f"GaussianMixtureKernel(1), got {kernels!r}")
        else:
            kernels = list(kernels)
            if len(kernels) != 1:
                raise KdmlError(
                    f"IntraClassPenalty works on one representation and takes one kernel, "
                    f"got {len(kernels)}"
                )
            kernel = kernels[0]
        self.kernel = check_kernel(type(self).__name__, kernel)

    @full_precision
    def forward(self, representations: Sequence[Tensor], labels: Tensor | None = None,
                indices_tuple: object = None, ref_emb: object = None,
                ref_labels: object = None) -> Tensor:
        labels = required_labels(type(self).__name__, labels)
        owner = type(self).__name__
        check_no_miner(owner, "averages the kernel over every same-class pair of the batch",
                       indices_tuple, ref_emb, ref_labels)
        check_batch(owner, representations, labels)
        gram = kernel_matrix(owner, 0, self.kernel, representations[-1])
        same_class = labels[:, None] == labels[None, :]
        counts = same_class.sum(dim=1)  # n_{y_i}
        same_class.fill_diagonal_(False)
        per_sample = torch.where(same_class, gram, 0.0).sum(dim=1)  # [M]
        # Each sample's share of its class's mean, without listing the classes (a host sync
        # on a GPU); singleton classes: 0 / 1 = 0.
        return _negated((per_sample / (counts * (counts - 1)).clamp_min(1)).sum())
