"""Tests written by a mutation audit of the kernels, the regularizers and the losses (session
88): each kills a changed line that the other tests let through, by checking against a literal
float64 implementation or an exact property of the equation.

- A self-adaptive or fixed Gaussian / Laplace kernel of one batch is exactly 1 on its diagonal,
  also for points far from the origin, where the matmul of the ``|a|^2 + |b|^2 - 2 a.b``
  expansion leaves a round-off on the diagonal that a narrow kernel turns into a visible value.
- NT-Xent leaves each projection out of its own denominator (-inf, not a large finite logit),
  and refuses an odd number of projections (no [view 1; view 2] layout) in one line.
- L1 and squared distances of a float32 and a float64 set are float64, as documented.
- DTML at beta = 0 reports D_ts without building its graph.
- A learned (tensor) AM-Softmax scale and margin and a learned NT-Xent temperature get the
  gradient of their equations.
"""

from __future__ import annotations

import math

import pytest
import torch

from kdml.errors import KdmlError
from kdml.kernels import GaussianMixtureKernel, LaplaceKernel, l1_distances, squared_distances
from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.dtml_objective import DTMLObjective
from kdml.losses.nt_xent import nt_xent_loss
from kdml.regularizers.domain import DomainMMD


@pytest.mark.parametrize(
    "kernel",
    [GaussianMixtureKernel(3), GaussianMixtureKernel(1, bandwidth=1e-3), LaplaceKernel()],
    ids=repr,
)
def test_a_kernel_of_one_batch_is_exactly_one_on_its_diagonal(kernel: torch.nn.Module) -> None:
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(40, 64, generator=generator) * 10 + 3  # far from the origin
    matrix = kernel(points)
    assert torch.equal(matrix.diagonal(), torch.ones(40))


@pytest.mark.parametrize("temperature", [1.0, 1e-3, 1e-6])
def test_nt_xent_leaves_each_projection_itself_out_of_its_denominator_whatever_the_logits(
        temperature: float) -> None:
    # one image, two opposite views: the other view is the only k != i, so each term is
    # -log(e^{s/tau} / e^{s/tau}) = 0 for any temperature; a finite stand-in for the
    # masked self-similarity (-1e4 instead of -inf) outweighs -1/tau once tau < 1e-4
    views = torch.tensor([[1.0, 0.0], [-1.0, 0.0]], dtype=torch.float64)
    assert nt_xent_loss(views, temperature).item() == 0.0


@pytest.mark.parametrize("distances", [l1_distances, squared_distances])
@pytest.mark.parametrize("wide_first", [False, True])
def test_distances_of_a_float32_and_a_float64_set_are_computed_in_float64(
        distances: object, wide_first: bool) -> None:
    generator = torch.Generator().manual_seed(1)
    narrow = torch.randn(5, 3, generator=generator)
    wide = torch.randn(4, 3, generator=generator, dtype=torch.float64) + 1e-9  # off float32
    x, y = (wide, narrow) if wide_first else (narrow, wide)
    expected = [[sum((abs(a - b) if distances is l1_distances else (a - b) ** 2)
                     for a, b in zip(row, col, strict=True))
                 for col in y.tolist()] for row in x.tolist()]
    result = distances(x, y)  # type: ignore[operator]
    assert result.dtype == torch.float64
    assert torch.allclose(result, torch.tensor(expected, dtype=torch.float64), rtol=1e-12,
                          atol=1e-12)


class _RecordingMMD(DomainMMD):
    """Eq. 6's DomainMMD that records whether autograd was recording at each call."""

    def __init__(self) -> None:
        super().__init__()
        self.grad_enabled: list[bool] = []

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.grad_enabled.append(torch.is_grad_enabled())
        return super().forward(source, target)


