"""AM-Softmax, NT-Xent, the marginal Fisher criterion on tied distances and the kernel domain
MMD, against literal float64 loops written from their equations, on several shapes and edge
cases the other test files do not reach.

- AM-Softmax (JRD, Eq. 12) straight from the cosines: one sample, one class, classes without
  samples, large scales; its gradient against the hand-derived
  :math:`\\partial L / \\partial \\cos_{ic} = \\frac{s}{M} (p_{ic} - [c = y_i])`.
- NT-Xent (SimCLR; Atlas, Sec. 3.1): one image (two views), one dimension (cosines of +-1),
  identical views, rows of very different norms, small temperatures; its gradient against
  central differences of the loops.
- Marginal Fisher (DTML, Eq. 4-5) on integer points, where many distances tie exactly: the
  values do not depend on which tied neighbour is taken, so they must equal the loops'.
- DomainMMD with other kernels than Eq. 6's linear one and the Gaussian mixture: the biased
  MMD^2 with diagonals, one bandwidth over the joint batch [s; t].
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable

import pytest
import torch

from kdml.kernels import (
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    Kernel,
    LaplaceKernel,
    MomentGeneratingKernel,
    PolynomialKernel,
)
from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.losses.nt_xent import nt_xent_loss
from kdml.regularizers.domain import DomainMMD

Point = list[float]

# ----------------------------------------------------------------- AM-Softmax (Eq. 12)


def literal_am_softmax(
    cosines: list[list[float]], labels: list[int], scale: float, margin: float
) -> float:
    """-1/M sum_i log( e^{s (cos_iy - m)} / (e^{s (cos_iy - m)} + sum_{c != y} e^{s cos_ic}) )."""
    total = 0.0
    for row, y in zip(cosines, labels, strict=True):
        target = math.exp(scale * (row[y] - margin))
        others = sum(math.exp(scale * value) for c, value in enumerate(row) if c != y)
        total += -math.log(target / (target + others))
    return total / len(labels)


def literal_am_softmax_gradient(
    cosines: list[list[float]], labels: list[int], scale: float, margin: float
) -> list[list[float]]:
    """dL/dcos_ic = s / M (p_ic - [c = y_i]), p_i the softmax of s (cos_i - m e_{y_i})."""
    gradient = []
    for row, y in zip(cosines, labels, strict=True):
        logits = [scale * (value - (margin if c == y else 0.0)) for c, value in enumerate(row)]
        exps = [math.exp(v) for v in logits]
        total = sum(exps)
        gradient.append(
            [
                scale / len(labels) * (e / total - (1.0 if c == y else 0.0))
                for c, e in enumerate(exps)
            ]
        )
    return gradient


AM_CASES = [  # (M, C, labels or None for random)
    (1, 1, [0]),  # one class: the loss is -log 1 = 0
    (1, 4, [2]),
    (3, 2, [1, 1, 1]),  # class 0 has no sample
    (6, 5, None),
    (17, 9, None),
]


@pytest.mark.parametrize(("num_samples", "num_classes", "label_list"), AM_CASES)
@pytest.mark.parametrize(("scale", "margin"), [(20.0, 0.1), (1.0, 0.0), (64.0, 0.35), (30.0, 1.5)])
def test_am_softmax_on_cosines_matches_eq_12_and_its_gradient(
    num_samples, num_classes, label_list, scale, margin
):
    generator = torch.Generator().manual_seed(num_samples * 31 + num_classes)
    cosines = (
        2.0 * torch.rand(num_samples, num_classes, generator=generator, dtype=torch.float64) - 1.0
    )
    if label_list is None:
        labels = torch.randint(0, num_classes, (num_samples,), generator=generator)
    else:
        labels = torch.tensor(label_list)
    cosines.requires_grad_()
    loss = am_softmax_loss(cosines, labels, scale, margin)
    expected = literal_am_softmax(cosines.tolist(), labels.tolist(), scale, margin)
    assert loss.dtype == torch.float64
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-14)
    (gradient,) = torch.autograd.grad(loss, cosines)
    literal = torch.tensor(
        literal_am_softmax_gradient(cosines.tolist(), labels.tolist(), scale, margin),
        dtype=torch.float64,
    )
    assert torch.allclose(gradient, literal, rtol=1e-10, atol=1e-14)


def test_am_softmax_of_float32_cosines_is_computed_in_float32():
    generator = torch.Generator().manual_seed(1)
    cosines = 2.0 * torch.rand(8, 4, generator=generator) - 1.0
    labels = torch.tensor([0, 1, 2, 3, 3, 2, 1, 0])
    loss = am_softmax_loss(cosines, labels, 20.0, 0.1)
    assert loss.dtype == torch.float32
    expected = literal_am_softmax(cosines.double().tolist(), labels.tolist(), 20.0, 0.1)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


# ----------------------------------------------------------------- NT-Xent


def literal_nt_xent(projections: list[Point], tau: float) -> float:
    """1/(2N) sum_i -log( e^{s_i,p(i) / tau} / sum_{k != i} e^{s_ik / tau} ), s the cosine,
    rows i and i + N the two views of image i."""
    num = len(projections)
    norms = [math.sqrt(sum(v * v for v in z)) for z in projections]

    def cosine(a: int, b: int) -> float:
        dot = sum(x * y for x, y in zip(projections[a], projections[b], strict=True))
        return dot / (norms[a] * norms[b])

    total = 0.0
    for i in range(num):
        partner = i + num // 2 if i < num // 2 else i - num // 2
        denominator = sum(math.exp(cosine(i, k) / tau) for k in range(num) if k != i)
        total += -(cosine(i, partner) / tau - math.log(denominator))
    return total / num


def central_differences(
    function: Callable[[list[Point]], float], points: list[Point], relative_step: float = 1e-6
) -> list[Point]:
    """Differences with a step proportional to each row's norm (the cosine is scale-free)."""
    gradient = []
    for i, row in enumerate(points):
        step = relative_step * math.sqrt(sum(v * v for v in row))
        gradient_row = []
        for d in range(len(row)):
            values = []
            for sign in (1.0, -1.0):
                moved = [list(p) for p in points]
                moved[i][d] += sign * step
                values.append(function(moved))
            gradient_row.append((values[0] - values[1]) / (2.0 * step))
        gradient.append(gradient_row)
    return gradient


