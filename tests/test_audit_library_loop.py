"""kdml's modules in a pytorch-metric-learning (PML) training loop, as a library user drops
them in: PML's similarities as kernels beside kdml's regularizers, kernel-like modules whose
output is no kernel matrix (a PML ``BatchedDistance``, a module returning its input), and the
metrics given meta-device tensors, which hold no values, and the Atlas functions given
complex or bool memberships. Each bad input is one line, never a number computed from the
wrong values."""

from __future__ import annotations

import pytest
import torch
from pytorch_metric_learning.distances import BatchedDistance, CosineSimilarity
from torch import Tensor, nn

from kdml.atlas import ChartOutputs, compressed_code, manifold_distance
from kdml.errors import KdmlError
from kdml.evaluation import retrieval_metrics
from kdml.kernels import GaussianMixtureKernel
from kdml.regularizers import (
    ChartMembershipLoss,
    DomainMMD,
    IntraClassPenalty,
    JointRepresentationSimilarity,
    ManifoldMMD,
)
from kdml.regularizers.sharded import sharded_jrs


def raises_one_line(pattern, call, *args, **kwargs):
    """``call(*args, **kwargs)`` raises a one-line KdmlError matching ``pattern``."""
    with pytest.raises(KdmlError, match=pattern) as error:
        call(*args, **kwargs)
    assert "\n" not in str(error.value)


@pytest.fixture(scope="module")
def batch() -> tuple[Tensor, Tensor]:
    """Twelve [12, 4] embeddings of four classes, three each."""
    return torch.randn(12, 4, generator=torch.Generator().manual_seed(0)), torch.arange(12) % 4


class ReturnsItsInput(nn.Module):
    """Called like a kernel, ``kernel(x, y)``, but returns ``x``: [N, D], not [N, N]."""

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        return x


def test_domain_mmd_refuses_a_kernel_like_module_of_the_wrong_output_shape(batch):
    """DomainMMD read the three blocks of its kernel's output without checking its shape: a
    module returning its [7, 4] input gave MMD = 0.86 from the embeddings' own values (JRS
    and its baselines refused the same module in one line)."""
    embeddings, _ = batch
    source, target = embeddings[:3], embeddings[3:7]
    raises_one_line(r"^DomainMMD: the kernel \(ReturnsItsInput\) returned shape \(7, 4\), not "
                    r"the \[M, M\] = \[7, 7\] kernel matrix of the joint \[Ns \+ Nt, D\] batch "
                    r"\[source; target\]; pass kernels from kdml\.kernels$",
                    DomainMMD(ReturnsItsInput()), source, target)


@pytest.mark.parametrize("regularizer", [
    lambda kernel: JointRepresentationSimilarity([kernel]),
    IntraClassPenalty,
    DomainMMD,
], ids=["JRS", "IntraClassPenalty", "DomainMMD"])
def test_a_kernel_module_that_returns_no_tensor_is_refused_in_one_line(batch, regularizer):
    """PML's BatchedDistance wraps a similarity for large batches and hands each block to its
    iter_fn, returning None: it passed as a kernel (the similarity's is_inverted, a two-input
    forward) and the first batch raised an AttributeError ('NoneType' object has no attribute
    'shape') in JRS, or a TypeError in DomainMMD."""
    embeddings, labels = batch
    kernel = BatchedDistance(CosineSimilarity(), iter_fn=lambda *block: None, batch_size=4)
    module = regularizer(kernel)
    if isinstance(module, DomainMMD):
        call, args = module, (embeddings[:6], embeddings[6:])
    else:
        call, args = module, ([embeddings], labels)
    raises_one_line(r"(kernel 0|the kernel) \(BatchedDistance\) returned a NoneType, not the "
                    r"\[M, M\] = \[12, 12\] kernel matrix of .*; pass kernels from "
                    r"kdml\.kernels$", call, *args)


def test_the_sharded_jrs_refuses_a_kernel_like_module_of_the_wrong_output_shape():
    """The sharded JRS (train.sharded_kernels) multiplied its kernel's rows into the [m, M]
    inter-class mask unchecked: a module returning its [6, 1] input broadcast over the mask
    and gave JRS = -1.33 (a mean of kernel values in (0, 1]) where JRS refuses the module."""
    embeddings = torch.randn(6, 1, generator=torch.Generator().manual_seed(0))
    labels = torch.arange(6) % 3
    raises_one_line(r"^sharded JRS: a kernel \(ReturnsItsInput\) returned shape \(6, 1\), not "
                    r"the \[M, M\] = \[6, 6\] kernel matrix of this rank's \[m, D\] rows against "
                    r"the gathered \[M, D\] batch; pass kernels from kdml\.kernels$",
                    sharded_jrs, [ReturnsItsInput()], [embeddings], labels)


