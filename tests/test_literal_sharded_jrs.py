"""The sharded JRS (``train.sharded_kernels=true``) over several ranks, against literal float64
loops of JRD's Eq. 10 / 11 on the global batch.

The ranks run as threads of this process, joined by in-memory collectives in place of
torch.distributed's (``gather`` concatenates every rank's rows in rank order,
``all_reduce_sum`` adds every rank's tensor, ``world`` names the thread's rank), so each rank
computes only its own rows of the kernel matrices, as under ``torchrun``. The reference loops
over the global batch's inter-class pairs and evaluates every kernel with ``math``; its
gradient is a central finite difference with the adaptive bandwidths held at their value (the
kernels detach them). Each rank's gradient must be the world size times the true gradient of
its rows (DistributedDataParallel averages it back), and every rank must return the value.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import pytest
import torch

from kdml import distributed
from kdml.kernels import (
    GaussianMixtureKernel,
    InverseMultiquadricKernel,
    Kernel,
    LaplaceKernel,
    PolynomialKernel,
)
from kdml.regularizers.sharded import sharded_jrs

Point = list[float]
PairKernel = Callable[[Point, Point], float]

# ----------------------------------------------------------------- literal references


def sq_dist(a: Point, b: Point) -> float:
    return sum((x - y) ** 2 for x, y in zip(a, b, strict=True))


def l1_dist(a: Point, b: Point) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


def mean_off_diagonal(points: list[Point], dist: Callable[[Point, Point], float]) -> float:
    """The self-adaptive bandwidth: mean distance over ordered pairs i != j of the batch."""
    values = [dist(p, q) for i, p in enumerate(points) for j, q in enumerate(points) if i != j]
    return sum(values) / len(values)


def gaussian_builder(num_kernels: int, bandwidth: float | None = None):
    """k(a, b) = 1/K sum_i exp(-|a - b|^2 / (tau 2^(i - K//2))), tau adaptive or fixed."""

    def build(points: list[Point]) -> PairKernel:
        tau = mean_off_diagonal(points, sq_dist) if bandwidth is None else bandwidth
        sigma2s = [tau * 2.0 ** (i - num_kernels // 2) for i in range(num_kernels)]
        return lambda a, b: sum(math.exp(-sq_dist(a, b) / s2) for s2 in sigma2s) / num_kernels

    return build


def laplace_builder(points: list[Point]) -> PairKernel:
    sigma = mean_off_diagonal(points, l1_dist)
    return lambda a, b: math.exp(-l1_dist(a, b) / sigma)


def polynomial_builder(points: list[Point]) -> PairKernel:
    return lambda a, b: (sum(x * y for x, y in zip(a, b, strict=True)) + 1.0) ** 2


def imq_builder(points: list[Point]) -> PairKernel:
    return lambda a, b: 0.5 / (0.5 + sq_dist(a, b))


def literal_jrs(layers: list[list[Point]], labels: list[int], kernels: list[PairKernel]) -> float:
    """Eq. 10 / N_pairs: mean over ordered pairs (i, j), y_i != y_j, of prod_l k^l."""
    total, pairs = 0.0, 0
    for i in range(len(labels)):
        for j in range(len(labels)):
            if labels[i] == labels[j]:
                continue
            value = 1.0
            for kernel, points in zip(kernels, layers, strict=True):
                value *= kernel(points[i], points[j])
            total += value
            pairs += 1
    return total / pairs if pairs else 0.0


def literal_gradient(
    layers: list[list[Point]], labels: list[int], builders: list, step: float = 1e-5
) -> list[list[Point]]:
    """Central differences of literal_jrs, the kernels (their bandwidths) built once on the
    unperturbed batch: the bandwidth is a constant of the batch, as in kdml."""
    kernels = [build(points) for build, points in zip(builders, layers, strict=True)]
    gradient = []
    for layer, points in enumerate(layers):
        layer_grad = []
        for i in range(len(points)):
            row = []
            for d in range(len(points[i])):
                values = []
                for sign in (1.0, -1.0):
                    moved = [list(p) for p in points]
                    moved[i][d] += sign * step
                    shifted = [moved if m == layer else other for m, other in enumerate(layers)]
                    values.append(literal_jrs(shifted, labels, kernels))
                row.append((values[0] - values[1]) / (2.0 * step))
            layer_grad.append(row)
        gradient.append(layer_grad)
    return gradient


# ----------------------------------------------------------------- in-process ranks


class ThreadRanks:
    """``size`` ranks as threads, with the three collectives sharded_jrs uses."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=30)
        self.slots: dict[int, torch.Tensor] = {}
        self.local = threading.local()

    def rank(self) -> int:
        return self.local.rank

    def exchange(self, value: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``value``, in rank order."""
        self.slots[self.rank()] = value
        self.barrier.wait()
        values = [self.slots[rank] for rank in range(self.size)]
        self.barrier.wait()  # everyone has read before the next exchange writes
        return values

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        assert not x.requires_grad  # sharded_jrs gathers detached rows and labels only
        return torch.cat(self.exchange(x))

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = self.exchange(tensor.detach().clone())
        total = parts[0].clone()
        for part in parts[1:]:
            total = total + part
        return total

    def world(self) -> distributed.World:
        return distributed.World(self.rank(), self.size, self.rank())

    def run(self, work: Callable[[int], object]) -> list[object]:
        results: list[object] = [None] * self.size
        errors: list[BaseException] = []

        def target(rank: int) -> None:
            self.local.rank = rank
            try:
                results[rank] = work(rank)
            except BaseException as error:  # re-raised in the main thread
                errors.append(error)
                self.barrier.abort()

        threads = [threading.Thread(target=target, args=(rank,)) for rank in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        return results


def sharded_over_ranks(
    monkeypatch: pytest.MonkeyPatch,
    kernels: list[Kernel],
    layers: list[torch.Tensor],
    labels: torch.Tensor,
    size: int,
) -> list[object]:
    """(value, gradients of each layer's local rows) returned by each of ``size`` ranks."""
    ranks = ThreadRanks(size)
    monkeypatch.setattr(distributed, "gather", ranks.gather)
    monkeypatch.setattr(distributed, "all_reduce_sum", ranks.all_reduce_sum)
    monkeypatch.setattr(distributed, "world", ranks.world)
    rows = len(labels) // size

    def work(rank: int) -> tuple[float, list[torch.Tensor]]:
        part = slice(rank * rows, (rank + 1) * rows)
        local = [layer[part].detach().clone().requires_grad_() for layer in layers]
        value = sharded_jrs(kernels, local, labels[part])
        return value.item(), list(torch.autograd.grad(value, local))

    return ranks.run(work)


# ----------------------------------------------------------------- cases

KERNEL_SETS = {
    "jrd-gaussians": (
        lambda: [GaussianMixtureKernel(3), GaussianMixtureKernel(1)],
        [gaussian_builder(3), gaussian_builder(1)],
    ),
    "laplace-and-fixed-gaussian": (
        lambda: [LaplaceKernel(), GaussianMixtureKernel(2, bandwidth=1.5)],
        [laplace_builder, gaussian_builder(2, bandwidth=1.5)],
    ),
    "polynomial-and-imq": (
        lambda: [PolynomialKernel(2, 1.0), InverseMultiquadricKernel(0.5)],
        [polynomial_builder, imq_builder],
    ),
    # JRD's three layers (pooling, embedding, class level): every layer's kernel enters the product
    "jrd-three-layers": (
        lambda: [GaussianMixtureKernel(3), GaussianMixtureKernel(3), GaussianMixtureKernel(1)],
        [gaussian_builder(3), gaussian_builder(3), gaussian_builder(1)],
    ),
}

# (world size, labels): unbalanced classes split across ranks, a rank holding one class only,
# non-contiguous label values, a singleton class
LABEL_CASES = {
    "2-ranks": (2, [3, 3, 8, 1, 8, 8, 3, 1]),
    "3-ranks": (3, [5, 5, 9, 9, 2, 5]),
    "4-ranks-singleton": (4, [0, 0, 7, 7, 7, 7, 4, 0]),
}


def random_layers(num_points: int, dims: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(num_points, d, generator=generator, dtype=torch.float64) for d in dims]


@pytest.mark.parametrize("kernel_set", list(KERNEL_SETS))
@pytest.mark.parametrize("case", list(LABEL_CASES))
def test_every_rank_gets_the_literal_jrs_and_world_size_times_its_rows_gradient(
    monkeypatch, kernel_set, case
):
    size, label_list = LABEL_CASES[case]
    make_kernels, builders = KERNEL_SETS[kernel_set]
    layers = random_layers(len(label_list), (3, 2, 4)[: len(builders)], seed=size)
    labels = torch.tensor(label_list)
    results = sharded_over_ranks(monkeypatch, make_kernels(), layers, labels, size)

    points = [layer.tolist() for layer in layers]
    kernels = [build(p) for build, p in zip(builders, points, strict=True)]
    expected = literal_jrs(points, label_list, kernels)
    expected_grad = literal_gradient(points, label_list, builders)
    rows = len(label_list) // size
    for rank, (value, grads) in enumerate(results):
        assert value == pytest.approx(expected, rel=1e-12), rank
        for layer, grad in enumerate(grads):
            literal = torch.tensor(
                expected_grad[layer][rank * rows : (rank + 1) * rows], dtype=torch.float64
            )
            assert torch.allclose(grad / size, literal, rtol=1e-6, atol=1e-9), (rank, layer)


def test_one_class_over_all_ranks_gives_zero_and_a_zero_gradient(monkeypatch):
    """No inter-class pair anywhere: JRS is 0 (Eq. 10 is an empty sum), on every rank."""
    layers = random_layers(6, (2,), seed=9)
    results = sharded_over_ranks(
        monkeypatch, [GaussianMixtureKernel(3)], layers, torch.full((6,), 4), size=3
    )
    for value, grads in results:
        assert value == 0.0
        assert torch.equal(grads[0], torch.zeros(2, 2, dtype=torch.float64))


def test_the_adaptive_bandwidth_is_the_global_batch_s_not_the_rank_s(monkeypatch):
    """A rank whose own rows are tight, next to a spread-out rank: a bandwidth of the local
    rows only (or of the local block) would give another value than the global loops."""
    generator = torch.Generator().manual_seed(4)
    tight = 0.01 * torch.randn(4, 3, generator=generator, dtype=torch.float64)
    spread = 5.0 * torch.randn(4, 3, generator=generator, dtype=torch.float64)
    layers = [torch.cat([tight, spread])]
    label_list = [0, 1, 0, 1, 0, 1, 2, 2]
    results = sharded_over_ranks(
        monkeypatch, [GaussianMixtureKernel(3)], layers, torch.tensor(label_list), size=2
    )
    points = [layers[0].tolist()]
    expected = literal_jrs(points, label_list, [gaussian_builder(3)(points[0])])
    assert expected > 1e-3  # the global bandwidth keeps the kernels far from 0
    for value, _ in results:
        assert value == pytest.approx(expected, rel=1e-12)


def test_no_rank_makes_a_matrix_of_the_whole_batch(monkeypatch):
    """The mode's point: O(mM) memory per rank. Counting the inter-class pairs by comparing
    the gathered labels with themselves had made one [M, M] matrix on every rank."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Shapes(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.shapes: set[tuple[int, ...]] = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for tensor in out if isinstance(out, tuple | list) else [out]:
                if isinstance(tensor, torch.Tensor):
                    self.shapes.add(tuple(tensor.shape))
            return out

    size, rows = 2, 6
    ranks = ThreadRanks(size)
    monkeypatch.setattr(distributed, "gather", ranks.gather)
    monkeypatch.setattr(distributed, "all_reduce_sum", ranks.all_reduce_sum)
    monkeypatch.setattr(distributed, "world", ranks.world)
    layers = random_layers(size * rows, (3, 2), seed=5)
    labels = torch.arange(size * rows) % 4

    def work(rank: int) -> set[tuple[int, ...]]:
        part = slice(rank * rows, (rank + 1) * rows)
        local = [layer[part].detach().clone().requires_grad_() for layer in layers]
        with Shapes() as recorded:
            value = sharded_jrs([GaussianMixtureKernel(3), LaplaceKernel()], local, labels[part])
            torch.autograd.grad(value, local)
        return recorded.shapes

    for shapes in ranks.run(work):
        assert (rows, size * rows) in shapes  # the rank's own rows of the kernel matrices
        assert (size * rows, size * rows) not in shapes


@pytest.mark.parametrize("kernel", [LaplaceKernel, GaussianMixtureKernel])
def test_a_batch_collapsed_to_rounding_gets_the_floor_of_its_own_kernel(kernel):
    """The resolution floor of the bandwidth is of distances for the Laplace kernel and of
    squared distances for the Gaussian: sharded JRS had passed every test with the squared
    floor for both (0.396 where JRS gives 0.997 on this batch)."""
    from kdml.regularizers import JointRepresentationSimilarity

    noise = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    x = torch.ones(8, 4) + 1e-6 * noise
    y = torch.arange(4).repeat_interleave(2)
    expected = JointRepresentationSimilarity([kernel()])([x], y)
    assert sharded_jrs([kernel()], [x], y).item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("num_kernels", [2, 4])
def test_even_adaptive_mixtures_get_the_literal_jrs_and_gradient(monkeypatch, num_kernels):
    """An even K has bandwidths tau 2^(i - K//2) that are not symmetric about tau (K = 2: 0.5 tau
    and tau): a sharded kernel dividing tau by each scale instead matched only odd K."""
    label_list = [3, 3, 8, 1, 8, 8, 3, 1]
    layers = random_layers(len(label_list), (3,), seed=11)
    results = sharded_over_ranks(monkeypatch, [GaussianMixtureKernel(num_kernels)], layers,
                                 torch.tensor(label_list), size=2)
    points = [layers[0].tolist()]
    builders = [gaussian_builder(num_kernels)]
    expected = literal_jrs(points, label_list, [builders[0](points[0])])
    expected_grad = literal_gradient(points, label_list, builders)
    for rank, (value, grads) in enumerate(results):
        assert value == pytest.approx(expected, rel=1e-12), rank
        literal = torch.tensor(expected_grad[0][rank * 4 : (rank + 1) * 4], dtype=torch.float64)
        assert torch.allclose(grads[0] / 2, literal, rtol=1e-6, atol=1e-9), rank


def test_kernels_given_as_a_generator_are_taken_as_jrs_takes_them():
    """Any iterable of kernels, as JointRepresentationSimilarity takes: a generator had been used
    up by the kernel check and then failed len() with a raw TypeError."""
    from kdml.regularizers import JointRepresentationSimilarity

    layers = random_layers(8, (3, 2), seed=7)
    labels = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])
    expected = JointRepresentationSimilarity(
        [GaussianMixtureKernel(3), LaplaceKernel()])(layers, labels)
    value = sharded_jrs((kernel for kernel in [GaussianMixtureKernel(3), LaplaceKernel()]),
                        layers, labels)
    assert value.item() == pytest.approx(expected.item(), rel=1e-12)