def nt_xent_batch(num_images: int, dim: int, case: str, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    views = torch.randn(2 * num_images, dim, generator=generator, dtype=torch.float64)
    if case == "identical-views":  # both views of every image the same vector
        views[num_images:] = views[:num_images]
    elif case == "scaled-rows":  # the cosine ignores the norms: 1e-3 .. 1e3
        exponents = torch.linspace(-3.0, 3.0, 2 * num_images, dtype=torch.float64)
        views = views * (10.0**exponents)[:, None]
    elif case == "duplicate-images":  # two images with the same views: tied negatives
        views[1 % num_images] = views[0]
        views[num_images + 1 % num_images] = views[num_images]
    return views


NT_CASES = [  # (N images, D, case)
    (1, 3, "random"),  # one image: the only other view is its positive, loss 0
    (2, 1, "random"),  # cosines +-1 only
    (3, 4, "identical-views"),
    (4, 2, "scaled-rows"),
    (5, 3, "duplicate-images"),
    (8, 6, "random"),
]


@pytest.mark.parametrize(("num_images", "dim", "case"), NT_CASES)
@pytest.mark.parametrize("tau", [0.05, 0.5, 2.0])
def test_nt_xent_matches_the_literal_sum_and_its_differences(num_images, dim, case, tau):
    projections = nt_xent_batch(num_images, dim, case, seed=num_images + dim)
    projections.requires_grad_()
    loss = nt_xent_loss(projections, tau)
    expected = literal_nt_xent(projections.tolist(), tau)
    assert loss.item() == pytest.approx(expected, rel=1e-12, abs=1e-13)
    if num_images == 1:
        assert expected == pytest.approx(0.0, abs=1e-15)
    (gradient,) = torch.autograd.grad(loss, projections)
    # a row of norm r moves the loss by ~1/r per unit: tolerances relative to that
    points = projections.tolist()
    literal = central_differences(lambda moved: literal_nt_xent(moved, tau), points)
    for row, got, norm in zip(
        literal, gradient.tolist(), projections.detach().norm(dim=1).tolist(), strict=True
    ):
        assert got == pytest.approx(row, rel=1e-6, abs=1e-7 / norm)


# ----------------------------------------------------------------- marginal Fisher on ties


def sq_dist(a: Point, b: Point) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))