@pytest.mark.parametrize(("beta", "recorded"), [(0.0, False), (10.0, True)])
def test_dtml_reports_d_ts_at_beta_0_without_a_graph(beta: float, recorded: bool) -> None:
    # the DDML baseline (beta = 0) reports D_ts computed under no_grad, "no graph, no cost in
    # the backward pass"; at beta > 0 it is part of the objective
    generator = torch.Generator().manual_seed(2)
    source = torch.randn(6, 3, generator=generator, requires_grad=True)
    target = torch.randn(5, 3, generator=generator, requires_grad=True)
    mmd = _RecordingMMD()
    out = DTMLObjective(beta=beta, gamma=0.0, k1=1, k2=2, mmd=mmd)(
        [source], torch.tensor([0, 0, 1, 1, 2, 2]), [target])
    assert mmd.grad_enabled == [recorded]
    assert torch.equal(out.terms["d_ts"], (target.mean(0) - source.mean(0)).pow(2).sum().detach())


def test_a_learned_am_softmax_scale_and_margin_get_the_gradient_of_eq_12() -> None:
    # with l_ic = s (cos_ic - m [c = y_i]) and p_i = softmax(l_i): dL/ds = 1/M sum_i sum_c
    # (p_ic - [c = y_i]) (cos_ic - m [c = y_i]) and dL/dm = 1/M sum_i s (1 - p_iy)
    generator = torch.Generator().manual_seed(3)
    cosines = torch.rand(5, 4, generator=generator, dtype=torch.float64) * 2 - 1
    labels = torch.tensor([0, 3, 1, 1, 2])
    scale = torch.tensor(7.0, dtype=torch.float64, requires_grad=True)
    margin = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    am_softmax_loss(cosines, labels, scale, margin).backward()
    d_scale = d_margin = 0.0
    for row, y in zip(cosines.tolist(), labels.tolist(), strict=True):
        shifted = [value - (0.3 if c == y else 0.0) for c, value in enumerate(row)]
        exps = [math.exp(7.0 * value) for value in shifted]
        probs = [e / sum(exps) for e in exps]
        d_scale += sum((p - (c == y)) * z
                       for c, (p, z) in enumerate(zip(probs, shifted, strict=True)))
        d_margin += 7.0 * (1.0 - probs[y])
    assert scale.grad is not None and margin.grad is not None
    assert scale.grad.item() == pytest.approx(d_scale / 5, rel=1e-12)
    assert margin.grad.item() == pytest.approx(d_margin / 5, rel=1e-12)


def test_a_learned_nt_xent_temperature_gets_the_gradient_of_the_loss() -> None:
    # l_ik = s_ik / tau (k != i), p_i = softmax over k != i: dL/dtau = 1/2N sum_i sum_{k != i}
    # (p_ik - [k = p(i)]) (-s_ik / tau^2)
    generator = torch.Generator().manual_seed(4)
    views = torch.randn(6, 3, generator=generator, dtype=torch.float64)
    temperature = torch.tensor(0.4, dtype=torch.float64, requires_grad=True)
    nt_xent_loss(views, temperature).backward()
    unit = torch.nn.functional.normalize(views, dim=1).tolist()
    expected = 0.0
    for i in range(6):
        others = [k for k in range(6) if k != i]
        sims = {k: sum(a * b for a, b in zip(unit[i], unit[k], strict=True)) for k in others}
        total = sum(math.exp(sims[k] / 0.4) for k in others)
        expected += sum((math.exp(sims[k] / 0.4) / total - (k == (i + 3) % 6))
                        * (-sims[k] / 0.4**2) for k in others)
    assert temperature.grad is not None
    assert temperature.grad.item() == pytest.approx(expected / 6, rel=1e-10)


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_nt_xent_refuses_an_odd_number_of_projections(rows: int) -> None:
    # 2N + 1 rows have no [view 1; view 2] layout: rolled by N, the "other view" of each row
    # would be another image's, a silently wrong loss
    with pytest.raises(KdmlError, match=r"\[2N, D\] projections"):
        nt_xent_loss(torch.randn(rows, 4, generator=torch.Generator().manual_seed(rows)), 0.5)
