"""JRD (Chu et al., ICML 2020) against the paper's equations, the authors' code and kdml's own
promises, as a fuzzing session of the JRD family found it: alpha = 0 that still lets the
regularizer into the loss, kernel settings `kdml config` accepts and training refuses without
naming them, and the generalization analysis's and the sharded JRS's inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kdml.config import resolve_config
from kdml.errors import KdmlError
from kdml.evaluation.generalization import generalization_terms
from kdml.kernels import (
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    LaplaceKernel,
    MomentGeneratingKernel,
    PolynomialKernel,
    adaptive_bandwidth,
    resolution_floor,
)
from kdml.losses.am_softmax import am_softmax_loss
from kdml.models.backbones import pooled_features
from kdml.regularizers.sharded import sharded_jrs
from kdml.training.recipes import get_recipe
from kdml.training.recipes.jrd import JRDMethod, JRDParams


class _Linear(nn.Module):
    feature_size = 8

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.linear(inputs)


def test_alpha_zero_keeps_an_overflowing_regularizer_out_of_the_loss():
    """alpha = 0 is AM-Softmax alone (README: `amsoftmax` is "JRD with alpha = 0"; batch_needs
    drops the two-class requirement at alpha = 0), yet JRDMethod.forward adds 0 * regularizer.
    A moment-generating kernel on un-normalised pooled features overflows to inf, and
    0 * inf = NaN: the loss and every gradient became NaN and the trainer stopped with 'lower
    ... the regularizer weight', which was already 0."""
    torch.manual_seed(0)
    method = JRDMethod.from_params(_Linear(), 4, 3, JRDParams(alpha=0.0, pool_kernel="mgf"))
    inputs, labels = torch.randn(6, 8) * 10, torch.tensor([0, 0, 1, 1, 2, 2])
    out = method(inputs, labels)
    assert torch.isfinite(out.loss), out.terms
    cosines = method.head(pooled_features(method.backbone, inputs)).class_level
    expected = am_softmax_loss(cosines, labels, method.scale, method.margin)
    assert out.loss.item() == pytest.approx(expected.item())
    out.loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in method.parameters() if p.grad is not None)


@pytest.mark.parametrize("override", ["method.cls_num_kernels=400",
                                      "method.kernel_multiplier=1e40"])
def test_kernel_settings_the_kernels_refuse_are_refused_by_the_config_naming_them(override):
    """JRDParams.validate checks kernel_multiplier "here too, not only by the kernels, so that
    `kdml config` finds them and the message names the setting", but only its sign: `kdml
    config jrd method.cls_num_kernels=400` printed a valid config, and training then said
    "multiplier=2.0 makes a bandwidth sigma_i^2 = 6.22e-61 * tau across 400 kernels", naming
    neither setting."""
    spec = get_recipe("jrd")
    key = override.split("=")[0]
    with pytest.raises(KdmlError, match=key.replace(".", r"\.")):
        resolve_config(spec.name, spec.params, spec.defaults, None, [override])


