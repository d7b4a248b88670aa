"""JRS, JMMD, JIntra and the Eq. 4 penalty against literal float64 implementations.

The references loop over classes, samples and layers and evaluate every kernel value with
``math.exp`` etc., straight from Eq. 8, 10/11, 15, 16 and 4 of Chu et al. (ICML 2020); they
share no code with the modules under test.
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from torch.autograd import gradcheck

from kdml.errors import KdmlError
from kdml.kernels import (
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    LaplaceKernel,
    PolynomialKernel,
)
from kdml.regularizers import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)
from kdml.regularizers import jrs as jrs_module

# ----------------------------------------------------------------- literal references


def sq_dist(a, b) -> float:
    return sum((ai - bi) ** 2 for ai, bi in zip(a, b, strict=True))


def l1_dist(a, b) -> float:
    return sum(abs(ai - bi) for ai, bi in zip(a, b, strict=True))


def mean_over_pairs(points, dist) -> float:
    values = [dist(p, q) for i, p in enumerate(points) for j, q in enumerate(points) if i != j]
    return sum(values) / len(values) if values else 0.0


def ref_gaussian(num_kernels: int):
    """Layer kernel with the batch-adaptive tau (mean squared distance over pairs i != j)."""

    def make(points):
        tau = mean_over_pairs(points, sq_dist)
        sigma2s = [tau * 2.0 ** (i - num_kernels // 2) for i in range(num_kernels)]
        return lambda a, b: sum(math.exp(-sq_dist(a, b) / s2) for s2 in sigma2s) / num_kernels

    return make


def ref_laplace(points):
    sigma = mean_over_pairs(points, l1_dist)
    return lambda a, b: math.exp(-l1_dist(a, b) / sigma)


def ref_polynomial(points):
    return lambda a, b: (sum(ai * bi for ai, bi in zip(a, b, strict=True)) + 1.0) ** 2


def ref_imq(points):
    return lambda a, b: 0.5 / (0.5 + sq_dist(a, b))


# (module kernel, reference kernel builder) per layer: JRD's [pooling, embedding, class level]
# and a mixed set of other kernels
KERNEL_SETS = {
    "jrd-gaussians": [
        (lambda: GaussianMixtureKernel(3), ref_gaussian(3)),
        (lambda: GaussianMixtureKernel(3), ref_gaussian(3)),
        (lambda: GaussianMixtureKernel(1), ref_gaussian(1)),
    ],
    "mixed": [
        (LaplaceKernel, ref_laplace),
        (lambda: PolynomialKernel(2, 1.0), ref_polynomial),
        (lambda: InverseMultiquadricKernel(0.5), ref_imq),
    ],
}

LAYER_DIMS = [5, 4, 3]
# unbalanced classes (4, 2, 2, 1 samples), non-contiguous label values, one singleton class
UNBALANCED_LABELS = [7, 3, 3, 11, 7, 3, 5, 11, 3]


def class_members(labels: list[int]) -> dict[int, list[int]]:
    members: dict[int, list[int]] = {}
    for i, label in enumerate(labels):
        members.setdefault(label, []).append(i)
    return members


def layer_kernels(layers: list[list[list[float]]], ref_builders) -> list:
    return [build(points) for build, points in zip(ref_builders, layers, strict=True)]


def joint_k(kernels, layers, i: int, j: int) -> float:
    value = 1.0
    for k, points in zip(kernels, layers, strict=True):
        value *= k(points[i], points[j])
    return value


def ref_similarity(kernels, layers, members_p, members_q) -> float:
    """Eq. 8: 1/(n n') sum_i sum_j prod_l k^l(x_i^l, x_j^l)."""
    total = sum(joint_k(kernels, layers, i, j) for i in members_p for j in members_q)
    return total / (len(members_p) * len(members_q))


def ref_jrs(layers, labels, ref_builders) -> float:
    """Eq. 10 divided by N_pairs (Eq. 11)."""
    kernels = layer_kernels(layers, ref_builders)
    members = class_members(labels)
    total, num_pairs = 0.0, 0
    for class_i, members_i in members.items():
        for class_j, members_j in members.items():
            if class_i == class_j:
                continue
            for i in members_i:
                for j in members_j:
                    total += joint_k(kernels, layers, i, j)
                    num_pairs += 1
    return total / num_pairs if num_pairs else 0.0


def ref_class_pair_mean(layers, labels, ref_builders, pair_value) -> float:
    """Mean over ordered class pairs I != J of pair_value(norm2_I, norm2_J, inner_IJ)."""
    kernels = layer_kernels(layers, ref_builders)
    members = class_members(labels)
    values = []
    for class_i, members_i in members.items():
        for class_j, members_j in members.items():
            if class_i == class_j:
                continue
            norm2_i = ref_similarity(kernels, layers, members_i, members_i)
            norm2_j = ref_similarity(kernels, layers, members_j, members_j)
            inner = ref_similarity(kernels, layers, members_i, members_j)
            values.append(pair_value(norm2_i, norm2_j, inner))
    return sum(values) / len(values) if values else 0.0


def ref_jmmd(layers, labels, ref_builders) -> float:
    """Eq. 15: -||C(P) - C(Q)||^2 = -(||C_P||^2 + ||C_Q||^2 - 2 <C_P, C_Q>)."""
    return ref_class_pair_mean(
        layers, labels, ref_builders, lambda n_i, n_j, inner: -(n_i + n_j - 2.0 * inner)
    )


def ref_jintra(layers, labels, ref_builders) -> float:
    """Eq. 16: -||C(P)||^2 - ||C(Q)||^2."""
    return ref_class_pair_mean(layers, labels, ref_builders, lambda n_i, n_j, inner: -(n_i + n_j))


def ref_intra_penalty(points, labels) -> float:
    """Eq. 4: -sum_I 1/N^I sum_{i != j in I} exp(-1/2 ||x_i - x_j||^2), N^I ordered pairs."""
    total = 0.0
    for members in class_members(labels).values():
        pairs = [(i, j) for i in members for j in members if i != j]
        if pairs:
            total += sum(math.exp(-0.5 * sq_dist(points[i], points[j])) for i, j in pairs) / len(
                pairs
            )
    return -total


REFERENCES = {
    JointRepresentationSimilarity: ref_jrs,
    JointMMD: ref_jmmd,
    JointIntra: ref_jintra,
}


def make_layers(num_samples: int, num_layers: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(num_samples, dim, generator=gen, dtype=torch.float64)
        for dim in LAYER_DIMS[:num_layers]
    ]


# ----------------------------------------------------------------- values


@pytest.mark.parametrize("regularizer_class", list(REFERENCES), ids=lambda c: c.__name__)
@pytest.mark.parametrize("kernel_set", list(KERNEL_SETS))
@pytest.mark.parametrize("num_layers", [1, 2, 3])
@pytest.mark.parametrize(
    "labels", [UNBALANCED_LABELS, [0, 0, 0, 1, 1, 1, 2, 2, 2]], ids=["unbalanced", "balanced"]
)
def test_joint_regularizers_match_literal_loops(regularizer_class, kernel_set, num_layers, labels):
    layers = make_layers(len(labels), num_layers)
    spec = KERNEL_SETS[kernel_set][:num_layers]
    regularizer = regularizer_class([make() for make, _ in spec])
    got = regularizer(layers, torch.tensor(labels))
    expected = REFERENCES[regularizer_class](
        [t.tolist() for t in layers], labels, [ref for _, ref in spec]
    )
    assert got.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("labels", [UNBALANCED_LABELS, [0, 0, 1, 1, 1, 2, 2, 2, 2]])
def test_intra_class_penalty_matches_eq4(labels):
    (emb,) = make_layers(len(labels), 1, seed=4)
    got = IntraClassPenalty()([emb], torch.tensor(labels))
    assert got.item() == pytest.approx(ref_intra_penalty(emb.tolist(), labels), rel=1e-12)


def test_intra_class_penalty_uses_last_representation_and_given_kernel():
    labels = UNBALANCED_LABELS
    pooled, emb = make_layers(len(labels), 2, seed=5)
    default = IntraClassPenalty()([pooled, emb], torch.tensor(labels))
    assert default.item() == pytest.approx(ref_intra_penalty(emb.tolist(), labels), rel=1e-12)
    # Eq. 4's kernel is the Gaussian with sigma^2 = 2; any kernel can replace it
    members = class_members(labels)
    expected = 0.0
    for idx in members.values():
        pairs = [(i, j) for i in idx for j in idx if i != j]
        if pairs:
            values = [0.5 / (0.5 + sq_dist(emb[i].tolist(), emb[j].tolist())) for i, j in pairs]
            expected -= sum(values) / len(pairs)
    for kernels in (InverseMultiquadricKernel(0.5), [InverseMultiquadricKernel(0.5)]):
        got = IntraClassPenalty(kernels)([emb], torch.tensor(labels))
        assert got.item() == pytest.approx(expected, rel=1e-12)


def test_jmmd_is_jintra_plus_twice_jrs_on_a_balanced_batch():
    labels = torch.arange(4).repeat_interleave(3)
    layers = make_layers(12, 3, seed=6)
    kernels = [GaussianMixtureKernel(3), GaussianMixtureKernel(3), GaussianMixtureKernel(1)]
    jmmd = JointMMD(kernels)(layers, labels)
    jintra = JointIntra(kernels)(layers, labels)
    jrs = JointRepresentationSimilarity(kernels)(layers, labels)
    torch.testing.assert_close(jmmd, jintra + 2 * jrs)


# ----------------------------------------------------------------- gradients


def fixed_kernels(num_layers: int) -> list:
    return [
        GaussianMixtureKernel(3, bandwidth=4.0),
        LaplaceKernel(bandwidth=3.0),
        GaussianMixtureKernel(1, bandwidth=2.5),
    ][:num_layers]


@pytest.mark.parametrize("regularizer_class", list(REFERENCES), ids=lambda c: c.__name__)
@pytest.mark.parametrize("num_layers", [1, 3])
def test_gradcheck_joint_regularizers(regularizer_class, num_layers):
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 3])
    layers = [t.requires_grad_() for t in make_layers(7, num_layers, seed=7)]
    regularizer = regularizer_class(fixed_kernels(num_layers))
    assert gradcheck(lambda *reps: regularizer(list(reps), labels), tuple(layers))


