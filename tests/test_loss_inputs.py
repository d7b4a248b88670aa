"""What kdml's losses and regularizers take: one-line errors for labels that are not integer
torch tensors on the embeddings' device, settings that would give NaN or reward what the
objective penalises, modules that are not kernels; pytorch-metric-learning's call; exports."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from pytorch_metric_learning.losses import MultipleLosses, TripletMarginLoss
from pytorch_metric_learning.miners import MultiSimilarityMiner, TripletMarginMiner
from torch import Tensor, nn

from kdml.errors import KdmlError
from kdml.kernels import GaussianMixtureKernel, LaplaceKernel, PolynomialKernel
from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.dtml_objective import DTMLObjective
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.losses.nt_xent import nt_xent_loss
from kdml.losses.pairwise_logistic import PairwiseLogisticLoss, pairwise_logistic_loss
from kdml.regularizers.domain import DomainMMD
from kdml.regularizers.jrs import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)


def batch() -> tuple[Tensor, Tensor]:
    """Six [6, 3] embeddings of three classes, two each."""
    return torch.randn(6, 3, generator=torch.Generator().manual_seed(0)), torch.arange(6) % 3


# (owner in the message, what the labels go with, the call on embeddings and labels)
CALLS = {
    "JointRepresentationSimilarity": (
        "representations", lambda x, y: JointRepresentationSimilarity([GaussianMixtureKernel()])(
            [x], y)),
    "JointMMD": ("representations", lambda x, y: JointMMD([GaussianMixtureKernel()])([x], y)),
    "JointIntra": ("representations", lambda x, y: JointIntra([GaussianMixtureKernel()])([x], y)),
    "IntraClassPenalty": ("representations", lambda x, y: IntraClassPenalty()([x], y)),
    "MarginalFisherLoss": ("embeddings", lambda x, y: MarginalFisherLoss(1, 2)(x, y)),
    "pairwise_logistic_loss": ("embeddings", pairwise_logistic_loss),
    "PairwiseLogisticLoss module": ("embeddings", lambda x, y: PairwiseLogisticLoss()(x, y)),
    "am_softmax_loss": ("cosines", lambda x, y: am_softmax_loss(x, y, 20.0, 0.1)),
    "DTMLObjective": ("representations",
                      lambda x, y: DTMLObjective(k1=1, k2=2, beta=0.0, gamma=0.0)([x], y)),
}
# the message names the function, also when the module calls it
OWNERS = {"PairwiseLogisticLoss module": "pairwise_logistic_loss"}
# what the message tells the caller to move the labels to
LIKE = {"representations": "representations[0]", "embeddings": "embeddings",
        "cosines": "cosines"}


def raises_one_line(pattern, call, *args, **kwargs):
    """``call(*args, **kwargs)`` raises a one-line KdmlError matching ``pattern``."""
    with pytest.raises(KdmlError, match=pattern) as error:
        call(*args, **kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("name", list(CALLS))
def test_labels_on_another_device_are_refused_naming_both_devices(name):
    """Torch's own error ("Tensor on device cpu is not on the expected device meta!") came
    from deep inside the maths; the meta device stands in for a GPU."""
    what, call = CALLS[name]
    owner = OWNERS.get(name, name)
    embeddings, labels = batch()
    raises_one_line(rf"^{owner}: the labels are on meta but the {what} on cpu; move the labels "
                    rf"with {re.escape(f'labels.to({LIKE[what]}.device)')}$",
                    call, embeddings, labels.to("meta"))


@pytest.mark.parametrize("name", ["MarginalFisherLoss", "pairwise_logistic_loss",
                                  "JointRepresentationSimilarity"])
def test_embeddings_on_another_device_than_the_labels_are_refused(name):
    what, call = CALLS[name]
    embeddings, labels = batch()
    raises_one_line(rf": the labels are on cpu but the {what} on meta; move the labels",
                    call, embeddings.to("meta"), labels)


def test_representations_on_different_devices_are_refused():
    embeddings, labels = batch()
    jrs = JointRepresentationSimilarity([GaussianMixtureKernel(), GaussianMixtureKernel()])
    raises_one_line(r"^JointRepresentationSimilarity: the representations are on different "
                    r"devices \(cpu, meta\); put them on one device$",
                    jrs, [embeddings, embeddings.to("meta")], labels)


NON_JRS = ["MarginalFisherLoss", "pairwise_logistic_loss", "PairwiseLogisticLoss module",
           "am_softmax_loss", "DTMLObjective"]


@pytest.mark.parametrize("name", NON_JRS)
@pytest.mark.parametrize("convert", [np.asarray, list], ids=["ndarray", "list"])
def test_array_and_list_labels_get_jrs_s_message(name, convert):
    """A PML loop's labels are often NumPy: these raised TypeError or AttributeError, while JRS
    said what to do."""
    what, call = CALLS[name]
    owner = OWNERS.get(name, name)
    embeddings, labels = batch()
    kind = type(convert(labels.tolist())).__name__
    raises_one_line(rf"^{owner} takes torch tensors \(the batch's labels and {what}\), got "
                    rf"{kind}; convert with torch\.as_tensor$",
                    call, embeddings, convert(labels.tolist()))


@pytest.mark.parametrize("name", ["MarginalFisherLoss", "pairwise_logistic_loss",
                                  "PairwiseLogisticLoss module", "DTMLObjective"])
def test_float_labels_are_refused_as_jrs_refuses_them(name):
    """These took float labels silently; JRS and AM-Softmax refuse them."""
    _, call = CALLS[name]
    owner = OWNERS.get(name, name)
    embeddings, labels = batch()
    raises_one_line(rf"^{owner}: labels must be integers, got dtype torch\.float64$",
                    call, embeddings, labels.double())


@pytest.mark.parametrize("labels", [[0, 1, 2, 3], [0, 1, 2, -1], [0, 1, 2, -100]],
                         ids=["3 of 3 classes", "-1", "-100 (cross_entropy's ignore_index)"])
def test_am_softmax_refuses_labels_outside_the_classes_in_one_line(labels):
    """Torch's own "Class values must be smaller than num_classes." came from one_hot on the
    CPU, and a device-side assert on a GPU."""
    bad = labels[-1]
    raises_one_line(rf"^am_softmax_loss: labels must be class indices in \[0, 3\), one per "
                    rf"column of the cosines, got {bad}; number the classes 0 to 2$",
                    am_softmax_loss, torch.rand(4, 3), torch.tensor(labels), 20.0, 0.1)


def test_bool_labels_are_the_classes_0_and_1_also_for_the_range():
    cosines = torch.rand(2, 2)
    assert torch.isfinite(am_softmax_loss(cosines, torch.tensor([True, False]), 20.0, 0.1))
    raises_one_line(r"^am_softmax_loss: labels must be class indices in \[0, 1\), .*, got 1;",
                    am_softmax_loss, cosines[:, :1], torch.tensor([True, False]), 20.0, 0.1)


def test_the_label_range_is_an_asynchronous_assert_where_reading_it_would_sync():
    """On a GPU reading the labels would make every step wait for the device
    (tests/test_host_syncs.py); there, and inside torch.compile, the range goes to
    torch._assert_async with the same message, which stops the run when the device reaches it.
    Compiled on the CPU it stops at once; on the meta device (no values) it passes."""
    counters = torch._dynamo.utils.counters  # reset() keeps them: cleared before and after
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(am_softmax_loss, backend="aot_eager")
    cosines, good = torch.rand(4, 3), torch.tensor([0, 1, 2, 0])
    torch.testing.assert_close(compiled(cosines, good, 20.0, 0.1),
                               am_softmax_loss(cosines, good, 20.0, 0.1))
    with pytest.raises(RuntimeError, match=r"^am_softmax_loss: labels must be class indices in "
                                           r"\[0, 3\), one per column of the cosines; number "
                                           r"the classes 0 to 2$"):
        compiled(cosines, torch.tensor([0, 1, 2, 3]), 20.0, 0.1)
    assert counters["stats"]["unique_graphs"] == 1  # no graph break
    torch._dynamo.reset()
    counters.clear()
    loss = am_softmax_loss(cosines.to("meta"), torch.tensor([0, 1, 2, 3], device="meta"), 20.0,
                           0.1)
    assert loss.device.type == "meta"


def test_the_asynchronous_label_assert_keeps_within_cuda_s_message_limit(monkeypatch):
    """CUDA refuses an assert message of 255 characters or more, and then fails every step,
    good labels too: a long owner or class description is cut short."""
    from kdml import checks

    assert checks.assert_message("short") == "short"
    cut = checks.assert_message("a long description of the classes " * 10)
    assert len(cut) == checks.ASSERT_MESSAGE_LIMIT < 255 and cut.endswith("...")
    wide = checks.assert_message("é" * 200)  # 400 bytes: CUDA counts bytes, not characters
    assert len(wide.encode()) <= checks.ASSERT_MESSAGE_LIMIT and wide.endswith("é...")
    # the asynchronous check goes through it (watched here, not by patching
    # torch._assert_async, which leaves torch.compile unable to trace it)
    given: list[str] = []
    cut_short = checks.assert_message

    def watched(message: str) -> str:
        given.append(message)
        return cut_short(message)

    monkeypatch.setattr(checks, "assert_message", watched)
    checks.check_class_range("owner", torch.tensor([0, 1], device="meta"), 3, "x" * 300)
    assert len(given) == 1 and given[0].startswith("owner: labels must be class indices")


@pytest.mark.parametrize(("name", "call"), [
    ("MarginalFisherLoss", lambda x, y: MarginalFisherLoss(1, 2)(x, y)),
    ("DomainMMD", lambda x, y: DomainMMD()(x, x)),
    ("DomainMMD", lambda x, y: DomainMMD(GaussianMixtureKernel())(x, x)),
    ("GaussianMixtureKernel", lambda x, y: GaussianMixtureKernel()(x)),
    ("LaplaceKernel", lambda x, y: LaplaceKernel()(x, x)),
    ("PolynomialKernel", lambda x, y: PolynomialKernel()(x)),  # an integer matrix, silently
], ids=["MarginalFisherLoss", "DomainMMD", "DomainMMD-kernel", "GaussianMixtureKernel",
        "LaplaceKernel", "PolynomialKernel"])
def test_integer_embeddings_are_refused_in_one_line(name, call):
    """Torch's "mean(): could not infer output dtype" or "cdist only supports floating-point
    dtypes" came from deep inside; JRS and the pairwise logistic loss refused them already."""
    embeddings, labels = batch()
    what = "inputs" if name.endswith("Kernel") else "embeddings"
    raises_one_line(rf"^{name} expects floating point {what}, got torch\.int64; convert with "
                    r"\.float\(\)$", call, embeddings.round().long(), labels)


