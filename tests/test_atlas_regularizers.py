"""The Atlas regularizers against literal float64 loops of Eq. 5 (Prop. 1) and of l_J.

The references loop over charts, point pairs and prior samples, evaluate the inverse
multiquadric kernel with plain floats and apply the logit to the prior sample by hand. The
last section checks what the Atlas API takes: bad input gets one line, not torch's error.
"""

from __future__ import annotations

import doctest
import math
import re

import numpy as np
import pytest
import torch
from torch.autograd import gradcheck

from kdml.atlas import ChartOutputs, chart_distances, compressed_code, manifold_distance
from kdml.errors import KdmlError
from kdml.regularizers import manifold as manifold_module
from kdml.regularizers.manifold import ChartMembershipLoss, ManifoldMMD

EPS = 1e-6  # ManifoldMMD's default clamp of the prior sample


def literal_k0(a, b, dim) -> float:
    """Inverse multiquadric with C = d / 6 on (pre-sigmoid) points."""
    scale = dim / 6
    return scale / (scale + sum((x - y) ** 2 for x, y in zip(a, b, strict=True)))


def literal_logit(w: float, eps: float = EPS) -> float:
    w = min(max(w, eps), 1.0 - eps)
    return math.log(w / (1.0 - w))


def literal_eq5(coords, q, prior, eps: float = EPS) -> float:
    """Eq. 5 with N points, M prior samples (M = N in the paper), n charts; the prior's
    samples clamped to [eps, 1 - eps] before their logit."""
    num_points, n_charts, dim = len(coords), len(coords[0]), len(coords[0][0])
    pulled_back = [[literal_logit(v, eps) for v in w] for w in prior]
    num_prior = len(pulled_back)
    data = 0.0
    for j in range(num_points):
        for k in range(num_points):
            if j == k:
                continue
            for i in range(n_charts):
                data += q[j][i] * q[k][i] * literal_k0(coords[j][i], coords[k][i], dim)
    cross = 0.0
    for j in range(num_points):
        for k in range(num_prior):
            for i in range(n_charts):
                cross += q[j][i] * literal_k0(coords[j][i], pulled_back[k], dim)
    prior_pairs = 0.0
    for j in range(num_prior):
        for k in range(num_prior):
            if j != k:
                prior_pairs += literal_k0(pulled_back[j], pulled_back[k], dim)
    return (data / (num_points * (num_points - 1))
            - 2.0 * cross / (n_charts * num_points * num_prior)
            + prior_pairs / (n_charts * num_prior * (num_prior - 1)))


def literal_euclidean_mmd(embeddings, prior) -> float:
    """Sec. 3.2.2: the n = 1 estimator on plain embeddings f(x_j)."""
    dim, num_points = len(embeddings[0]), len(embeddings)
    pulled_back = [[literal_logit(v) for v in w] for w in prior]
    data = sum(literal_k0(embeddings[j], embeddings[k], dim)
               for j in range(num_points) for k in range(num_points) if j != k)
    cross = sum(literal_k0(x, w, dim) for x in embeddings for w in pulled_back)
    prior_pairs = sum(literal_k0(pulled_back[j], pulled_back[k], dim)
                      for j in range(len(prior)) for k in range(len(prior)) if j != k)
    return (data / (num_points * (num_points - 1)) - 2.0 * cross / (num_points * len(prior))
            + prior_pairs / (len(prior) * (len(prior) - 1)))


def make_batch(num_points, n_charts, dim, seed, memberships="random"):
    gen = torch.Generator().manual_seed(seed)
    coords = 1.5 * torch.randn(num_points, n_charts, dim, generator=gen, dtype=torch.float64)
    if memberships == "random":
        q = torch.softmax(torch.randn(num_points, n_charts, generator=gen, dtype=torch.float64), 1)
    elif memberships == "one-chart":  # chart 0 takes every point
        q = torch.zeros(num_points, n_charts, dtype=torch.float64)
        q[:, 0] = 1.0
    elif memberships == "empty-chart":  # the last chart holds no mass at all
        q = torch.softmax(torch.randn(num_points, n_charts, generator=gen, dtype=torch.float64), 1)
        q[:, -1] = 0.0
        q = q / q.sum(dim=1, keepdim=True)
    prior = torch.rand(num_points, dim, generator=gen, dtype=torch.float64)
    return coords, q, prior


# ----------------------------------------------------------------- Eq. 5


