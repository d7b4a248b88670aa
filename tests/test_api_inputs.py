"""The Python API as a pytorch-metric-learning user calls it: misuses a prober found, each now
refused in one line (they had given a matrix "loss", a negative MMD, a raw device error, or
a perfect Recall@1 on random data)."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest
import torch
from pytorch_metric_learning.distances import CosineSimilarity, LpDistance, SNRDistance
from torch import nn

from kdml.checks import as_number
from kdml.errors import KdmlError
from kdml.evaluation.retrieval import retrieval_metrics
from kdml.kernels import (
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    LaplaceKernel,
    PolynomialKernel,
    adaptive_bandwidth,
    l1_distances,
    squared_distances,
)
from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.dtml_objective import DTMLObjective
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.losses.nt_xent import nt_xent_loss
from kdml.losses.pairwise_logistic import PairwiseLogisticLoss, pairwise_logistic_loss
from kdml.models.atlas_heads import AtlasHead
from kdml.models.dtml import DTMLNetwork
from kdml.regularizers import (
    DomainMMD,
    IntraClassPenalty,
    JointRepresentationSimilarity,
    ManifoldMMD,
)
from kdml.training.domain_adapted import DomainAdaptedMethod


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


@pytest.mark.parametrize(("call", "message"), [
    (lambda: squared_distances(torch.arange(6).view(3, 2), torch.arange(4).view(2, 2)),
     "squared_distances expects floating point points, got torch.int64"),
    (lambda: squared_distances(torch.randn(3), torch.randn(3)),
     "squared_distances expects 2-D points [M, D] and [N, D], got (3,) and (3,)"),
    (lambda: l1_distances(torch.randn(3, 2), torch.randn(4, 5)),
     "l1_distances expects 2-D points [M, D] and [N, D], got (3, 2) and (4, 5)"),
    (lambda: adaptive_bandwidth(torch.ones(3, 3, dtype=torch.long)),
     "adaptive_bandwidth expects floating point distances, got torch.int64"),
    (lambda: DTMLNetwork(4), "DTMLNetwork needs at least two positive layer sizes "
                             "[input, ..., top], got 4"),
    (lambda: DTMLNetwork([4, 2])(torch.ones(3, 4, dtype=torch.long)),
     "DTMLNetwork expects floating point features, got torch.int64"),
    (lambda: DTMLNetwork([4, 2])(torch.ones(4)),
     "DTMLNetwork expects a batch [N, 4], got (4,); a single sample is x[None]"),
    (lambda: AtlasHead(8, dim=2, n_charts=3)(torch.randn(4, 7)),
     "AtlasHead expects features [B, 8], got (4, 7)"),
    (lambda: AtlasHead(8, dim=2, n_charts=3)(torch.randn(8)),
     "AtlasHead expects features [B, 8], got (8,)"),
])
def test_public_helpers_and_models_refuse_malformed_inputs_in_one_line(call, message):
    """They had raised torch's own errors from deep inside: "mat1 and mat2 shapes cannot be
    multiplied", "cdist only supports floating-point dtypes", "'int' object is not
    iterable"."""
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}"):
        call()


@pytest.mark.parametrize("setting", ["hidden_weight", "hidden_threshold"])
@pytest.mark.parametrize("zero_d", [torch.tensor(0.5), np.array(0.5)])
def test_dtml_objective_takes_a_0_d_tensor_or_array_as_a_number(setting, zero_d):
    """As the kernels and ManifoldMMD(eps=) do; it had been iterated: a raw TypeError."""
    objective = DTMLObjective(**{setting: zero_d})
    assert getattr(objective, setting) == 0.5


@pytest.mark.parametrize("zero_d", [torch.tensor(3.0), np.array(3.0), np.array(3)])
def test_ddml_and_nt_xent_settings_take_a_0_d_tensor_or_array_as_a_number(zero_d):
    """As MarginalFisherLoss's alpha, the kernels and DTMLObjective do (as_number); they had
    been refused: "threshold (DDML's tau) must be a finite number, got tensor(3.)"."""
    loss = PairwiseLogisticLoss(threshold=zero_d, sharpness=zero_d)
    assert (loss.threshold, loss.sharpness) == (3.0, 3.0)
    points, labels = torch.randn(5, 2), torch.tensor([0, 0, 1, 1, 2])
    assert torch.equal(pairwise_logistic_loss(points, labels, zero_d, zero_d), loss(points, labels))
    views = torch.randn(6, 3)
    assert torch.equal(nt_xent_loss(views, np.array(0.5)), nt_xent_loss(views, 0.5))


@pytest.mark.parametrize("value", [np.array(True), torch.tensor(True), np.array(1 + 1j),
                                   torch.tensor(1 + 1j), np.array("3"),
                                   np.array(None, dtype=object)])