def literal_fisher_terms(
    points: list[Point], labels: list[int], k1: int, k2: int
) -> tuple[float, float]:
    """S_c, S_b of Eq. 4-5: for each sample, its k1 nearest same-class others and k2 nearest
    other-class samples (all there are when fewer), d^2 summed over these pairs and divided
    by their number (N k1, N k2 for complete graphs). Which of equally distant candidates is
    taken does not change the sums."""
    sums, counts = [0.0, 0.0], [0, 0]
    for i, (p, y) in enumerate(zip(points, labels, strict=True)):
        same = sorted(sq_dist(p, q) for j, q in enumerate(points) if j != i and labels[j] == y)
        other = sorted(sq_dist(p, q) for j, q in enumerate(points) if labels[j] != y)
        for slot, (distances, k) in enumerate(((same, k1), (other, k2))):
            sums[slot] += sum(distances[:k])
            counts[slot] += len(distances[:k])
    return (sums[0] / counts[0] if counts[0] else 0.0, sums[1] / counts[1] if counts[1] else 0.0)


def integer_batch(num: int, dim: int, num_classes: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    points = torch.randint(-2, 3, (num, dim), generator=generator).double()
    labels = torch.randint(0, num_classes, (num,), generator=generator) * 5 + 2
    return points, labels


FISHER_CASES = [  # (N, D, classes, k1, k2)
    (6, 1, 2, 1, 1),
    (9, 1, 3, 2, 4),
    (12, 2, 3, 1, 3),
    (15, 2, 4, 5, 10),  # k beyond some classes: all their neighbours
    (16, 3, 2, 3, 20),
    (7, 2, 7, 1, 2),  # every class a singleton: no same-class pair
]


@pytest.mark.parametrize(("num", "dim", "num_classes", "k1", "k2"), FISHER_CASES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marginal_fisher_on_exactly_tied_distances_matches_the_loops(
    num, dim, num_classes, k1, k2, seed
):
    points, labels = integer_batch(num, dim, num_classes, seed)
    loss = MarginalFisherLoss(k1=k1, k2=k2, alpha=0.3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # small classes take all their neighbours
        s_c, s_b = loss.terms(points, labels)
        graph_p, graph_q = loss.graphs(points, labels)
    ref_c, ref_b = literal_fisher_terms(points.tolist(), labels.tolist(), k1, k2)
    assert s_c.item() == pytest.approx(ref_c, rel=1e-12, abs=1e-15)
    assert s_b.item() == pytest.approx(ref_b, rel=1e-12, abs=1e-15)
    # each row's picks are a valid neighbour set: as many as k (or all candidates), and none
    # farther (exactly) than a candidate left out
    rows, label_list = points.tolist(), labels.tolist()
    for i in range(num):
        for graph, k, same in ((graph_p, k1, True), (graph_q, k2, False)):
            candidates = [
                j for j in range(num) if j != i and (label_list[j] == label_list[i]) == same
            ]
            picked = torch.nonzero(graph[i]).flatten().tolist()
            assert set(picked) <= set(candidates)
            assert len(picked) == min(k, len(candidates))
            left_out = [sq_dist(rows[i], rows[j]) for j in candidates if j not in picked]
            if picked and left_out:
                assert max(sq_dist(rows[i], rows[j]) for j in picked) <= min(left_out)


def test_ties_of_equal_computed_distances_go_to_the_lower_index():
    """The documented rule is on the computed distances: copies of a point are tied exactly
    and the lower index wins. Distances equal only in exact arithmetic (x = [-2, 0, 2]: point
    1 is at 4 from both) can differ in the last bit of squared_distances' expansion, so the
    docstring promises nothing for them."""
    points = torch.tensor([[3.0], [1.0], [1.0], [1.0], [0.25]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graph_p, _ = MarginalFisherLoss(k1=1, k2=1).graphs(points, torch.zeros(5, dtype=torch.long))
    picked = [torch.nonzero(row).flatten().tolist() for row in graph_p]
    assert picked == [[1], [2], [1], [1], [1]]


# ----------------------------------------------------------------- domain MMD, other kernels


def l1_dist(a: Point, b: Point) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def mean_off_diagonal(points: list[Point], dist: Callable[[Point, Point], float]) -> float:
    values = [dist(p, q) for i, p in enumerate(points) for j, q in enumerate(points) if i != j]
    return sum(values) / len(values)


def literal_kernel(name: str, joint: list[Point]) -> Callable[[Point, Point], float]:
    """The pair kernel, its adaptive bandwidth (if any) from the joint batch [s; t]."""
    if name == "laplace":
        sigma = mean_off_diagonal(joint, l1_dist)
        return lambda a, b: math.exp(-l1_dist(a, b) / sigma)
    if name == "gaussian-1":
        tau = mean_off_diagonal(joint, sq_dist)
        return lambda a, b: math.exp(-sq_dist(a, b) / tau)
    if name == "gaussian-fixed":
        return lambda a, b: sum(math.exp(-sq_dist(a, b) / (0.7 * 3.0**e)) for e in (-1, 0, 1)) / 3
    if name == "imq":
        return lambda a, b: 0.75 / (0.75 + sq_dist(a, b))
    if name == "polynomial":
        return lambda a, b: (sum(x * y for x, y in zip(a, b, strict=True)) + 1.0) ** 2
    return lambda a, b: math.exp(sum(x * y for x, y in zip(a, b, strict=True)))  # mgf


KDML_KERNELS: dict[str, Callable[[], Kernel]] = {
    "laplace": LaplaceKernel,
    "gaussian-1": lambda: GaussianMixtureKernel(1),
    "gaussian-fixed": lambda: GaussianMixtureKernel(3, multiplier=3.0, bandwidth=0.7),
    "imq": lambda: InverseMultiquadricKernel(0.75),
    "polynomial": lambda: PolynomialKernel(2, 1.0),
    "mgf": MomentGeneratingKernel,
}


def literal_biased_mmd(source: list[Point], target: list[Point], name: str) -> float:
    """1/Ns^2 sum k(s, s') + 1/Nt^2 sum k(t, t') - 2/(Ns Nt) sum k(s, t), diagonals included."""
    k = literal_kernel(name, source + target)

    def mean_k(xs: list[Point], ys: list[Point]) -> float:
        return sum(k(a, b) for a in xs for b in ys) / (len(xs) * len(ys))

    return mean_k(source, source) + mean_k(target, target) - 2.0 * mean_k(source, target)


@pytest.mark.parametrize("name", list(KDML_KERNELS))
@pytest.mark.parametrize(
    ("num_source", "num_target", "dim"), [(1, 1, 2), (1, 4, 3), (5, 2, 1), (6, 6, 4)]
)
def test_domain_mmd_with_a_kernel_is_the_biased_mmd_of_the_joint_batch(
    name, num_source, num_target, dim
):
    generator = torch.Generator().manual_seed(num_source * 10 + num_target)
    source = 0.6 * torch.randn(num_source, dim, generator=generator, dtype=torch.float64)
    target = 0.6 * torch.randn(num_target, dim, generator=generator, dtype=torch.float64) + 0.4
    got = DomainMMD(KDML_KERNELS[name]())(source, target)
    expected = literal_biased_mmd(source.tolist(), target.tolist(), name)
    assert got.item() == pytest.approx(expected, rel=1e-10, abs=1e-13)
    assert got.item() >= -1e-12  # a squared RKHS norm
