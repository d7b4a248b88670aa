"""Atlas geometry: the compressed code (Eq. 3), the manifold distance (Eq. 7) and the heads.

References are literal float64 loops over points and charts written from the paper's
formulas with ``math``; they share no code with the modules under test.
"""

from __future__ import annotations

import doctest
import math

import pytest
import torch
from torch.autograd import gradcheck

from kdml import atlas as atlas_module
from kdml.atlas import ChartOutputs, compressed_code, manifold_distance, safe_sqrt
from kdml.errors import KdmlError
from kdml.losses.nt_xent import nt_xent_loss
from kdml.models import atlas_heads as heads_module
from kdml.models.atlas_heads import AtlasHead, ProjectionHeads

# ----------------------------------------------------------------- literal references


def literal_d0(a, b, d0: str) -> float:
    squared = sum((x - y) ** 2 for x, y in zip(a, b, strict=True))
    if d0 == "euclidean":
        return math.sqrt(squared)
    if d0 == "mean_squared":
        return squared / len(a)
    return squared


CODE_SMALL = 1e-12  # neurve's SMALL (distance.py)


def literal_manifold_distance(q1, c1, q2, c2, variant="paper", d0=None) -> list[list[float]]:
    """Eq. 7: sum_i q_i(x) q_i(y) d0 / sum_i q_i(x) q_i(y), inf if the denominator is 0
    (paper); neurve's pdist_mfld (code): divided by the denominator + 1e-12, and 1 where the
    denominator is at most 1e-12."""
    d0 = d0 or ("euclidean" if variant == "paper" else "mean_squared")
    rows = []
    for qx, cx in zip(q1, c1, strict=True):
        row = []
        for qy, cy in zip(q2, c2, strict=True):
            numerator = denominator = 0.0
            for i in range(len(qx)):
                weight = qx[i] * qy[i]
                numerator += weight * literal_d0(cx[i], cy[i], d0)
                denominator += weight
            if variant == "code":
                row.append(1.0 if denominator <= CODE_SMALL
                           else numerator / (denominator + CODE_SMALL))
            elif denominator == 0:
                row.append(math.inf)
            else:
                row.append(numerator / denominator)
        rows.append(row)
    return rows