def test_gradcheck_intra_class_penalty():
    labels = torch.tensor([0, 0, 1, 1, 1, 2, 3])
    (emb,) = make_layers(7, 1, seed=8)
    penalty = IntraClassPenalty()
    assert gradcheck(lambda e: penalty([e], labels), (emb.requires_grad_(),))


@pytest.mark.parametrize("regularizer_class", list(REFERENCES), ids=lambda c: c.__name__)
def test_adaptive_bandwidth_gets_no_gradient(regularizer_class):
    """The gradient with self-adaptive kernels equals the one with the same taus fixed."""
    labels = torch.tensor(UNBALANCED_LABELS)
    layers = make_layers(len(UNBALANCED_LABELS), 3, seed=9)
    taus = [mean_over_pairs(t.tolist(), sq_dist) for t in layers]
    sizes = [3, 3, 1]

    def grads(kernels) -> list[torch.Tensor]:
        leaves = [t.clone().requires_grad_() for t in layers]
        regularizer_class(kernels)(leaves, labels).backward()
        return [leaf.grad for leaf in leaves]

    adaptive = grads([GaussianMixtureKernel(k) for k in sizes])
    fixed = grads(
        [GaussianMixtureKernel(k, bandwidth=tau) for k, tau in zip(sizes, taus, strict=True)]
    )
    for got, expected in zip(adaptive, fixed, strict=True):
        torch.testing.assert_close(got, expected)