SHAPES = [(2, 1, 1), (2, 3, 2), (5, 4, 3), (7, 2, 6), (6, 1, 4)]  # (N, n, d)
EQ5_CASES = [(*shape, memberships) for shape in SHAPES
             for memberships in ("random", "one-chart", "empty-chart")
             if not (memberships == "empty-chart" and shape[1] == 1)]  # one chart is never empty


@pytest.mark.parametrize(("num_points", "n_charts", "dim", "memberships"), EQ5_CASES)
def test_manifold_mmd_matches_eq_5(num_points, n_charts, dim, memberships):
    coords, q, prior = make_batch(num_points, n_charts, dim, seed=num_points + n_charts,
                                  memberships=memberships)
    got = ManifoldMMD(dim, n_charts)(coords, q, prior_sample=prior)
    expected = literal_eq5(coords.tolist(), q.tolist(), prior.tolist())
    assert got.item() == pytest.approx(expected, rel=1e-10, abs=1e-12)


def test_prior_sample_of_another_size_and_with_edge_values():
    coords, q, _ = make_batch(4, 3, 2, seed=1)
    prior = torch.tensor([[0.0, 1.0], [0.5, 0.25], [1.0, 0.9], [0.3, 0.0], [0.7, 0.6],
                          [0.1, 0.2]], dtype=torch.float64)  # M = 6, exact 0 and 1 are clamped
    got = ManifoldMMD(2, 3)(coords, q, prior_sample=prior)
    assert got.item() == pytest.approx(
        literal_eq5(coords.tolist(), q.tolist(), prior.tolist()), rel=1e-10)


def test_one_chart_is_the_euclidean_mmd_of_sec_3_2_2():
    gen = torch.Generator().manual_seed(3)
    embeddings = torch.randn(6, 4, generator=gen, dtype=torch.float64)
    prior = torch.rand(6, 4, generator=gen, dtype=torch.float64)
    mmd = ManifoldMMD(dim=4, n_charts=1)
    plain = mmd(embeddings, prior_sample=prior)  # [N, d], q = 1
    as_atlas = mmd(embeddings[:, None, :], torch.ones(6, 1, dtype=torch.float64), prior)
    expected = literal_euclidean_mmd(embeddings.tolist(), prior.tolist())
    assert plain.item() == pytest.approx(expected, rel=1e-10)
    assert as_atlas.item() == pytest.approx(expected, rel=1e-10)


def test_prior_is_drawn_from_the_generator():
    coords, q, _ = make_batch(5, 3, 2, seed=4)
    values = [ManifoldMMD(2, 3, generator=torch.Generator().manual_seed(7))(coords, q).item()
              for _ in range(2)]
    assert values[0] == values[1]
    other = ManifoldMMD(2, 3, generator=torch.Generator().manual_seed(8))(coords, q).item()
    assert other != values[0]
    drawn = torch.rand(5, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    assert values[0] == pytest.approx(literal_eq5(coords.tolist(), q.tolist(), drawn.tolist()),
                                      rel=1e-10)
    # without a generator: torch's global generator, repeatable with torch.manual_seed
    mmd = ManifoldMMD(2, 3)
    torch.manual_seed(11)
    first = mmd(coords, q).item()
    torch.manual_seed(11)
    assert mmd(coords, q).item() == first


def test_degenerate_batches():
    mmd = ManifoldMMD(2, 3)
    coords, q, prior = make_batch(3, 3, 2, seed=5)
    with pytest.raises(KdmlError, match="at least 2"):
        mmd(coords[:1], q[:1], prior)
    with pytest.raises(KdmlError, match="prior_sample"):
        mmd(coords, q, prior[:1])
    with pytest.raises(KdmlError, match="coords"):
        mmd(coords[:, :2], q[:, :2], prior)
    with pytest.raises(KdmlError, match="needs the memberships"):
        mmd(coords)
    # a batch of 2 identical points, all in one chart: finite, and finite gradients
    same = torch.zeros(2, 3, 2, dtype=torch.float64, requires_grad=True)
    one_chart = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64,
                             requires_grad=True)
    value = mmd(same, one_chart, prior[:2])
    value.backward()
    assert math.isfinite(value.item())
    assert torch.isfinite(same.grad).all() and torch.isfinite(one_chart.grad).all()


