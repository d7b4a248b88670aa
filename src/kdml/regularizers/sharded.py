r"""JRS over a global batch too large for every rank to hold its kernel matrices (the
memory-saving mode of multi-process training, ``train.sharded_kernels=true``).

Each rank computes only its rows of the global :math:`(M, M)` kernel matrices: its :math:`m`
local samples against all :math:`M` gathered ones. The adaptive bandwidths need the mean of
all :math:`M^2 - M` pairwise distances, and JRS the sum over all inter-class pairs; both are
sums over rows, so the ranks all-reduce their partial sums. Memory per rank falls from
:math:`O(M^2)` to :math:`O(mM)`.

The value equals :class:`~kdml.regularizers.JointRepresentationSimilarity` on the gathered
batch. So does the gradient: the joint kernel is symmetric, so the full gradient of the pair
sum with respect to a local row is twice its derivative through the row's own block,
:math:`\partial S / \partial x_i = 2 \sum_j \partial_1 f(x_i, x_j)`, where the other rows
enter as constants; that block's gradient is doubled here, and multiplied by the world size as
in :func:`kdml.distributed.gather`, for DistributedDataParallel's average.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from kdml import distributed
from kdml.errors import KdmlError
from kdml.kernels import (
    GaussianMixtureKernel,
    Kernel,
    LaplaceKernel,
    l1_distances,
    resolution_floor,
    squared_distances,
)
from kdml.precision import full_precision
from kdml.regularizers.jrs import check_batch, check_kernel, checked_kernel_output


def _row_block(kernel: Kernel, rows: Tensor, columns: Tensor, num_points: int) -> Tensor:
    """Kernel rows ``[m, M]``; adaptive bandwidths from the all-reduced distance sums."""
    if not isinstance(kernel, GaussianMixtureKernel | LaplaceKernel) or (
            kernel.bandwidth is not None):
        # a kernel-like module's [m, D] output had broadcast against the [m, M] class mask
        return checked_kernel_output("sharded JRS", "a kernel", kernel, kernel(rows, columns),
                                     len(rows), len(columns),
                                     "this rank's [m, D] rows against the gathered [M, D] batch")
    if isinstance(kernel, GaussianMixtureKernel):
        distances = squared_distances(rows, columns)
    else:
        distances = l1_distances(rows, columns)
    total = distributed.all_reduce_sum(distances.detach().sum())
    # the columns are the whole gathered batch: the floor JRS takes of it
    floor = resolution_floor(columns, 1 if isinstance(kernel, LaplaceKernel) else 2)
    tau = torch.maximum(total / max(num_points * num_points - num_points, 1), floor)
    if isinstance(kernel, LaplaceKernel):
        return torch.exp(distances * (-1.0 / tau))
    return torch.stack([torch.exp(distances * (-1.0 / (tau * s)))
                        for s in kernel.scales]).mean(dim=0)


@full_precision
def sharded_jrs(kernels: Sequence[Kernel], local_representations: Sequence[Tensor],
                local_labels: Tensor) -> Tensor:
    """JRS of the global batch from this rank's rows (see the module docstring).

    Args:
        kernels: one kernel per representation (as for JRS).
        local_representations: this rank's :math:`(m, D_l)` representations.
        local_labels: this rank's :math:`(m,)` labels.

    Returns:
        The global JRS value on every rank, with this rank's share of the gradient.
    """
    if isinstance(kernels, type | str) or not isinstance(kernels, Iterable) or (
            isinstance(kernels, torch.nn.Module) and not isinstance(kernels, torch.nn.ModuleList)):
        raise KdmlError("sharded JRS takes a sequence of kernels, one per representation, e.g. "
                        "[GaussianMixtureKernel()]")
    # a list, as JointRepresentationSimilarity makes one: a generator had been used up by the
    # check below and then failed len() ("object of type 'generator' has no len()")
    kernels = list(kernels)
    for kernel in kernels:  # as JointRepresentationSimilarity's: a name or a class is none
        check_kernel("sharded JRS", kernel)
    check_batch("sharded JRS", local_representations, local_labels)
    if len(kernels) != len(local_representations):
        raise KdmlError(f"sharded JRS got {len(local_representations)} representations for "
                        f"{len(kernels)} kernels")
    labels = distributed.gather(local_labels)
    num_points = len(labels)
    blocks = [_row_block(kernel, rows, distributed.gather(rows.detach()), num_points)
              for kernel, rows in zip(kernels, local_representations, strict=True)]
    joint = blocks[0]
    for block in blocks[1:]:
        joint = joint * block
    inter_class = local_labels[:, None] != labels[None, :]
    partial = torch.where(inter_class, joint, 0.0).sum()
    # the global count from each rank's rows: comparing the gathered labels with themselves
    # would make the one [M, M] matrix this mode exists to avoid
    num_pairs = distributed.all_reduce_sum(inter_class.sum()).clamp_min(1)
    total = distributed.all_reduce_sum(partial.detach())
    scale = 2.0 * distributed.world().size
    return (total + scale * (partial - partial.detach())) / num_pairs
