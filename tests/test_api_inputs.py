"""The Python API as a pytorch-metric-learning user calls it: misuses a prober found, each now
refused in one line (they had given a matrix "loss", a negative MMD, a raw device error, or
a perfect Recall@1 on random data)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance, SNRDistance

from kdml.errors import KdmlError
from kdml.evaluation.retrieval import retrieval_metrics
from kdml.kernels import GaussianMixtureKernel, PolynomialKernel
from kdml.losses.dtml_objective import DTMLObjective
from kdml.regularizers import (
    DomainMMD,
    IntraClassPenalty,
    JointRepresentationSimilarity,
    ManifoldMMD,
)


@pytest.mark.parametrize("mmd", [GaussianMixtureKernel(1), "gaussian"])
def test_dtml_objective_takes_a_domain_mmd_only(mmd):
    with pytest.raises(KdmlError, match=r"^DTMLObjective: mmd must be a DomainMMD .*wrap a "
                                        r"kernel in DomainMMD$"):
        DTMLObjective(mmd=mmd)
    DTMLObjective(mmd=DomainMMD(GaussianMixtureKernel(1)))  # as documented


@pytest.mark.parametrize("distance", [LpDistance(), SNRDistance()])
def test_a_pml_distance_is_not_taken_for_a_kernel(distance):
    """DomainMMD(LpDistance()) returned a negative "MMD"; JRS of a distance would pull the
    classes together."""
    name = type(distance).__name__
    message = r"is a distance \(larger is farther\), not a kernel"
    with pytest.raises(KdmlError, match=rf"^DomainMMD: {name} {message}"):
        DomainMMD(distance)
    with pytest.raises(KdmlError, match=message):
        JointRepresentationSimilarity([distance])
    DomainMMD(CosineSimilarity())  # a similarity is larger for more alike pairs: taken


def test_domain_mmd_refuses_domains_on_two_devices():
    source, target = torch.randn(4, 3), torch.randn(5, 3, device="meta")
    for kernel in (None, GaussianMixtureKernel(1)):
        with pytest.raises(KdmlError, match=r"^DomainMMD: the source and target embeddings are "
                                            r"on different devices \(cpu, meta\)"):
            DomainMMD(kernel)(source, target)


def test_the_query_set_as_its_own_reference_is_refused():
    """Each query found itself: Recall@1 of 1.0 on random vectors (0.12 leave-one-out)."""
    rng = np.random.default_rng(0)
    embeddings, labels = rng.standard_normal((40, 8)), np.repeat(np.arange(8), 5)
    with pytest.raises(KdmlError, match="^reference is the query set itself"):
        retrieval_metrics(embeddings, labels, reference=embeddings, reference_labels=labels)
    assert retrieval_metrics(embeddings, labels, nmi=False)["recall@1"] < 0.5


@pytest.mark.parametrize(("build", "message"), [
    (lambda: PolynomialKernel(bias=float("inf")), "bias must be a finite number >= 0"),
    (lambda: PolynomialKernel(bias=None), "bias must be a finite number >= 0"),
    (lambda: PolynomialKernel(bias="1"), "bias must be a finite number >= 0"),
    (lambda: GaussianMixtureKernel(9, multiplier=1e300),
     "multiplier=1e+300 to the powers -4 to 4 (the 9 kernels' bandwidths) overflows"),
    (lambda: GaussianMixtureKernel(4, multiplier=1e200), "multiplier=1e+200 makes a bandwidth"),
    (lambda: JointRepresentationSimilarity(GaussianMixtureKernel),
     "takes a sequence of kernels, one per representation"),
    (lambda: IntraClassPenalty(3), "IntraClassPenalty takes a kernel module"),
    (lambda: ManifoldMMD(2, 1, eps="x"), "eps must be a number in (0, 0.5)"),
    (lambda: ManifoldMMD(2, 1, generator=0), "generator must be a torch.Generator"),
])
def test_constructor_settings_are_checked_where_they_are_given(build, message):
    """They had been raw TypeErrors or OverflowErrors, or accepted (an infinite bias gave an
    infinite JRS; a generator of 0 failed at the first call)."""
    with pytest.raises(KdmlError, match=re.escape(message)):
        build()


@pytest.mark.parametrize("regularizer", [
    JointRepresentationSimilarity([GaussianMixtureKernel()]), IntraClassPenalty()])
def test_a_regularizer_given_no_labels_says_where_it_goes(regularizer):
    """As PML's embedding_regularizer= calls it, with the embeddings alone: a TypeError about
    forward()'s missing 'labels' had been all it said."""
    from pytorch_metric_learning.losses import ContrastiveLoss

    loss = ContrastiveLoss(embedding_regularizer=regularizer)
    with pytest.raises(KdmlError, match=r"needs the batch's labels.*add it to the loss "
                                        r"instead"):
        loss(torch.randn(8, 4), torch.arange(4).repeat(2))