def test_generalization_with_integer_seen_and_named_unseen_labels_is_not_silently_wrong():
    """generalization_terms takes "labels of any kind the classifiers take, e.g. ints or
    names". With integer seen labels and string unseen ones, np.concatenate made the joint
    classifier's labels strings, its predictions never equalled the integer seen labels, and
    err_seen was 1.0 (lambda inflated by it) without a word. Either the kinds are refused in
    one line or the result is the one of consistently typed labels."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(size=(40, 3)), rng.normal(size=(40, 3))
    seen_labels = np.repeat(np.arange(4), 10)
    unseen_labels = np.array([f"u{label}" for label in np.repeat(np.arange(4), 10)])
    try:
        mixed = generalization_terms(seen, seen_labels, unseen, unseen_labels, repeats=3)
    except KdmlError:
        return
    same_kind = generalization_terms(seen, seen_labels.astype(str), unseen, unseen_labels,
                                     repeats=3)
    assert mixed["err_seen"].values == same_kind["err_seen"].values
    assert mixed["lambda"].values == same_kind["lambda"].values


def test_generalization_with_non_integer_float_labels_is_a_one_line_error():
    """Float labels such as 0.5 reached scikit-learn, whose ValueError ("Unknown label type:
    continuous. Maybe you are trying to fit a classifier, ...") came out raw."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(size=(20, 3)), rng.normal(size=(20, 3))
    labels = np.repeat(np.arange(4), 5) + 0.5
    with pytest.raises(KdmlError):
        generalization_terms(seen, labels, unseen, labels + 10, repeats=2)


@pytest.mark.parametrize("kernels", [GaussianMixtureKernel(), ["gaussian"]],
                         ids=["bare kernel", "kernel name"])
def test_sharded_jrs_refuses_what_is_not_a_sequence_of_kernels_in_one_line(kernels):
    """JointRepresentationSimilarity refuses a bare kernel or a kernel's name in one line
    (check_kernel); sharded_jrs failed with TypeError "object of type 'GaussianMixtureKernel'
    has no len()" / "'str' object is not callable"."""
    x, labels = torch.randn(6, 3), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises(KdmlError):
        sharded_jrs(kernels, [x], labels)


@pytest.mark.parametrize("kernel", [GaussianMixtureKernel(), LaplaceKernel(), PolynomialKernel(),
                                    MomentGeneratingKernel(), InverseMultiquadricKernel(1.0)],
                         ids=lambda kernel: type(kernel).__name__)
def test_a_kernel_refuses_a_numpy_array_in_one_line(kernel):
    """squared_distances, l1_distances and the regularizers refuse NumPy input with "takes
    torch tensors ...; convert with torch.as_tensor"; the kernels themselves (Kernel.forward,
    whose _check_inputs has no check_tensor_inputs) failed with AttributeError "'numpy.ndarray'
    object has no attribute 'is_floating_point'" (a list: "'list' object has no attribute
    'ndim'")."""
    with pytest.raises(KdmlError, match="torch"):
        kernel(np.ones((3, 2), dtype=np.float32))


@pytest.mark.parametrize(("recipe", "override", "key"), [
    ("jrd", "method.regularizer=jmmd", "method.regularizer"),
    ("jrd", "method.layers=[emb]", "method.layers"),
    ("jmmd", "method.layers=[emb, cls]", "method.layers"),
])
def test_with_alpha_zero_the_regularizer_and_its_layers_are_named_unread(recipe, override, key):
    """JRDParams.unread_settings names every kernel setting as unread at alpha = 0 ("method.
    alpha=0 adds no regularizer"), but not the regularizer and the layers it would see: a grid
    over method.regularizer or method.layers at alpha = 0 (Figure 5's shared alpha = 0 start)
    trains the same run in every cell, without a word."""
    spec = get_recipe(recipe)
    default = resolve_config(spec.name, spec.params, spec.defaults)
    config = resolve_config(spec.name, spec.params, spec.defaults, None,
                            ["method.alpha=0", override])
    assert key in [setting for setting, _ in config.method.unread_settings(default.method)]


@pytest.mark.parametrize(("call", "message"), [
    (lambda: adaptive_bandwidth(torch.ones(3, 3), -1.0), "floor must be a finite number > 0"),
    (lambda: adaptive_bandwidth(torch.ones(3, 3), float("nan")), "floor must be a finite"),
    (lambda: resolution_floor(torch.ones(3, 2), 3), "power is 1 .* or 2"),
    # True == 1 had been taken as the L1 floor; a float 2.0 as 2
    (lambda: resolution_floor(torch.ones(3, 2), True), "power is 1 .* or 2.*, got True$"),
    (lambda: resolution_floor(torch.ones(3, 2), 2.0), "power is 1 .* or 2.*, got 2.0$"),
    (lambda: resolution_floor(torch.ones(3), 2), r"takes \[M, D\] points"),
    (lambda: resolution_floor(np.ones((3, 2)), 2), "torch tensors"),
])
def test_the_public_bandwidth_helpers_refuse_what_they_cannot_use(call, message):
    """adaptive_bandwidth's floor of -1 returned tau = 0 (kernels of 0 / 0) and NaN a NaN;
    resolution_floor read power 3 as 1 and failed with IndexError or TypeError on 1-D points
    or a NumPy array."""
    with pytest.raises(KdmlError, match=message):
        call()


@pytest.mark.parametrize("bad", [0.5, float("inf"), float("nan")])
def test_generalization_names_the_label_that_is_no_class(bad):
    """An infinite label is no fraction, and picking the fractional ones had found none to
    name (an IndexError instead of the one-line refusal)."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(size=(20, 3)), rng.normal(size=(20, 3))
    labels = np.repeat(np.arange(4), 5).astype(float)
    labels[3] = bad
    with pytest.raises(KdmlError, match="non-integer value"):
        generalization_terms(seen, labels, unseen, labels + 10, repeats=2)


@pytest.mark.parametrize("seen_labels", [
    np.array([0] * 10 + ["a"] * 10, dtype=object),  # names beside numbers
    np.array(["a"] * 10 + [float("nan")] * 10, dtype=object),  # a missing name read as NaN
    np.array(["a"] * 10 + [None] * 10, dtype=object),
], ids=["int and str", "str and nan", "str and None"])
def test_generalization_with_labels_that_cannot_be_ordered_is_a_one_line_error(seen_labels):
    """Object labels mixing kinds reached NumPy's sort (in scikit-learn's fit and in the
    class-overlap check): "TypeError: '<' not supported between instances of 'str' and
    'int'" came out raw."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(size=(20, 3)), rng.normal(size=(20, 3))
    with pytest.raises(KdmlError, match="cannot be ordered"):
        generalization_terms(seen, seen_labels, unseen, np.array(["b"] * 20, dtype=object),
                             repeats=2)
