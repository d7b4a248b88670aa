r"""Maximum mean discrepancy between a source and a target batch (DTML, Eq. 6)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from kdml.checks import check_float_inputs, check_same_device, check_tensor_inputs
from kdml.errors import KdmlError
from kdml.kernels import Kernel
from kdml.precision import full_precision
from kdml.regularizers.jrs import check_kernel, checked_kernel_output


class DomainMMD(nn.Module):
    r"""The domain discrepancy :math:`D_{ts}` of DTML (Hu, Lu & Tan, CVPR 2015, Eq. 6).

    Default (no kernel): the squared distance between the domain means, i.e. the MMD with the
    linear kernel,

    .. math::
        D_{ts} = \left\| \frac{1}{N_t} \sum_{i=1}^{N_t} f(x_{ti})
                 - \frac{1}{N_s} \sum_{i=1}^{N_s} f(x_{si}) \right\|_2^2 .

    With a ``kernel`` from :mod:`kdml.kernels` (e.g. a
    :class:`~kdml.kernels.GaussianMixtureKernel`, the multi-kernel MMD of DAN): the biased
    estimate of the squared MMD (Gretton et al., 2006)

    .. math::
        \widehat{\mathrm{MMD}}^2 = \frac{1}{N_s^2}\sum_{i,j} k(s_i, s_j)
            + \frac{1}{N_t^2}\sum_{i,j} k(t_i, t_j) - \frac{2}{N_s N_t}\sum_{i,j} k(s_i, t_j),

    diagonals included. The kernel is evaluated once on the joint batch :math:`[s; t]` and the
    three blocks are read from that matrix, so a self-adaptive bandwidth is the same for all
    blocks (the mean over all off-diagonal pairs of the joint batch) and the estimate stays a
    squared RKHS norm, hence :math:`\ge 0`. With ``kernel=PolynomialKernel(1, 0)`` (the linear
    kernel) it equals the default.

    An empty source or target batch raises :class:`~kdml.errors.KdmlError`: the mean of no
    sample is undefined, and silently returning 0 would hide a data-loading bug.

    Args:
        kernel: a :class:`~kdml.kernels.Kernel` (or another module called as
            ``kernel(x, y)``, such as PML's ``CosineSimilarity``), or ``None`` for Eq. 6
            (anything else, such as a kernel's name, is refused when built; a module whose
            output is not the :math:`(N_s + N_t, N_s + N_t)` matrix of the joint batch, or no
            tensor, is refused at the call). Default: ``None``.

    Inputs: ``source`` :math:`(N_s, D)`, ``target`` :math:`(N_t, D)`.
    Shape: output is a scalar.

    Example::

        >>> mmd = DomainMMD()
        >>> mmd(torch.tensor([[0.0, 0.0], [2.0, 0.0]]), torch.tensor([[1.0, 3.0]]))
        tensor(9.)
    """

    def __init__(self, kernel: Kernel | nn.Module | None = None) -> None:
        super().__init__()
        # refused here, as JRS refuses one, not by "'str' object is not callable" at a batch
        self.kernel = None if kernel is None else check_kernel("DomainMMD", kernel)

    @full_precision
    def forward(self, source: Tensor, target: Tensor) -> Tensor:
        check_tensor_inputs("DomainMMD", [source, target], "source and target embeddings")
        if source.ndim != 2 or target.ndim != 2 or source.shape[1] != target.shape[1]:
            raise KdmlError(f"DomainMMD expects source [Ns, D] and target [Nt, D] embeddings, "
                            f"got {tuple(source.shape)} and {tuple(target.shape)}")
        check_float_inputs("DomainMMD", [source, target])
        check_same_device("DomainMMD", [source, target], "source and target embeddings")
        if len(source) == 0 or len(target) == 0:
            raise KdmlError(f"DomainMMD needs at least one sample of each domain, got "
                            f"{len(source)} source and {len(target)} target samples")
        if self.kernel is None:
            return (target.mean(dim=0) - source.mean(dim=0)).pow(2).sum()
        num_source = len(source)
        points = torch.cat([source, target])
        # read as three blocks, a kernel-like module's [N, D] output had given a number
        joint = checked_kernel_output("DomainMMD", "the kernel", self.kernel,
                                      self.kernel(points), len(points), len(points),
                                      "the joint [Ns + Nt, D] batch [source; target]")
        source_block = joint[:num_source, :num_source]
        target_block = joint[num_source:, num_source:]
        cross_block = joint[:num_source, num_source:]
        return source_block.mean() + target_block.mean() - 2.0 * cross_block.mean()

    def extra_repr(self) -> str:
        return "kernel=linear (Eq. 6)" if self.kernel is None else ""