def test_float32_default_prior_never_gives_nan(monkeypatch):
    """The prior's own draw can hold 0 (torch.rand's range is [0, 1)) and, in float32, values
    whose 1 - w rounds to nothing: forced here, as 64 random draws almost never hit them."""
    torch.manual_seed(0)
    coords = torch.randn(32, 16, 2, requires_grad=True)
    q = torch.softmax(torch.randn(32, 16), 1).requires_grad_()
    rand = torch.rand

    def extreme_rand(*size, **kwargs):
        sample = rand(*size, **kwargs)
        sample[0, 0], sample[1, 1] = 0.0, 1.0 - 2.0**-24  # the largest float32 below 1
        return sample

    monkeypatch.setattr(torch, "rand", extreme_rand)
    value = ManifoldMMD(2, 16)(coords, q)
    value.backward()
    assert math.isfinite(value.item()) and torch.isfinite(coords.grad).all()


@pytest.mark.parametrize("eps", [0.1, 1e-3])
def test_manifold_mmd_clamps_the_prior_at_its_own_eps(eps):
    """eps had only been compared with ManifoldMMD itself: a clamp fixed at 1e-6 passed."""
    coords, q, prior = make_batch(5, 3, 2, seed=11)
    prior[0, 0], prior[1, 1], prior[2, 0] = 0.0, 1.0, 0.05  # below, at and beyond the clamp
    value = ManifoldMMD(2, 3, eps=eps)(coords, q, prior).item()
    assert value == pytest.approx(literal_eq5(coords.tolist(), q.tolist(), prior.tolist(), eps),
                                  rel=1e-9)


# ----------------------------------------------------------------- chart membership loss


def literal_chart_loss(q) -> float:
    n = len(q[0])
    return -sum(sum((v - 1.0 / n) ** 2 for v in row) for row in q) / len(q)


@pytest.mark.parametrize(("num_points", "n_charts"), [(1, 1), (1, 4), (6, 3), (9, 16)])
def test_chart_membership_loss_matches_l_J(num_points, n_charts):
    gen = torch.Generator().manual_seed(num_points)
    q = torch.softmax(torch.randn(num_points, n_charts, generator=gen, dtype=torch.float64), 1)
    got = ChartMembershipLoss()(q)
    assert got.item() == pytest.approx(literal_chart_loss(q.tolist()), rel=1e-12, abs=1e-15)


def test_chart_membership_loss_extremes():
    loss = ChartMembershipLoss()
    assert loss(torch.ones(3, 1)).item() == 0.0  # n = 1
    n = 5
    assert loss(torch.eye(n)).item() == pytest.approx(-(1 - 1 / n))  # one-hot: the minimum
    assert loss(torch.full((4, n), 1 / n)).item() == pytest.approx(0.0, abs=1e-7)  # uniform
    with pytest.raises(KdmlError):
        loss(torch.ones(0, 3))
    # one-hot memberships as bool or int (ManifoldMMD takes them) are the float one-hot's value
    assert loss(torch.eye(n, dtype=torch.bool)).item() == pytest.approx(-(1 - 1 / n))
    assert loss(torch.eye(n, dtype=torch.long)).item() == pytest.approx(-(1 - 1 / n))


# ----------------------------------------------------------------- gradients


def test_manifold_mmd_gradcheck():
    coords, q, prior = make_batch(4, 3, 2, seed=6)
    mmd = ManifoldMMD(2, 3)
    assert gradcheck(lambda c, m: mmd(c, m, prior_sample=prior),
                     (coords.requires_grad_(), q.requires_grad_()))


def test_chart_membership_loss_gradcheck():
    q = torch.softmax(torch.randn(5, 4, dtype=torch.float64), 1).requires_grad_()
    assert gradcheck(ChartMembershipLoss(), (q,))


def test_docstring_examples():
    assert doctest.testmod(manifold_module, raise_on_error=False).failed == 0


# ----------------------------------------------------------------- what the Atlas API takes


def raises_one_line(pattern, call, *args, **kwargs):
    """``call(*args, **kwargs)`` raises a one-line KdmlError matching ``pattern``."""
    with pytest.raises(KdmlError, match=pattern) as error:
        call(*args, **kwargs)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(("n_charts", "shape"), [(1, (4, 3)), (1, (4, 1, 3)), (2, (4, 2, 3))])