@pytest.mark.parametrize(("owner", "what", "call"), [
    ("nt_xent_loss", "projections", lambda x: nt_xent_loss(x, 0.5)),  # torch's vector_norm
    ("am_softmax_loss", "cosines", lambda x: am_softmax_loss(x, torch.arange(6) % 3, 20.0,
                                                             0.1)),  # silently
], ids=["nt_xent_loss", "am_softmax_loss"])
def test_integer_projections_and_cosines_are_refused_in_one_line(owner, what, call):
    """nt_xent_loss raised "linalg.vector_norm: Expected a floating point or complex tensor";
    am_softmax_loss took integer cosines silently."""
    raises_one_line(rf"^{owner} expects floating point {what}, got torch\.int64; convert with "
                    r"\.float\(\)$", call, torch.ones(6, 3, dtype=torch.long))


@pytest.mark.parametrize("second", [torch.randn(6, 3), torch.randn(4, 3), torch.randn(4, 4)],
                         ids=["another batch size", "the same batch size", "square"])
def test_nt_xent_refuses_two_views_given_as_two_arguments(second):
    """nt_xent_loss(view1, view2) took the second view for a (learned) temperature: torch's
    broadcasting error, or for a square view a silently wrong loss. The views go in stacked."""
    first = torch.randn(4, 3)
    raises_one_line(r"^nt_xent_loss takes the two views stacked as one \[2N, D\] tensor, "
                    r"torch\.cat\(\[view1, view2\]\), and a temperature; got a temperature "
                    rf"tensor of shape {re.escape(str(tuple(second.shape)))}$",
                    nt_xent_loss, first, second)
    raises_one_line(r"^nt_xent_loss takes the two views stacked .*, got tuple$",
                    nt_xent_loss, (first, first), 0.5)
    # one number in a tensor (a learned temperature) is still taken as it was
    torch.testing.assert_close(nt_xent_loss(first, torch.tensor([0.5])),
                               nt_xent_loss(first, 0.5))