# ----------------------------------------------------------------- degenerate batches

ALL_REGULARIZERS = [JointRepresentationSimilarity, JointMMD, JointIntra]


@pytest.mark.parametrize("regularizer_class", ALL_REGULARIZERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("num_samples", [1, 5])
def test_single_class_gives_attached_zero(regularizer_class, num_samples):
    layers = [t.requires_grad_() for t in make_layers(num_samples, 2, seed=10)]
    value = regularizer_class([GaussianMixtureKernel(3), LaplaceKernel()])(
        layers, torch.zeros(num_samples, dtype=torch.long)
    )
    assert value.item() == 0.0
    assert value.requires_grad
    grads = torch.autograd.grad(value, layers)
    for grad in grads:
        assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_all_equal_embeddings_are_finite(dtype):
    labels = torch.tensor([0, 0, 1, 1, 2])
    kernels = [GaussianMixtureKernel(3), LaplaceKernel(), GaussianMixtureKernel(1)]
    expected = {
        JointRepresentationSimilarity: 1.0,  # every kernel value is exactly 1
        JointMMD: 0.0,  # identical classes: no discrepancy
        JointIntra: -2.0,  # -(1 + 1)
    }
    for regularizer_class, value_expected in expected.items():
        layers = [torch.full((5, d), 0.7, dtype=dtype, requires_grad=True) for d in (6, 4, 3)]
        value = regularizer_class(kernels)(layers, labels)
        assert value.item() == pytest.approx(value_expected, abs=1e-6)
        for grad in torch.autograd.grad(value, layers):
            assert torch.isfinite(grad).all()
    emb = torch.full((5, 4), 0.7, dtype=dtype, requires_grad=True)
    value = IntraClassPenalty()([emb], labels)
    assert value.item() == pytest.approx(-2.0)  # two classes with pairs, kernel 1 each
    assert torch.isfinite(torch.autograd.grad(value, emb)[0]).all()


def test_classes_with_one_sample_are_finite():
    labels = torch.tensor([0, 1, 2, 3])  # only singletons
    layers = [t.requires_grad_() for t in make_layers(4, 2, seed=11)]
    for regularizer_class in ALL_REGULARIZERS:
        value = regularizer_class([GaussianMixtureKernel(3), GaussianMixtureKernel(1)])(
            layers, labels
        )
        assert torch.isfinite(value)
        assert all(torch.isfinite(g).all() for g in torch.autograd.grad(value, layers))
    penalty = IntraClassPenalty()([layers[1]], labels)
    assert penalty.item() == 0.0
    assert penalty.requires_grad


# ----------------------------------------------------------------- input validation


@pytest.mark.parametrize("regularizer_class", ALL_REGULARIZERS, ids=lambda c: c.__name__)
def test_wrong_number_of_kernels(regularizer_class):
    layers = make_layers(6, 3)
    labels = torch.tensor([0, 0, 1, 1, 2, 2])
    regularizer = regularizer_class([GaussianMixtureKernel(), GaussianMixtureKernel()])
    with pytest.raises(KdmlError, match="2 kernel"):
        regularizer(layers, labels)
    with pytest.raises(KdmlError, match="2 kernel"):
        regularizer(layers[:1], labels)


@pytest.mark.parametrize("regularizer_class", ALL_REGULARIZERS, ids=lambda c: c.__name__)
def test_bad_construction_and_inputs(regularizer_class):
    with pytest.raises(KdmlError):
        regularizer_class([])
    with pytest.raises(KdmlError):
        regularizer_class(GaussianMixtureKernel())  # needs a sequence
    regularizer = regularizer_class([GaussianMixtureKernel()])
    emb = torch.randn(6, 3)
    with pytest.raises(KdmlError, match="sequence"):
        regularizer(emb, torch.arange(6))  # bare tensor instead of [emb]
    with pytest.raises(KdmlError):
        regularizer([emb], torch.arange(5))  # label count mismatch
    with pytest.raises(KdmlError):
        IntraClassPenalty([GaussianMixtureKernel(), GaussianMixtureKernel()])


# ----------------------------------------------------------------- docstring examples


def test_docstring_example_with_pml_triplet_loss_runs():
    examples = doctest.DocTestFinder().find(
        JointRepresentationSimilarity, globs=vars(jrs_module).copy()
    )
    assert any("TripletMarginLoss" in ex.source for test in examples for ex in test.examples)
    runner = doctest.DocTestRunner()
    for test in examples:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


def test_all_docstring_examples_run():
    results = doctest.testmod(jrs_module)
    assert results.attempted > 0
    assert results.failed == 0


def test_jrs_compiles_to_one_graph_that_is_not_recompiled():
    """train.compile: JRS traces without a graph break and later calls reuse the graph.
    Compiled by inductor, torch.compile's default (test_trainer's whole step is not, for
    its time)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()  # reset() keeps them: another test's graphs counted
    jrs = JointRepresentationSimilarity([GaussianMixtureKernel(3), GaussianMixtureKernel(1)])
    compiled = torch.compile(jrs)
    generator = torch.Generator().manual_seed(0)
    labels = torch.arange(4).repeat_interleave(3)
    for _ in range(3):
        reps = [torch.randn(12, 8, generator=generator), torch.randn(12, 4, generator=generator)]
        assert compiled(reps, labels).item() == pytest.approx(jrs(reps, labels).item(), rel=1e-5)
    stats = torch._dynamo.utils.counters["stats"]
    assert stats["unique_graphs"] == 1
    torch._dynamo.reset()


@pytest.mark.parametrize("regularizer", [JointRepresentationSimilarity, JointMMD, JointIntra])
def test_regularizers_refuse_arrays_and_wrong_dtypes_in_one_line(regularizer):
    """A PML loop's labels are often NumPy; they used to raise AttributeError from deep inside."""
    import numpy as np

    reg = regularizer([GaussianMixtureKernel()])
    emb, labels = torch.randn(6, 3), torch.arange(6) % 2
    name = regularizer.__name__
    with pytest.raises(KdmlError, match=rf"^{name} takes torch tensors \(the batch's labels and "
                                        r"representations\), got ndarray; convert with "
                                        r"torch.as_tensor$"):
        reg([emb], labels.numpy())
    with pytest.raises(KdmlError, match=rf"^{name}: labels must be integers, got dtype "
                                        r"torch.float32$"):
        reg([emb], labels.float())
    with pytest.raises(KdmlError, match=rf"^{name}: representations must be floating point"):
        reg([emb.long()], labels)
    assert np.isfinite(float(reg([emb], labels)))


def test_intra_class_penalty_refuses_a_kernel_name():
    """A string is a sequence: its 8 letters used to be counted as 8 kernels."""
    with pytest.raises(KdmlError, match=r"^IntraClassPenalty takes a kernel module, not the name "
                                        r"'gaussian'; e.g. kdml.kernels.build_kernel"):
        IntraClassPenalty("gaussian")


@pytest.mark.parametrize("regularizer_class", [JointMMD, JointIntra], ids=lambda c: c.__name__)
@pytest.mark.parametrize("num_samples", [10, 11])
def test_one_float32_class_gives_zero_though_its_weights_do_not_sum_to_one(regularizer_class,
                                                                          num_samples):
    """A batch of one class gives 0 (the docstrings): C = sum_i 1/n_{y_i} is rounded to the
    count it holds, and 10 float32 weights of 1/10 sum to 1.0000001, not 1; without the
    rounding, 2 (C - 1) ||C_I||^2 gave -5.7e-8 (mutation audit)."""
    layers = [t.float().requires_grad_() for t in make_layers(num_samples, 2, seed=10)]
    value = regularizer_class([GaussianMixtureKernel(3), LaplaceKernel()])(
        layers, torch.zeros(num_samples, dtype=torch.long))
    assert value.item() == 0.0