def test_manifold_mmd_refuses_integer_coordinates_in_one_line(n_charts, shape):
    """torch.rand raised NotImplementedError: "check_uniform_bounds" not implemented for
    'Long'."""
    coords = torch.ones(shape, dtype=torch.long)
    q = None if n_charts == 1 else torch.full((4, n_charts), 1 / n_charts)
    raises_one_line(r"^ManifoldMMD expects floating point chart coordinates, got torch\.int64; "
                    r"convert with \.float\(\)$", ManifoldMMD(3, n_charts), coords, q)


def test_manifold_mmd_refuses_arrays_and_memberships_on_another_device_in_one_line():
    """NumPy raised "'numpy.ndarray' object has no attribute 'new_ones'" (or '...ndim'), and
    memberships on another device "Tensor on device cpu is not on the expected device
    meta!"."""
    coords, q, prior = make_batch(4, 2, 3, seed=7)
    mmd = ManifoldMMD(3, 2)
    for args in ((coords.numpy(), q), (coords, q.numpy())):
        raises_one_line(r"^ManifoldMMD takes torch tensors \(chart coordinates and memberships\), "
                        r"got ndarray; convert with torch\.as_tensor$", mmd, *args, prior)
    raises_one_line(r"^ManifoldMMD takes torch tensors \(prior_sample\), got ndarray;",
                    mmd, coords, q, prior.numpy())
    raises_one_line(r"^ManifoldMMD: the chart coordinates and memberships are on different "
                    r"devices \(cpu, meta\); put them on one device$",
                    mmd, coords, q.to("meta"), prior)
    # all on one device (meta: shapes only) still works, and the prior follows the coords
    assert mmd(coords.to("meta"), q.to("meta"), prior).device.type == "meta"


@pytest.mark.parametrize(("first", "second"), [((4, 2, 3), (5, 2, 4)), ((4, 2, 3), (5, 3, 3)),
                                               ((4, 3), (5, 3))],
                         ids=["widths", "charts", "no chart axis"])
def test_chart_distances_refuses_coordinates_of_other_shapes_in_one_line(first, second):
    """Other widths or charts raised "The size of tensor a (3) must match the size of tensor b
    (4) at non-singleton dimension 3"; [N, d] without the chart axis silently gave [N1, N2]."""
    raises_one_line(rf"^chart_distances needs c1 \[N1, n, d\] and c2 \[N2, n, d\] with the "
                    rf"same \(n, d\), d >= 1, got {re.escape(str(first))} and "
                    rf"{re.escape(str(second))}$",
                    chart_distances, torch.randn(first), torch.randn(second))


@pytest.mark.parametrize("call", [chart_distances, manifold_distance],
                         ids=["chart_distances", "manifold_distance"])