def test_nt_xent_refuses_a_temperature_on_another_device():
    """A learned temperature left on another device failed deep in the division ("Tensor on
    device meta is not on the expected device cpu!"); the meta device stands in for a GPU. A
    0-dim CPU tensor, which torch takes with any device's tensors, is still taken."""
    views = torch.randn(4, 3)
    raises_one_line(r"^nt_xent_loss got a temperature on meta and projections on cpu; move the "
                    r"temperature to cpu$", nt_xent_loss, views, torch.tensor([0.5], device="meta"))
    torch.testing.assert_close(nt_xent_loss(views, torch.tensor(0.5)), nt_xent_loss(views, 0.5))


@pytest.mark.parametrize("name", ["scale", "margin"])
def test_am_softmax_refuses_a_learned_setting_on_another_device(name):
    """A learned scale or margin left on another device failed deep in the loss ("Tensor on
    device meta is not on the expected device cpu!"), where nt_xent_loss refuses such a
    temperature in one line; the meta device stands in for a GPU. A 0-dim CPU tensor, which
    torch takes with any device's tensors, is still taken."""
    cosines, labels = torch.tensor([[0.5, 0.3], [0.1, 0.4]]), torch.tensor([0, 1])
    settings = {"scale": 20.0, "margin": 0.1}
    elsewhere = {**settings, name: torch.tensor([settings[name]], device="meta")}
    raises_one_line(rf"^am_softmax_loss got a {name} on meta and cosines on cpu; move the "
                    rf"{name} to cpu$", am_softmax_loss, cosines, labels, **elsewhere)
    zero_dim = {**settings, name: torch.tensor(settings[name])}
    torch.testing.assert_close(am_softmax_loss(cosines, labels, **zero_dim),
                               am_softmax_loss(cosines, labels, **settings))