def test_a_0_d_setting_that_is_no_real_number_is_refused_in_one_line(value):
    """A 0-d bool had become 1.0 though bools do not pass as settings, np.array("3") 3.0, and
    a complex or object one raised float()'s TypeError: as_number leaves them to the
    setting's own check."""
    assert as_number(value, "alpha") is value
    with pytest.raises(KdmlError, match="^alpha must be a finite number >= 0, got "):
        MarginalFisherLoss(alpha=value)
    with pytest.raises(KdmlError, match="^threshold \\(DDML's tau\\) must be a finite number"):
        PairwiseLogisticLoss(threshold=value)
    if isinstance(value, np.ndarray):  # a tensor temperature is not read (a host sync)
        with pytest.raises(KdmlError, match="^nt_xent_loss needs a temperature that is a "):
            nt_xent_loss(torch.randn(4, 2), value)


def test_an_empty_set_of_points_leaves_the_other_s_gradient_finite():
    """The common centre was the mean of both sets: an empty one's mean is NaN, which made the
    gradient of an empty [4, 0] distance matrix (and of the kernels on it) NaN."""
    from kdml.kernels import InverseMultiquadricKernel

    for distances in (squared_distances, InverseMultiquadricKernel(1.0),
                      GaussianMixtureKernel(bandwidth=1.0)):
        x = torch.randn(4, 3, requires_grad=True)
        value = distances(x, torch.zeros(0, 3))
        assert value.shape == (4, 0)
        (value.sum() + x.pow(2).sum()).backward()
        assert torch.equal(x.grad, 2 * x.detach())


def accepted_types(function: object, parameter: str) -> tuple[type, ...]:
    """The classes a parameter's annotation names (a union's members, generics unsubscripted),
    as a user's type checker reads them now that the package is typed (py.typed)."""
    import typing

    hint = typing.get_type_hints(function)[parameter]
    members = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    return tuple(typing.get_origin(member) or member for member in members)


@pytest.mark.parametrize(("function", "parameter", "value"), [
    (am_softmax_loss, "scale", nn.Parameter(torch.tensor(20.0))),  # "e.g. learned"
    (am_softmax_loss, "margin", torch.tensor(0.1)),
    (nt_xent_loss, "temperature", nn.Parameter(torch.tensor(0.5))),
    # NumPy numbers, which the checks take (numbers.Real) but mypy does not take for a float
    (am_softmax_loss, "scale", np.float32(20.0)),
    (am_softmax_loss, "margin", np.float64(0.1)),
    (nt_xent_loss, "temperature", np.float32(0.5)),
    (pairwise_logistic_loss, "threshold", np.float32(3.0)),
    (pairwise_logistic_loss, "sharpness", np.int64(2)),
    (PairwiseLogisticLoss.__init__, "threshold", np.float32(3.0)),
    (PairwiseLogisticLoss.__init__, "sharpness", np.float32(2.0)),
    (PairwiseLogisticLoss.__init__, "threshold", torch.tensor(3.0)),  # "may be 0-d tensors"
    (pairwise_logistic_loss, "sharpness", np.array(2.0)),
    (nt_xent_loss, "temperature", np.array(0.5)),  # "a 0-d NumPy array is read"
    (PolynomialKernel.__init__, "bias", torch.tensor(1.0)),  # "or a 0-d tensor or array"
    (PolynomialKernel.__init__, "degree", np.int64(2)),
    (ManifoldMMD.__init__, "eps", np.array(1e-3)),
    (ManifoldMMD.__init__, "dim", np.int64(4)),
    (GaussianMixtureKernel.__init__, "bandwidth", torch.tensor(2.0)),
    (GaussianMixtureKernel.__init__, "multiplier", np.float32(2.0)),
    (GaussianMixtureKernel.__init__, "num_kernels", np.int64(3)),
    (LaplaceKernel.__init__, "bandwidth", np.float32(1.0)),
    (InverseMultiquadricKernel.__init__, "scale", torch.tensor(0.5)),
    (MarginalFisherLoss.__init__, "alpha", torch.tensor(0.1)),
    (MarginalFisherLoss.__init__, "k1", np.int64(2)),
    (DTMLObjective.__init__, "gamma", np.array(0.1)),
    (DomainAdaptedMethod.__init__, "beta", torch.tensor(1.0)),  # "(or a 0-d tensor or array)"
    (DomainMMD.__init__, "kernel", CosineSimilarity()),  # taken, as a test above shows
    (IntraClassPenalty.__init__, "kernels", CosineSimilarity()),
], ids=lambda value: getattr(value, "__qualname__", None) if callable(value) else None)
def test_the_signatures_name_the_values_the_calls_take(function, parameter, value):
    """With the package typed, the annotations are what a user's mypy holds calls to: they had
    said ``float`` (or ``int``) where the docstrings and checks take a learned tensor, a 0-d
    tensor or array, or a NumPy number, so documented calls were reported as type errors
    ('Argument 3 to "am_softmax_loss" has incompatible type "Parameter"; expected
    "float"')."""
    assert isinstance(value, accepted_types(function, parameter))


def test_the_regularizers_are_typed_to_take_a_user_s_own_kernel_module():
    """check_kernel takes any module called as kernel(x) and kernel(x, y), not only kdml's
    Kernel subclasses; the annotations said Sequence[Kernel]."""
    import typing

    hint = typing.get_type_hints(JointRepresentationSimilarity.__init__)["kernels"]
    assert typing.get_origin(hint) is typing.get_origin(typing.Sequence[int])
    (member,) = typing.get_args(hint)
    assert nn.Module in typing.get_args(member)