def random_memberships(num_points, n_charts, seed, zero_fraction=0.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.rand(num_points, n_charts, generator=gen, dtype=torch.float64)
    if zero_fraction:
        q = torch.where(torch.rand(q.shape, generator=gen, dtype=torch.float64) < zero_fraction,
                        0.0, q)
    return q / q.sum(dim=1, keepdim=True).clamp_min(1e-300)


def random_coords(num_points, n_charts, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    return 2.0 * torch.randn(num_points, n_charts, dim, generator=gen, dtype=torch.float64)


def one_hot(indices, n_charts):
    return torch.nn.functional.one_hot(torch.tensor(indices), n_charts).double()


def assert_matches(got: torch.Tensor, expected: list[list[float]]):
    expected_tensor = torch.tensor(expected, dtype=torch.float64)
    assert torch.equal(torch.isinf(got), torch.isinf(expected_tensor))
    finite = torch.isfinite(expected_tensor)
    assert torch.allclose(got[finite], expected_tensor[finite], rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------- manifold distance values


@pytest.mark.parametrize("variant", ["paper", "code"])
@pytest.mark.parametrize("d0", [None, "euclidean", "squared", "mean_squared"])
@pytest.mark.parametrize(("n_charts", "dim"), [(1, 3), (4, 2), (6, 5)])
def test_manifold_distance_matches_eq_7(variant, d0, n_charts, dim):
    q1, c1 = random_memberships(5, n_charts, 0), random_coords(5, n_charts, dim, 1)
    q2, c2 = random_memberships(7, n_charts, 2), random_coords(7, n_charts, dim, 3)
    got = manifold_distance(q1, c1, q2, c2, d0=d0, variant=variant)
    assert got.shape == (5, 7)
    expected = literal_manifold_distance(q1.tolist(), c1.tolist(), q2.tolist(), c2.tolist(),
                                         variant, d0)
    assert_matches(got, expected)


@pytest.mark.parametrize("variant", ["paper", "code"])
def test_disjoint_charts_are_infinitely_far_in_the_paper_and_1_in_the_code(variant):
    # one-hot charts (test time) and sparse memberships: some pairs share no chart
    q1 = torch.cat([one_hot([0, 1, 2], 4), random_memberships(4, 4, 5, zero_fraction=0.6)])
    q2 = torch.cat([one_hot([2, 2, 3], 4), random_memberships(5, 4, 6, zero_fraction=0.6)])
    c1, c2 = random_coords(len(q1), 4, 3, 7), random_coords(len(q2), 4, 3, 8)
    got = manifold_distance(q1, c1, q2, c2, variant=variant)
    expected = literal_manifold_distance(q1.tolist(), c1.tolist(), q2.tolist(), c2.tolist(),
                                         variant)
    assert any(math.isinf(v) for row in literal_manifold_distance(
        q1.tolist(), c1.tolist(), q2.tolist(), c2.tolist()) for v in row)
    assert_matches(got, expected)
    if variant == "code":
        assert torch.isfinite(got).all()


def test_one_hot_memberships_give_chart_euclidean_or_infinity():
    charts = [0, 0, 1, 2, 1]
    q, c = one_hot(charts, 3), random_coords(5, 3, 2, 9)
    got = manifold_distance(q, c, q, c)
    for a in range(5):
        for b in range(5):
            if charts[a] != charts[b]:
                assert got[a, b] == math.inf
            else:
                chart = charts[a]
                expected = math.dist(c[a, chart].tolist(), c[b, chart].tolist())
                assert got[a, b].item() == pytest.approx(expected, abs=1e-12)


def test_one_chart_reduces_to_the_euclidean_distance():
    c1, c2 = random_coords(6, 1, 4, 10), random_coords(3, 1, 4, 11)
    q1, q2 = random_memberships(6, 1, 12), random_memberships(3, 1, 13)  # all ones
    got = manifold_distance(q1, c1, q2, c2)
    expected = [[math.dist(a[0], b[0]) for b in c2.tolist()] for a in c1.tolist()]
    assert torch.allclose(got, torch.tensor(expected, dtype=torch.float64), atol=1e-12)


def test_log_memberships_give_the_same_distance():
    q1, q2 = random_memberships(4, 5, 14, zero_fraction=0.5), random_memberships(3, 5, 15, 0.5)
    c1, c2 = random_coords(4, 5, 2, 16), random_coords(3, 5, 2, 17)
    from_q = manifold_distance(q1, c1, q2, c2)
    from_log_q = manifold_distance(torch.log(q1), c1, torch.log(q2), c2, q_is_log=True)
    assert torch.equal(torch.isinf(from_q), torch.isinf(from_log_q))
    finite = torch.isfinite(from_q)
    assert torch.allclose(from_q[finite], from_log_q[finite], rtol=1e-12)
    # logits work too: a per-row shift of log q cancels
    shifted = manifold_distance(torch.log(q1) + 3.0, c1, torch.log(q2) - 1.5, c2, q_is_log=True)
    assert torch.allclose(shifted[finite], from_q[finite], rtol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_code_variant_follows_pdist_mfld_near_its_threshold(dtype):
    # logit gaps 20, 28, 30, 200 (two charts, opposite favourites): shared membership about
    # 4e-9, 1.4e-12 (above 1e-12), 1.9e-13 (below: 1) and 0 in float32 (underflow: 1)
    gaps = torch.tensor([20.0, 28.0, 30.0, 200.0], dtype=dtype)
    logits1 = torch.stack([torch.zeros_like(gaps), -gaps], dim=1)
    logits2 = torch.stack([-gaps, torch.zeros_like(gaps)], dim=1)
    c1 = random_coords(4, 2, 3, 30).to(dtype)
    c2 = random_coords(4, 2, 3, 31).to(dtype)
    exact = literal_manifold_distance(torch.softmax(logits1.double(), 1).tolist(),
                                      c1.double().tolist(),
                                      torch.softmax(logits2.double(), 1).tolist(),
                                      c2.double().tolist(), "code")
    diagonal = [exact[i][i] for i in range(4)]
    assert diagonal[2] == diagonal[3] == 1.0 and diagonal[0] != 1.0 and diagonal[1] != 1.0
    from_log_q = manifold_distance(torch.log_softmax(logits1, 1), c1,
                                   torch.log_softmax(logits2, 1), c2, variant="code",
                                   q_is_log=True)
    rtol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(from_log_q.double(), torch.tensor(exact, dtype=torch.float64),
                               rtol=rtol, atol=0.0)
    from_q = manifold_distance(torch.softmax(logits1, 1), c1, torch.softmax(logits2, 1), c2,
                               variant="code")
    torch.testing.assert_close(from_q, from_log_q, rtol=rtol, atol=0.0)


def test_log_memberships_survive_float32_underflow():
    # logit gaps of 200: float32 softmax underflows to exact 0, log_softmax does not
    logits1 = torch.tensor([[0.0, -200.0], [0.0, -3.0]])
    logits2 = torch.tensor([[-200.0, 0.0], [-1.0, 0.0]])
    c1, c2 = torch.randn(2, 2, 3), torch.randn(2, 2, 3)
    q1, q2 = torch.softmax(logits1, 1), torch.softmax(logits2, 1)
    assert manifold_distance(q1, c1, q2, c2)[0, 0] == math.inf  # the underflowed product
    got = manifold_distance(torch.log_softmax(logits1, 1), c1, torch.log_softmax(logits2, 1), c2,
                            q_is_log=True)
    exact = literal_manifold_distance(torch.softmax(logits1.double(), 1).tolist(),
                                      c1.double().tolist(),
                                      torch.softmax(logits2.double(), 1).tolist(),
                                      c2.double().tolist())
    assert torch.allclose(got.double(), torch.tensor(exact, dtype=torch.float64), rtol=1e-5)


# ----------------------------------------------------------------- gradients


@pytest.mark.parametrize("variant", ["paper", "code"])
@pytest.mark.parametrize("q_is_log", [False, True])
def test_manifold_distance_gradcheck(variant, q_is_log):
    q1 = random_memberships(3, 4, 20).requires_grad_()
    q2 = random_memberships(4, 4, 21).requires_grad_()
    c1 = random_coords(3, 4, 2, 22).requires_grad_()
    c2 = random_coords(4, 4, 2, 23).requires_grad_()
    if q_is_log:
        q1, q2 = q1.detach().log().requires_grad_(), q2.detach().log().requires_grad_()

    def distance(a, b, c, d):
        return manifold_distance(a, b, c, d, variant=variant, q_is_log=q_is_log)

    assert gradcheck(distance, (q1, c1, q2, c2))


def test_no_nan_gradient_at_zero_distance_and_without_shared_charts():
    # one-hot memberships, the same points on both sides (zero diagonal), inf entries
    q = one_hot([0, 0, 1, 2], 3).requires_grad_()
    c = random_coords(4, 3, 2, 24)
    c[1] = c[0]  # two coincident points
    c.requires_grad_()
    distances = manifold_distance(q, c, q, c)
    assert torch.isinf(distances).any() and (distances == 0).sum() >= 6
    loss = torch.where(torch.isfinite(distances), distances, 0.0).sum()
    loss.backward()
    assert torch.isfinite(q.grad).all() and torch.isfinite(c.grad).all()
    assert c.grad.abs().sum() == 0  # all finite distances are 0: zero (sub)gradient


def test_safe_sqrt():
    x = torch.tensor([0.0, 4.0, 2.25], dtype=torch.float64, requires_grad=True)
    y = safe_sqrt(x)
    y.sum().backward()
    assert y.tolist() == [0.0, 2.0, 1.5]
    assert x.grad.tolist() == [0.0, 0.25, 1.0 / 3.0]


def test_manifold_distance_rejects_bad_inputs():
    q, c = random_memberships(3, 2, 0), random_coords(3, 2, 2, 0)
    with pytest.raises(KdmlError, match="variant"):
        manifold_distance(q, c, q, c, variant="other")
    with pytest.raises(KdmlError, match="d0"):
        manifold_distance(q, c, q, c, d0="cosine")
    with pytest.raises(KdmlError, match="coords"):
        manifold_distance(q, c[:, 0], q, c)
    with pytest.raises(KdmlError, match="same"):
        manifold_distance(q, c, q, random_coords(3, 2, 3, 0))


# ----------------------------------------------------------------- compressed code and heads


def test_compressed_code_takes_the_argmax_chart():
    q, coords = random_memberships(6, 5, 30), random_coords(6, 5, 3, 31)
    chart_coords, chart_index = compressed_code(ChartOutputs(coords, q))
    for row in range(6):
        best = max(range(5), key=lambda i, row=row: q[row, i].item())
        assert chart_index[row].item() == best
        assert chart_coords[row].tolist() == coords[row, best].tolist()
    assert chart_index.dtype == torch.int64


def test_atlas_head_is_n_linear_charts_and_a_softmax():
    torch.manual_seed(0)
    head = AtlasHead(7, dim=3, n_charts=4).double()
    features = torch.randn(5, 7, dtype=torch.float64)
    out = head(features)
    assert out.coords.shape == (5, 4, 3) and out.q.shape == (5, 4)
    weight, bias = head.coordinates.weight.tolist(), head.coordinates.bias.tolist()
    logits_w, logits_b = head.membership.weight.tolist(), head.membership.bias.tolist()
    for b, f in enumerate(features.tolist()):
        for i in range(4):  # chart i is rows i*d .. i*d + d - 1 of the joint Linear
            for k in range(3):
                row = i * 3 + k
                value = sum(w * x for w, x in zip(weight[row], f, strict=True)) + bias[row]
                assert out.coords[b, i, k].item() == pytest.approx(value, abs=1e-12)
        logits = [sum(w * x for w, x in zip(logits_w[i], f, strict=True)) + logits_b[i]
                  for i in range(4)]
        total = sum(math.exp(z) for z in logits)
        for i in range(4):
            assert out.q[b, i].item() == pytest.approx(math.exp(logits[i]) / total, abs=1e-12)
            assert out.log_q[b, i].item() == pytest.approx(logits[i] - math.log(total), abs=1e-12)


def float64_heads(head_input: str, seed: int) -> ProjectionHeads:
    """Three charts' heads 2 -> 5 -> 4, in float64 for the literal loops."""
    torch.manual_seed(seed)
    return ProjectionHeads(dim=2, n_charts=3, out_features=4, hidden=5,
                           head_input=head_input).double()


def literal_head_input(coords: torch.Tensor, b: int, i: int, head_input: str) -> list[float]:
    """What chart i's head takes for sample b, written out: its coordinates, or their sigmoid."""
    u = coords[b, i].tolist()
    return [1.0 / (1.0 + math.exp(-v)) for v in u] if head_input == "sigmoid" else u


@pytest.mark.parametrize("head_input", ["sigmoid", "pre-sigmoid"])
def test_projection_heads_match_the_weighted_sum_of_table_1(head_input):
    heads = float64_heads(head_input, 0)
    coords, q = random_coords(4, 3, 2, 40), random_memberships(4, 3, 41)
    got = heads(coords, q)
    w1, w2 = heads.hidden_weight.tolist(), heads.output_weight.tolist()  # [n, d, h], [n, h, p]
    for b in range(4):
        expected = [0.0] * 4
        for i in range(3):
            u = literal_head_input(coords, b, i, head_input)
            hidden = [max(0.0, sum(u[k] * w1[i][k][h] for k in range(2))) for h in range(5)]
            for p in range(4):
                projection = sum(hidden[h] * w2[i][h][p] for h in range(5))
                expected[p] += q[b, i].item() * projection
        assert got[b].tolist() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("head_input", ["sigmoid", "pre-sigmoid"])
def test_active_share_counts_each_samples_on_units_weighted_by_membership(head_input):
    heads = float64_heads(head_input, 1)
    coords, q = random_coords(6, 3, 2, 42), random_memberships(6, 3, 43)
    w1 = heads.hidden_weight.tolist()
    total = 0.0
    for b in range(6):
        for i in range(3):
            u = literal_head_input(coords, b, i, head_input)
            on = sum(1 for h in range(5) if sum(u[k] * w1[i][k][h] for k in range(2)) > 0)
            total += q[b, i].item() * on / 5
    share = heads.active_share(coords, q)
    assert not share.requires_grad
    assert share.item() == pytest.approx(total / 6, abs=1e-12)
    projection, same_share = heads.project(coords, q)  # the recipes' one pass gives both
    assert torch.equal(projection, heads(coords, q)) and torch.equal(same_share, share)


def test_active_share_of_bfloat16_memberships_is_taken_in_float32():
    """Under bf16 autocast the memberships are bfloat16: the share had been averaged in
    bfloat16 too (0.49806 for 0.49906), though only logged."""
    from kdml.models.atlas_heads import _active_share_of

    preactivations = torch.randn(256, 1, 512, generator=torch.Generator().manual_seed(0))
    ones = torch.ones(256, 1)
    share = _active_share_of(preactivations, ones.bfloat16())
    assert share.dtype == torch.float32
    assert share.item() == _active_share_of(preactivations, ones).item()


def test_a_head_whose_units_are_all_off_gives_chance_nt_xent():
    """The failure the active share shows: no bias, sigmoid coordinates >= 0 and negative
    weights switch every unit off, every projection is 0 and NT-Xent is ln(2B - 1)."""
    heads = ProjectionHeads(dim=2, n_charts=1, out_features=4).double()
    with torch.no_grad():
        heads.hidden_weight.copy_(-heads.hidden_weight.abs())
    coords, q = random_coords(8, 1, 2, 44), torch.ones(8, 1, dtype=torch.float64)
    assert heads.active_share(coords, q).item() == 0.0
    projections = heads(coords, q)
    assert torch.count_nonzero(projections) == 0
    # 8 rows are the two views of B = 4 images: 2B - 1 = 7 others in each denominator
    assert nt_xent_loss(projections, 1.0).item() == pytest.approx(math.log(7), abs=1e-12)


def test_head_arguments_are_checked():
    with pytest.raises(KdmlError, match="n_charts"):
        AtlasHead(8, 2, 0)
    with pytest.raises(KdmlError, match="head_input"):
        ProjectionHeads(2, 3, head_input="tanh")
    with pytest.raises(KdmlError, match="coords"):
        ProjectionHeads(2, 3)(torch.zeros(4, 3, 3), torch.zeros(4, 3))


@pytest.mark.parametrize("module", [atlas_module, heads_module])
def test_docstring_examples(module):
    assert doctest.testmod(module, raise_on_error=False).failed == 0