@pytest.mark.parametrize("shape", [(1,), (1, 1), (1, 1, 1)])
def test_a_one_element_setting_of_any_shape_is_its_number(shape):
    """The checks take a learned scale, margin or temperature of one element; one of shape
    [1, 1, 1] had made the logits 3-D, and cross_entropy failed with "Expected input
    batch_size (1) to match target batch_size (2)"."""
    cosines, labels = torch.tensor([[0.5, 0.3], [0.1, 0.4]]), torch.tensor([0, 1])
    expected = am_softmax_loss(cosines, labels, 20.0, 0.1)
    torch.testing.assert_close(
        am_softmax_loss(cosines, labels, torch.full(shape, 20.0), torch.full(shape, 0.1)),
        expected)
    views = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(nt_xent_loss(views, torch.full(shape, 0.5)),
                               nt_xent_loss(views, 0.5))


def test_nt_xent_refuses_an_empty_batch():
    """A (0, D) batch has an even length and gave a NaN loss without a word."""
    raises_one_line(r"^nt_xent_loss needs \[2N, D\] projections \(two views per image, N >= "
                    r"1\), got \(0, 5\)$", nt_xent_loss, torch.randn(0, 5), 0.5)


@pytest.mark.parametrize("kernel", ["gaussian", 3, nn.Linear(3, 3)])
def test_domain_mmd_refuses_what_is_no_kernel_when_built(kernel):
    """A kernel's name or a number was taken, then failed at the first batch with "'str'
    object is not callable"; it is refused when built, as JRS refuses one."""
    raises_one_line(rf"^DomainMMD: kernels must be kernel modules called as kernel\(x, y\) "
                    rf"\(see kdml\.kernels\), got {type(kernel).__name__}$", DomainMMD, kernel)