def test_pml_similarities_stay_kernels_of_domain_mmd_and_jrs_with_their_literal_values(batch):
    """The output check takes PML's CosineSimilarity, which DomainMMD's docstring names as a
    kernel: the biased MMD^2 of Gretton et al. and JRS's mean over inter-class pairs, as float64
    literals of the cosine matrix."""
    embeddings, labels = batch
    unit = torch.nn.functional.normalize(embeddings.double(), dim=1)
    cosines = unit @ unit.T
    source, target = slice(0, 5), slice(5, 12)
    expected_mmd = (cosines[source, source].mean() + cosines[target, target].mean()
                    - 2 * cosines[source, target].mean())
    mmd = DomainMMD(CosineSimilarity())(embeddings[source], embeddings[target])
    assert mmd.item() == pytest.approx(expected_mmd.item(), abs=1e-6)
    inter_class = labels[:, None] != labels[None, :]
    expected_jrs = cosines[inter_class].mean()
    jrs = JointRepresentationSimilarity([CosineSimilarity()])([embeddings], labels)
    assert jrs.item() == pytest.approx(expected_jrs.item(), abs=1e-6)


def test_a_kdml_kernel_in_domain_mmd_is_still_taken_with_its_literal_value(batch):
    """kdml's own kernels pass the output check: DomainMMD of a Gaussian kernel is the biased
    MMD^2 of the kernel's own joint matrix."""
    embeddings, _ = batch
    kernel = GaussianMixtureKernel(2, bandwidth=3.0)
    joint = kernel(embeddings.double())
    expected = (joint[:4, :4].mean() + joint[4:, 4:].mean() - 2 * joint[:4, 4:].mean())
    mmd = DomainMMD(kernel)(embeddings[:4], embeddings[4:])
    assert mmd.item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("which", ["embeddings", "labels", "reference", "reference_labels"])
@pytest.mark.parametrize("backend", ["auto", "faiss", "torch"])
def test_the_metrics_refuse_meta_tensors_in_one_line(batch, which, backend):
    """A loop checked on the meta device (shapes only) and scored: the metrics read values,
    which a meta tensor has none of, and torch's "Cannot copy out of meta tensor; no data!" or
    "Tensor.item() cannot be called on meta tensors" came from deep inside the search."""
    embeddings, labels = batch
    inputs = {"embeddings": embeddings[:6], "labels": labels[:6],
              "reference": embeddings[6:], "reference_labels": labels[6:]}
    inputs[which] = inputs[which].to("meta")
    raises_one_line(rf"^{which} is a tensor on the meta device, which holds no values to "
                    r"score; pass it computed on the CPU or a GPU$", retrieval_metrics,
                    ks=(1,), nmi=False, backend=backend, **inputs)


def test_the_metrics_of_cpu_tensors_are_unchanged_by_the_meta_check(batch):
    """The check looks at the device only: CPU tensors are scored as before (each query's
    nearest neighbour, by cosine, computed here as a float64 literal)."""
    embeddings, labels = batch
    unit = torch.nn.functional.normalize(embeddings.double(), dim=1)
    similarities = (unit @ unit.T).fill_diagonal_(-torch.inf)
    recall_at_1 = (labels[similarities.argmax(dim=1)] == labels).double().mean().item()
    metrics = retrieval_metrics(embeddings, labels, ks=(1,), nmi=False)
    assert metrics["recall@1"] == pytest.approx(recall_at_1)


def charts() -> tuple[Tensor, Tensor]:
    """Pre-sigmoid coordinates [4, 3, 2] and one-hot memberships [4, 3] (float)."""
    coords = torch.randn(4, 3, 2, generator=torch.Generator().manual_seed(1))
    return coords, torch.nn.functional.one_hot(torch.tensor([2, 0, 1, 2]), 3).float()


@pytest.mark.parametrize("owner", ["ManifoldMMD", "ChartMembershipLoss", "compressed_code",
                                   "manifold_distance"])
def test_complex_memberships_are_refused_in_one_line(owner):
    """Memberships are probabilities: a complex q made ManifoldMMD's value complex (a loss
    backward refuses), ChartMembershipLoss dropped its imaginary part with torch's warning
    alone, and compressed_code and manifold_distance raised torch's own errors ("argmax():
    does not support complex input", "max_values_cpu" not implemented)."""
    coords, q = charts()
    q = q.to(torch.complex64)
    calls = {
        "ManifoldMMD": lambda: ManifoldMMD(2, 3)(coords, q),
        "ChartMembershipLoss": lambda: ChartMembershipLoss()(q),
        "compressed_code": lambda: compressed_code(ChartOutputs(coords, q)),
        "manifold_distance": lambda: manifold_distance(q, coords, q.real, coords),
    }
    raises_one_line(rf"^{owner} expects real memberships q \(probabilities, or a bool or "
                    r"integer one-hot\), got dtype torch\.complex64$", calls[owner])


def test_compressed_code_takes_a_bool_one_hot_as_manifold_mmd_does():
    """ManifoldMMD, ChartMembershipLoss and manifold_distance take a bool one-hot q as 0 and 1;
    compressed_code raised torch's "argmax(): does not support bool input"."""
    coords, q = charts()
    chart_coords, chart_index = compressed_code(ChartOutputs(coords, q.bool()))
    assert chart_index.tolist() == [2, 0, 1, 2]
    assert torch.equal(chart_coords, coords[torch.arange(4), chart_index])
