"""The Python API as a pytorch-metric-learning (PML) user calls it (helper au95a's audit): a
setting given as a 0-d NumPy array, faiss's ``search(x, k)`` call order, and the exact 0 of a
batch without the pairs a regularizer needs."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdml.errors import KdmlError
from kdml.evaluation import knn_search
from kdml.kernels import GaussianMixtureKernel
from kdml.losses import am_softmax_loss
from kdml.regularizers import IntraClassPenalty, JointIntra, JointMMD


def raises_one_line(pattern: str, call, *args, **kwargs) -> None:
    """``call(*args, **kwargs)`` raises a one-line KdmlError matching ``pattern``."""
    with pytest.raises(KdmlError, match=pattern) as error:
        call(*args, **kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("scale", "margin"), [(np.array(20.0), 0.1), (20.0, np.array(0.1))])
def test_am_softmax_takes_a_0d_numpy_setting_as_nt_xent_does(scale, margin):
    """A 0-d NumPy scale or margin (a value read from a NumPy config) had been refused as
    "needs a scale that is a finite number > 0, got array(20.)", which it is; nt_xent_loss's
    temperature and the kernels' settings read one as its number."""
    cosines = torch.tensor([[0.5, 0.3], [0.1, 0.4]])
    labels = torch.tensor([0, 1])
    expected = am_softmax_loss(cosines, labels, 20.0, 0.1)
    assert torch.equal(am_softmax_loss(cosines, labels, scale, margin), expected)


def test_am_softmax_still_refuses_a_numpy_setting_that_is_no_finite_number():
    cosines, labels = torch.tensor([[0.5, 0.3]]), torch.tensor([0])
    raises_one_line("scale that is a finite number > 0", am_softmax_loss, cosines, labels,
                    np.array(-1.0), 0.1)
    raises_one_line("margin that is a finite number >= 0", am_softmax_loss, cosines, labels,
                    20.0, np.array([0.1, 0.2]))


@pytest.mark.parametrize("count", [5, 5.0, np.int64(5)])
def test_knn_search_names_k_when_the_reference_is_a_number(count):
    """``knn_search(x, 5)``, faiss's ``index.search(x, k)`` order, passed 5 as the reference
    set: it had been refused as "reference must have a floating dtype, got int64" (or "must be
    2-D" for 5.0), naming neither k nor the call to make."""
    queries = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    raises_one_line(r"reference must be \(Nr, D\) embeddings, got the number 5.*k=5",
                    knn_search, queries, count)


def test_knn_search_with_k_as_a_keyword_is_unchanged():
    queries = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    (chunk,) = knn_search(queries, k=2, exclude_self=True)
    assert chunk.indices.shape == (8, 2)


@pytest.mark.parametrize(("regularizer", "labels"), [
    (JointMMD([GaussianMixtureKernel()]), torch.zeros(6, dtype=torch.long)),  # one class
    (JointIntra([GaussianMixtureKernel()]), torch.zeros(6, dtype=torch.long)),
    (IntraClassPenalty(), torch.arange(6)),  # no two samples of a class
], ids=["jmmd", "jintra", "intra_class_penalty"])
def test_a_regularizer_without_its_pairs_is_zero_not_minus_zero(regularizer, labels):
    """A batch without the pairs a regularizer needs gives an exact 0; JointMMD, JointIntra
    and IntraClassPenalty negate their sums, and had printed it as tensor(-0.) (a PML loop's
    all-distinct first batch, one class), as ChartMembershipLoss's one chart had been -0."""
    embeddings = torch.randn(6, 4, generator=torch.Generator().manual_seed(0),
                             requires_grad=True)
    value = regularizer([embeddings], labels)
    assert value.item() == 0.0 and not torch.signbit(value)
    assert f"{value.item()}" == "0.0"
    value.backward()  # still attached to the graph
    assert embeddings.grad is not None and torch.equal(embeddings.grad,
                                                       torch.zeros_like(embeddings))