@pytest.mark.parametrize("kernel", [None, GaussianMixtureKernel()], ids=["Eq. 6", "kernel"])
@pytest.mark.parametrize("convert", [Tensor.numpy, Tensor.tolist], ids=["ndarray", "list"])
def test_domain_mmd_refuses_arrays_in_one_line(kernel, convert):
    """NumPy arrays raised "'numpy.ndarray' object has no attribute 'is_floating_point'"."""
    source, _ = batch()
    kind = type(convert(source)).__name__
    raises_one_line(rf"^DomainMMD takes torch tensors \(source and target embeddings\), got "
                    rf"{kind}; convert with torch\.as_tensor$",
                    DomainMMD(kernel), convert(source), source)


# ----------------------------------------------------------------- settings


@pytest.mark.parametrize(("scale", "margin", "message"), [
    (float("inf"), 0.1, "a scale that is a finite number > 0, got inf"),  # gave NaN
    (float("nan"), 0.1, "a scale that is a finite number > 0, got nan"),
    (0.0, 0.1, "a scale that is a finite number > 0, got 0.0"),
    (-20.0, 0.1, r"a scale that is a finite number > 0, got -20\.0"),
    (True, 0.1, "a scale that is a finite number > 0, got True"),
    (20.0, float("nan"), "a margin that is a finite number >= 0, got nan"),  # gave NaN
    (20.0, float("inf"), "a margin that is a finite number >= 0, got inf"),
    (20.0, -0.1, r"a margin that is a finite number >= 0, got -0\.1"),
    # a per-class scale had been taken silently, a margin of another length a raw size error
    (torch.full((3,), 20.0), 0.1, r"a scale that is one number \(a tensor of one element, if "
                                  r"learned\), got shape \(3,\)"),
    (20.0, torch.full((5,), 0.1), r"a margin that is one number \(a tensor of one element, if "
                                  r"learned\), got shape \(5,\)"),
])
def test_am_softmax_refuses_a_scale_or_margin_outside_eq_12(scale, margin, message):
    cosines, labels = torch.rand(4, 3), torch.tensor([0, 1, 2, 0])
    raises_one_line(rf"^am_softmax_loss needs {message}$", am_softmax_loss, cosines, labels,
                    scale, margin)
    # the paper's settings, a zero margin and a tensor (e.g. learned) scale still work
    for good_scale, good_margin in ((20.0, 0.1), (20, 0), (torch.tensor(20.0), 0.05)):
        assert torch.isfinite(am_softmax_loss(cosines, labels, good_scale, good_margin))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"hidden_weight": -1.0}, r"^DTMLObjective: hidden_weight must be a finite number >= 0, "
                              r"got -1\.0$"),
    ({"hidden_weight": [1.0, -0.5]}, r"^DTMLObjective: hidden_weight must be a finite number "
                                     r">= 0, got -0\.5$"),
    ({"hidden_weight": float("nan")}, "hidden_weight must be a finite number >= 0, got nan"),
    ({"hidden_threshold": float("nan")}, r"^DTMLObjective: hidden_threshold must be a finite "
                                         r"number, got nan$"),
    ({"beta": float("inf")}, r"^DTMLObjective: beta must be a finite number >= 0, got inf$"),
    ({"gamma": float("inf")}, r"^DTMLObjective: gamma must be a finite number >= 0, got inf$"),
    ({"alpha": float("inf")}, r"^alpha must be a finite number >= 0, got inf$"),
])
def test_dtml_objective_refuses_weights_that_reward_the_penalty_at_construction(kwargs, message):
    """omega < 0 turned the hidden layers' hinge into a reward (Eq. 8): accepted until now."""
    raises_one_line(message, DTMLObjective, **kwargs)


@pytest.mark.parametrize("regularizer", [JointRepresentationSimilarity, JointMMD, JointIntra,
                                         lambda kernels: IntraClassPenalty(kernels[0])],
                         ids=["JRS", "JMMD", "JIntra", "IntraClassPenalty"])
@pytest.mark.parametrize("module", [nn.Identity(), nn.Linear(3, 6), nn.Bilinear(3, 3, 6)],
                         ids=["Identity", "Linear", "Bilinear"])