def test_atlas_distances_refuse_arrays_and_mixed_devices_in_one_line(call):
    """NumPy raised "'numpy.ndarray' object has no attribute 'pow'", two devices "Tensor on
    device meta is not on the expected device cpu!"."""
    coords, q, _ = make_batch(4, 2, 3, seed=8)
    name = call.__name__
    args = ((coords, coords) if call is chart_distances else (q, coords, q, coords))
    what = ("pre-sigmoid chart coordinates" if call is chart_distances
            else "memberships and coordinates")
    raises_one_line(rf"^{name} takes torch tensors \({what}\), got ndarray; convert with "
                    r"torch\.as_tensor$", call, *(arg.numpy() for arg in args))
    on_meta = (*args[:len(args) // 2], *(arg.to("meta") for arg in args[len(args) // 2:]))
    raises_one_line(rf"^{name}: the .* are on different devices \(cpu, meta\); put them on one "
                    r"device$", call, *on_meta)
    expected = (4, 4, 2) if call is chart_distances else (4, 4)  # [N1, N2, n] or [N1, N2]
    assert call(*(arg.to("meta") for arg in args)).shape == expected  # one device: works


@pytest.mark.parametrize("meta", ["coords", "q"])
def test_compressed_code_refuses_mixed_devices_in_one_line(meta):
    """A meta and a CPU tensor had given a code on two devices (meta coordinates and a CPU
    chart index, or the reverse) without a word, where the other Atlas functions refuse."""
    coords, q, _ = make_batch(4, 2, 3, seed=8)
    outputs = ChartOutputs(coords.to("meta") if meta == "coords" else coords,
                           q.to("meta") if meta == "q" else q)
    devices = "meta, cpu" if meta == "coords" else "cpu, meta"
    raises_one_line(rf"^compressed_code: the chart coordinates and memberships are on "
                    rf"different devices \({devices}\); put them on one device$",
                    compressed_code, outputs)
    chart_coords, chart_index = compressed_code(ChartOutputs(coords.to("meta"), q.to("meta")))
    assert chart_coords.shape == (4, 3) and chart_index.device.type == "meta"


def test_integer_coordinates_and_array_inputs_of_the_chart_codes_are_refused_in_one_line():
    """Integer chart coordinates gave int64 distances silently (d0="squared"); NumPy inputs
    to compressed_code and ChartMembershipLoss raised deep inside."""
    coords, q, _ = make_batch(4, 2, 3, seed=9)
    raises_one_line(r"^chart_distances expects floating point chart coordinates, got "
                    r"torch\.int64; convert with \.float\(\)$", chart_distances,
                    coords.long(), coords.long(), "squared")
    raises_one_line(r"^compressed_code takes torch tensors \(chart coordinates and "
                    r"memberships\), got ndarray", compressed_code,
                    ChartOutputs(coords.numpy(), q.numpy()))
    raises_one_line(r"^ChartMembershipLoss takes torch tensors \(memberships q\), got ndarray",
                    ChartMembershipLoss(), q.numpy())


@pytest.mark.parametrize("eps", [torch.tensor(0.1), torch.tensor(0.1, dtype=torch.float64),
                                 np.array(0.1), np.float32(0.1)],
                         ids=["tensor", "tensor64", "array", "np.float32"])
def test_manifold_mmd_takes_a_zero_dimensional_eps_as_its_float(eps):
    """A 0-d tensor or array had been refused ("eps must be a number in (0, 0.5)"), where the
    kernels' settings take one: it is read once, as a Python float."""
    mmd = ManifoldMMD(3, 2, eps=eps)
    assert type(mmd.eps) is float and mmd.eps == float(eps)
    coords, q, prior = make_batch(4, 2, 3, seed=10)
    prior[0, 0] = 0.0  # clamped to eps
    expected = ManifoldMMD(3, 2, eps=float(eps))(coords, q, prior)
    assert mmd(coords, q, prior).item() == expected.item()


@pytest.mark.parametrize("eps", [1e-8, 1e-12])
def test_manifold_mmd_s_clamp_keeps_the_logit_finite_in_float32(eps):
    """In float32, 1 - eps rounds to 1 for eps below 2^-24: a prior sample holding 1.0 (a
    grid, for a reproducible evaluation) had given a NaN value and gradient."""
    coords, q, _ = make_batch(6, 2, 3, seed=11)
    grid = torch.linspace(0.0, 1.0, 6, dtype=torch.float64)[:, None].repeat(1, 3)
    coords32 = coords.float().requires_grad_(True)
    value = ManifoldMMD(3, 2, eps=eps)(coords32, q.float(), grid.float())
    value.backward()
    assert torch.isfinite(coords32.grad).all()
    expected = ManifoldMMD(3, 2, eps=eps)(coords.float().double(), q.float().double(), grid)
    assert value.item() == pytest.approx(expected.item(), abs=1e-6)


@pytest.mark.parametrize("eps", [torch.tensor(0.5), np.array(-0.1), torch.tensor([0.1]),
                                 np.array([0.1])], ids=["0.5", "negative", "1-d", "1-d array"])
def test_manifold_mmd_refuses_a_tensor_eps_out_of_range_or_not_zero_dimensional(eps):
    raises_one_line(r"^ManifoldMMD: eps must be a number in \(0, 0\.5\), got ",
                    ManifoldMMD, 3, 2, eps=eps)


def test_a_call_s_generator_draws_the_prior_sample_over_the_module_s():
    """forward(generator=...) draws the prior sample from the call's generator, not the
    module's (the Atlas recipes pass a per-step generator of the run's seed): with the
    module's taken instead, two calls of one seed gave two values (mutation audit)."""
    coords, q, _ = make_batch(5, 3, 2, seed=4)
    mmd = ManifoldMMD(2, 3, generator=torch.Generator().manual_seed(8))
    value = mmd(coords, q, generator=torch.Generator().manual_seed(7)).item()
    drawn = torch.rand(5, 2, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    assert value == pytest.approx(literal_eq5(coords.tolist(), q.tolist(), drawn.tolist()),
                                  rel=1e-10)
    assert mmd(coords, q, generator=torch.Generator().manual_seed(7)).item() == value