def test_a_module_that_is_not_a_kernel_is_refused_at_construction(regularizer, module):
    """nn.Identity passed the constructor and raised a shape RuntimeError at the first batch."""
    raises_one_line(rf": kernels must be kernel modules called as kernel\(x, y\) \(see "
                    rf"kdml\.kernels\), got {type(module).__name__}$", regularizer, [module])


@pytest.mark.parametrize("regularizer", [DomainMMD, IntraClassPenalty,
                                         lambda kernel: JointRepresentationSimilarity([kernel])],
                         ids=["DomainMMD", "IntraClassPenalty", "JRS"])
@pytest.mark.parametrize("module", [nn.ModuleDict({"k": GaussianMixtureKernel()}), nn.Module()],
                         ids=["ModuleDict", "Module"])
def test_a_module_with_no_forward_of_its_own_is_refused_at_construction(regularizer, module):
    """A container's forward is nn.Module's unimplemented forward(*input), which takes any
    call: check_kernel let it through and the first batch raised torch's NotImplementedError
    ("Module [ModuleDict] is missing the required "forward" function")."""
    raises_one_line(rf": kernels must be kernel modules called as kernel\(x, y\) \(see "
                    rf"kdml\.kernels\), got {type(module).__name__}$", regularizer, module)


def test_a_compiled_kernel_is_still_a_kernel():
    """torch.compile's wrapper has no forward of its class, only of the instance: the check
    for containers must read the instance's, or it refuses a compiled kernel."""
    # the wrapper is the same class for every backend: "eager" spares importing inductor
    kernel = torch.compile(GaussianMixtureKernel(), backend="eager")
    assert JointRepresentationSimilarity([kernel]).kernels[0] is kernel


@pytest.mark.parametrize("regularizer", [JointRepresentationSimilarity, JointMMD, JointIntra,
                                         IntraClassPenalty],
                         ids=["JRS", "JMMD", "JIntra", "IntraClassPenalty"])
def test_an_nn_module_list_of_kernels_is_a_sequence_of_kernels(regularizer):
    """JRS and its baselines refused an nn.ModuleList of kernels (another regularizer's
    .kernels), which sharded_jrs takes, as "takes a sequence of kernels"; IntraClassPenalty
    took the list itself for the kernel and failed at the first batch with torch's
    NotImplementedError."""
    embeddings, labels = batch()
    kernel = GaussianMixtureKernel(1, bandwidth=2.0)
    from_list = regularizer(nn.ModuleList([kernel]))([embeddings], labels)
    assert torch.equal(from_list, regularizer([kernel])([embeddings], labels))


class NotAKernel(nn.Module):
    """Called like a kernel, returns its input: told apart only by its output's shape."""

    def forward(self, x: Tensor, y: Tensor | None = None) -> Tensor:
        return x


@pytest.mark.parametrize("regularizer", [JointRepresentationSimilarity, JointMMD, JointIntra,
                                         lambda kernels: IntraClassPenalty(kernels[0])],
                         ids=["JRS", "JMMD", "JIntra", "IntraClassPenalty"])
def test_a_kernel_like_module_of_the_wrong_output_shape_is_refused_at_the_call(regularizer):
    embeddings, labels = batch()
    raises_one_line(r": kernel 0 \(NotAKernel\) returned shape \(6, 3\), not the \[M, M\] = "
                    r"\[6, 6\] kernel matrix of its \[M, D\] representation; pass kernels from "
                    r"kdml\.kernels$", regularizer([NotAKernel()]), [embeddings], labels)


# ----------------------------------------------------------------- pytorch-metric-learning


def test_kdml_losses_work_inside_pml_s_multiple_losses():
    """PML passes indices_tuple positionally: "forward() takes 3 positional arguments but 4
    were given". The total is the weighted sum of the parts."""
    embeddings, labels = batch()
    embeddings.requires_grad_()
    triplet, fisher, logistic = TripletMarginLoss(), MarginalFisherLoss(1, 2), \
        PairwiseLogisticLoss()
    total = MultipleLosses([triplet, fisher, logistic], weights=[1.0, 0.5, 2.0])(embeddings,
                                                                                 labels)
    parts = (triplet(embeddings, labels) + 0.5 * fisher(embeddings, labels)
             + 2.0 * logistic(embeddings, labels))
    torch.testing.assert_close(total, parts, rtol=1e-6, atol=0.0)
    assert total != triplet(embeddings, labels)  # the kdml parts count
    total.backward()
    assert embeddings.grad is not None and torch.isfinite(embeddings.grad).all()


@pytest.mark.parametrize("loss", [MarginalFisherLoss(1, 2), PairwiseLogisticLoss()],
                         ids=["MarginalFisherLoss", "PairwiseLogisticLoss"])
def test_miners_tuples_and_reference_batches_are_refused_in_one_line(loss):
    """These losses use every pair of the batch: a miner's pairs or a CrossBatchMemory's
    reference batch would be silently ignored, so they are refused."""
    embeddings, labels = batch()
    name = type(loss).__name__
    raises_one_line(rf"^{name} .*, so it takes no indices_tuple \(no miner, reference batch "
                    r"or CrossBatchMemory\); call it as loss\(embeddings, labels\)$",
                    loss, embeddings, labels, MultiSimilarityMiner()(embeddings, labels))
    raises_one_line(rf"^{name} .*, so it takes no ref_emb or ref_labels ", lambda: loss(
        embeddings, labels, ref_emb=embeddings, ref_labels=labels))
    raises_one_line(rf"^{name} needs the batch's labels; call it as loss\(embeddings, labels\)$",
                    lambda: loss(embeddings, labels=None))


REGULARIZERS = {
    "JointRepresentationSimilarity": (
        lambda: JointRepresentationSimilarity([GaussianMixtureKernel()]),
        "averages the joint kernel over every inter-class pair of the batch"),
    "JointMMD": (lambda: JointMMD([GaussianMixtureKernel()]),
                 "compares the kernel embeddings of the batch's classes, each over all its "
                 "samples"),
    "JointIntra": (lambda: JointIntra([GaussianMixtureKernel()]),
                   "uses the kernel embeddings of the batch's classes, each over all its "
                   "samples"),
    "IntraClassPenalty": (IntraClassPenalty,
                          "averages the kernel over every same-class pair of the batch"),
}


@pytest.mark.parametrize("name", list(REGULARIZERS))
@pytest.mark.parametrize("miner", [MultiSimilarityMiner(), TripletMarginMiner(margin=0.2)],
                         ids=["pairs", "triplets"])
def test_regularizers_refuse_a_miner_s_tuple_in_one_line(name, miner):
    """A PML loop hands its miner's indices_tuple to every loss: the regularizers raised
    "forward() takes 3 positional arguments but 4 were given" (or "got an unexpected keyword
    argument 'indices_tuple'"). They compare the batch's classes over all its pairs, so a
    miner's subset of pairs does not fit them: the tuple goes to the PML loss beside them."""
    build, reason = REGULARIZERS[name]
    regularizer = build()
    embeddings, labels = batch()
    mined = miner(embeddings, labels)
    advice = (r" \(no miner, reference batch or CrossBatchMemory\); give the miner's tuple to "
              r"the PML loss beside it and call this as reg\(\[embeddings\], labels\)$")
    raises_one_line(rf"^{name} {re.escape(reason)}, so it takes no indices_tuple{advice}",
                    regularizer, [embeddings], labels, mined)
    raises_one_line(rf"^{name} .*, so it takes no indices_tuple{advice}",
                    lambda: regularizer([embeddings], labels, indices_tuple=mined))
    raises_one_line(rf"^{name} .*, so it takes no ref_emb or ref_labels{advice}",
                    lambda: regularizer([embeddings], labels, ref_emb=embeddings,
                                        ref_labels=labels))
    # the PML loop as the README writes it: the miner feeds the PML loss, the regularizer
    # takes the whole batch
    embeddings.requires_grad_()
    loss = TripletMarginLoss()(embeddings, labels, mined) + regularizer([embeddings], labels)
    loss.backward()
    assert embeddings.grad is not None and torch.isfinite(embeddings.grad).all()


@pytest.mark.parametrize("build", [build for build, _ in REGULARIZERS.values()]
                         + [lambda: DTMLObjective(k1=1, k2=2, beta=0.0, gamma=0.0)],
                         ids=[*REGULARIZERS, "DTMLObjective"])
def test_a_generator_of_representations_is_refused_in_one_line(build):
    """A generator raised "TypeError: object of type 'generator' has no len()" (and would run
    out after one pass over the layers)."""
    regularizer = build()
    embeddings, labels = batch()
    raises_one_line(rf"^{type(regularizer).__name__} takes a sequence of representations "
                    r"\(one tensor per layer\), e\.g\. \[embeddings\], got generator; pass a "
                    r"list$", regularizer, (rep for rep in [embeddings]), labels)
    value = regularizer((embeddings,), labels)  # a tuple is a sequence: taken as before
    assert torch.isfinite(getattr(value, "total", value))  # DTMLObjective's ObjectiveOutput


# ----------------------------------------------------------------- exports


@pytest.mark.parametrize("first", ["kdml.losses", "kdml.regularizers",
                                   "kdml.losses.pairwise_logistic"])
def test_the_losses_and_regularizers_are_exported_without_an_import_cycle(first):
    """Each package imported first in a fresh interpreter (an import cycle fails only in
    some orders); the names are the modules' own, and __all__ stays sorted."""
    code = f"""
import importlib
importlib.import_module({first!r})
import kdml.losses as losses
import kdml.regularizers as regularizers
from kdml.losses.pairwise_logistic import PairwiseLogisticLoss, pairwise_logistic_loss
from kdml.regularizers.domain import DomainMMD
from kdml.regularizers.manifold import ChartMembershipLoss, ManifoldMMD
assert regularizers.ChartMembershipLoss is ChartMembershipLoss
assert losses.PairwiseLogisticLoss is PairwiseLogisticLoss
assert losses.pairwise_logistic_loss is pairwise_logistic_loss
assert regularizers.DomainMMD is DomainMMD and regularizers.ManifoldMMD is ManifoldMMD
for package, names in ((losses, ["PairwiseLogisticLoss", "pairwise_logistic_loss"]),
                       (regularizers, ["ChartMembershipLoss", "DomainMMD", "ManifoldMMD"])):
    assert set(names) <= set(package.__all__), package.__all__
    assert package.__all__ == sorted(package.__all__), package.__all__
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_temperature_below_float32_s_smallest_normal_is_refused():
    """1e-39 is > 0 but a subnormal in float32: cosine / tau overflowed and the loss was inf
    or NaN; the floor is float32's smallest normal (nt_xent.MIN_TEMPERATURE)."""
    from kdml.errors import KdmlError
    from kdml.losses.nt_xent import nt_xent_loss

    with pytest.raises(KdmlError, match="smallest normal"):
        nt_xent_loss(torch.randn(4, 3), 1e-39)


@pytest.mark.parametrize("name", ["scale", "margin"])
def test_am_softmax_refuses_an_empty_setting_tensor_in_one_line(name):
    """A tensor setting of no element is not one number: refused, not torch's "shape '[]' is
    invalid for input of size 0" from the reshape to a 0-dim number (mutation audit)."""
    settings = {"scale": 20.0, "margin": 0.1, name: torch.empty(0)}
    raises_one_line(rf"^am_softmax_loss needs a {name} that is one number .*got shape \(0,\)$",
                    am_softmax_loss, torch.tensor([[0.5, 0.3], [0.1, 0.4]]),
                    torch.tensor([0, 1]), **settings)


def test_nt_xent_refuses_an_empty_temperature_tensor_in_one_line():
    """A temperature tensor of no element is refused as one of another shape (mutation
    audit: torch's reshape error otherwise)."""
    raises_one_line(r"got a temperature tensor of shape \(0,\)$", nt_xent_loss,
                    torch.randn(4, 3), torch.empty(0))


def test_nt_xent_takes_float32_s_smallest_normal_as_its_temperature():
    """The refusal starts below float32's smallest normal: that number itself is taken and
    gives a finite loss (mutation audit: a doubled floor, or > for >=, refused it)."""
    tiny = float(torch.finfo(torch.float32).tiny)
    views = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    assert torch.isfinite(nt_xent_loss(views, tiny))
    with pytest.raises(KdmlError, match="smallest normal"):
        nt_xent_loss(views, tiny * (1 - 2 ** -52))
