"""The Atlas recipes: the batch-all triplet loss, the four methods' objectives, one training
step each, the SimCLR augmentation and a tiny end-to-end MTriplet run.

Losses are compared with literal float64 loops (triplets, NT-Xent); the regularizer terms are
the modules checked against Eq. 5 / l_J in test_atlas_regularizers.py.
"""

from __future__ import annotations

import doctest
import json
import math

import pytest
import torch
from pytorch_metric_learning.losses import NTXentLoss

from kdml.atlas import ChartOutputs, compressed_code, manifold_distance
from kdml.config import RunConfig, resolve_config
from kdml.data import augment as augment_module
from kdml.data.augment import SimCLRAugment
from kdml.errors import KdmlError
from kdml.losses import nt_xent_loss
from kdml.models.backbones import SmallCNN
from kdml.regularizers.manifold import ChartMembershipLoss, ManifoldMMD
from kdml.seeding import StepRandom
from kdml.training.recipes.atlas import (
    RECIPES,
    MSimCLRParams,
    MTripletMethod,
    MTripletParams,
    NormalizedTripletParams,
    SimCLRParams,
    TripletMethod,
    TripletParams,
    atlas_embedding,
    batch_all_triplet_loss,
)

# ----------------------------------------------------------------- literal references


def literal_triplet(distances, labels, margin, reduction):
    """Batch-all: every (a, p, n), y_a = y_p, a != p, y_n != y_a; inf positives left out."""
    losses = []
    for a in range(len(labels)):
        for p in range(len(labels)):
            if p == a or labels[p] != labels[a] or math.isinf(distances[a][p]):
                continue
            for n in range(len(labels)):
                if labels[n] == labels[a]:
                    continue
                losses.append(max(0.0, distances[a][p] - distances[a][n] + margin))
    kept = losses if reduction == "all" else [v for v in losses if v > 0]
    return sum(kept) / len(kept) if kept else 0.0


def literal_nt_xent(projections, tau):
    """SimCLR's NT-Xent: rows i and i + B are the two views of image i."""
    num = len(projections)
    norms = [math.sqrt(sum(v * v for v in z)) for z in projections]
    total = 0.0
    for a in range(num):
        partner = (a + num // 2) % num
        sims = [sum(x * y for x, y in zip(projections[a], projections[b], strict=True))
                / (norms[a] * norms[b]) / tau for b in range(num)]
        denominator = sum(math.exp(sims[b]) for b in range(num) if b != a)
        total += -math.log(math.exp(sims[partner]) / denominator)
    return total / num


@pytest.mark.parametrize("tau", [0.5, 1.0])
def test_nt_xent_loss_equals_the_literal_sum_and_pml(tau):
    generator = torch.Generator().manual_seed(0)
    projections = torch.randn(12, 5, dtype=torch.float64, generator=generator)
    ours = nt_xent_loss(projections.requires_grad_(), tau)
    assert ours.item() == pytest.approx(literal_nt_xent(projections.tolist(), tau), rel=1e-12)
    theirs = NTXentLoss(temperature=tau)(projections, torch.arange(6).repeat(2))
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    mine, peer = (torch.autograd.grad(value, projections) for value in (ours, theirs))
    assert torch.allclose(mine[0], peer[0], rtol=1e-10, atol=1e-12)


def test_nt_xent_loss_needs_two_views_per_image():
    with pytest.raises(KdmlError, match="two views per image"):
        nt_xent_loss(torch.randn(5, 3), 1.0)


LABELS = [0, 0, 1, 1, 2, 2, 3, 3]


def tiny_backbone():
    return SmallCNN(in_channels=1, image_size=8, widths=(8, 16))


def build(name, **params):
    recipe = next(r for r in RECIPES if r.name == name)
    config = RunConfig(recipe=name, method=recipe.params(**params))
    config.method.validate()
    torch.manual_seed(0)
    return recipe.build(config, tiny_backbone(), 4)


def images(seed=0, num=8):
    return torch.rand(num, 1, 8, 8, generator=torch.Generator().manual_seed(seed))


# ----------------------------------------------------------------- batch-all triplet


@pytest.mark.parametrize("reduction", ["all", "nonzero"])
def test_batch_all_triplet_matches_literal_loops(reduction):
    gen = torch.Generator().manual_seed(0)
    distances = torch.rand(8, 8, generator=gen, dtype=torch.float64)
    distances[0, 2] = distances[3, 1] = math.inf  # infinitely far negatives
    distances[4, 5] = math.inf  # an infinitely far positive
    labels = torch.tensor(LABELS)
    loss, stats = batch_all_triplet_loss(distances, labels, 0.2, reduction)
    expected = literal_triplet(distances.tolist(), LABELS, 0.2, reduction)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    assert stats["infinite_positives"] == 6.0  # (4, 5) with the 6 negatives of anchor 4


def test_batch_all_triplet_gradient_is_finite_with_infinities():
    distances = torch.rand(8, 8, dtype=torch.float64)
    distances[0, 1] = distances[0, 2] = distances[2, 0] = math.inf
    distances.requires_grad_()
    loss, _ = batch_all_triplet_loss(distances, torch.tensor(LABELS), 0.2)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(distances.grad).all()
    assert distances.grad[0, 1] == 0 and distances.grad[0, 2] == 0


def test_batch_all_triplet_without_triplets_is_zero():
    distances = torch.rand(4, 4, requires_grad=True)
    loss, stats = batch_all_triplet_loss(distances, torch.tensor([0, 1, 2, 3]))
    assert loss.item() == 0.0 and loss.requires_grad and stats["active_triplets"] == 0.0


# ----------------------------------------------------------------- one step of every recipe


@pytest.mark.parametrize("name", [r.name for r in RECIPES])
def test_one_training_step_reaches_the_backbone(name):
    small = {"n_charts": 4} if name in ("mtriplet", "msimclr") else {}
    method = build(name, dim=2, **small)
    method.train()
    output = method(images(), torch.tensor(LABELS))
    assert math.isfinite(output.loss.item())
    assert all(math.isfinite(v) for v in output.terms.values())
    output.loss.backward()
    first_conv = method.backbone.layers[0].weight.grad
    assert first_conv is not None and first_conv.abs().sum() > 0
    for parameter in method.parameters():
        assert parameter.grad is None or torch.isfinite(parameter.grad).all()
    method.eval()
    with torch.no_grad():
        embeddings = method.embed(images(1))
        expected_width = {"mtriplet": 2 + 4, "msimclr": 2 + 4, "triplet": 3, "simclr": 2}[name]
        assert embeddings.shape == (8, expected_width)
        if method.has_charts:
            codes, index = method.chart_codes(images(1))
            reference = compressed_code(method.charts(images(1)))
            assert torch.equal(codes, reference[0]) and torch.equal(index, reference[1])
            assert codes.shape == (8, 2) and index.dtype == torch.int64


@pytest.mark.parametrize("reduction", ["all", "nonzero"])
def test_mtriplet_objective_is_triplet_plus_regularizers(reduction):
    # margin and reduction not at their defaults: a recipe that ignored either passed
    method = build("mtriplet", dim=3, n_charts=5, lambda1=0.7, lambda2=0.3, margin=0.05,
                   triplet_reduction=reduction).double()
    x, labels = images().double(), torch.tensor(LABELS)
    torch.manual_seed(3)
    output = method(x, labels)
    outputs = method.head(method.backbone(x))
    distances = manifold_distance(outputs.q, outputs.coords, outputs.q, outputs.coords)
    triplet = literal_triplet(distances.tolist(), LABELS, 0.05, reduction)
    other = {"all": "nonzero", "nonzero": "all"}[reduction]  # some triplets are satisfied:
    assert triplet != pytest.approx(literal_triplet(distances.tolist(), LABELS, 0.05, other))
    torch.manual_seed(3)
    prior = torch.rand(8, 3, dtype=torch.float64)  # the draw the forward made
    mmd = ManifoldMMD(3, 5)(outputs.coords, outputs.q, prior).item()
    chart = ChartMembershipLoss()(outputs.q).item()
    assert float(output.terms["triplet"]) == pytest.approx(triplet, rel=1e-9)
    assert float(output.terms["mmd"]) == pytest.approx(mmd, rel=1e-9)
    assert output.loss.item() == pytest.approx(triplet + 0.7 * mmd + 0.3 * chart, rel=1e-9)


def literal_chart_loss(q) -> float:
    """l_J = -E_x sum_i (q_i(x) - 1/n)^2 (Sec. 3.1) with plain loops."""
    return -sum(sum((v - 1 / len(row)) ** 2 for v in row) for row in q) / len(q)


def _gradients(loss, method):
    parameters = [p for p in method.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, parameters, allow_unused=True, retain_graph=True)
    return [torch.zeros_like(p) if g is None else g for p, g in zip(parameters, grads,
                                                                     strict=True)]


def test_mtriplet_step_logs_and_differentiates_the_loss_it_is_made_of():
    """The logged total is the optimised one, the chart term is l_J, and the gradient is
    that of triplet + lambda1 * l_Z + lambda2 * l_J through every term (an MMD or a chart loss
    on detached coordinates or memberships gave the same values, not the same training)."""
    method = build("mtriplet", dim=3, n_charts=5, lambda1=0.7, lambda2=0.3).double()
    x, labels = images().double(), torch.tensor(LABELS)
    torch.manual_seed(3)
    output = method(x, labels)
    outputs = method.head(method.backbone(x))
    torch.manual_seed(3)
    prior = torch.rand(8, 3, dtype=torch.float64)  # the draw the forward made
    distances = manifold_distance(outputs.q, outputs.coords, outputs.q, outputs.coords)
    triplet, _ = batch_all_triplet_loss(distances, labels, 0.2, "all")
    mmd = ManifoldMMD(3, 5)(outputs.coords, outputs.q, prior)
    chart = ChartMembershipLoss()(outputs.q)
    expected = triplet + 0.7 * mmd + 0.3 * chart
    assert float(output.terms["chart"]) == pytest.approx(literal_chart_loss(
        outputs.q.tolist()), rel=1e-9)
    assert float(output.terms["loss"]) == pytest.approx(output.loss.item(), rel=1e-12)
    assert float(output.terms["q_max"]) == pytest.approx(  # the mean top membership
        sum(max(row) for row in outputs.q.tolist()) / 8, rel=1e-9)
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-9)
    for term in (mmd, chart):  # each term moves the head on its own
        assert any(g.abs().sum() > 0 for g in _gradients(term, method))
    for got, want in zip(_gradients(output.loss, method), _gradients(expected, method),
                         strict=True):
        assert torch.allclose(got, want, rtol=1e-7, atol=1e-12)


def test_mtriplet_defaults_are_the_paper_s():
    """Sec. 3.2: n = 16 charts (tuned at d = 2), margin 0.2, lambda1 = 1, lambda2 = 0.1, and
    Eq. 7's distance as printed (NOTES: the paper's formula is the default)."""
    params = MTripletParams()
    assert (params.dim, params.n_charts, params.margin, params.lambda1, params.lambda2,
            params.distance) == (2, 16, 0.2, 1.0, 0.1, "paper")


def test_mtriplet_uses_q_when_the_head_gives_no_log_memberships(monkeypatch):
    """``ChartOutputs.log_q`` is optional: a head without it trains on ``q`` itself, to the
    same loss (the log-memberships only keep underflowed charts finite)."""
    method = build("mtriplet", dim=3, n_charts=5, lambda1=0.7, lambda2=0.3).double()
    x, labels = images().double(), torch.tensor(LABELS)
    torch.manual_seed(3)
    with_log_q = method(x, labels)
    charts = method.charts
    monkeypatch.setattr(method, "charts", lambda inputs: charts(inputs)._replace(log_q=None))
    torch.manual_seed(3)
    without = method(x, labels)
    assert without.loss.item() == pytest.approx(with_log_q.loss.item(), rel=1e-12)
    assert float(without.terms["triplet"]) == pytest.approx(float(with_log_q.terms["triplet"]),
                                                            rel=1e-12)


def test_mtriplet_code_distance_variant():
    method = build("mtriplet", dim=2, n_charts=3, distance="code", lambda1=0.0,
                   lambda2=0.0).double()
    x, labels = images().double(), torch.tensor(LABELS)
    output = method(x, labels)
    outputs = method.head(method.backbone(x))
    distances = manifold_distance(outputs.q, outputs.coords, outputs.q, outputs.coords,
                                  variant="code")
    assert output.loss.item() == pytest.approx(
        literal_triplet(distances.tolist(), LABELS, 0.2, "all"), rel=1e-9)


def test_triplet_baseline_is_normalized_in_d_plus_one():
    method = build("triplet", dim=4, triplet_reduction="nonzero", margin=0.5).double()
    x = images().double()
    output = method(x, torch.tensor(LABELS))
    embeddings = method.embed(x)
    assert embeddings.shape == (8, 5)
    assert torch.allclose(embeddings.norm(dim=1), torch.ones(8, dtype=torch.float64))
    rows = embeddings.tolist()
    distances = [[math.dist(a, b) for b in rows] for a in rows]
    assert output.loss.item() == pytest.approx(
        literal_triplet(distances, LABELS, 0.5, "nonzero"), rel=1e-9)


def test_triplet_baseline_takes_squared_distances_with_squared_distance():
    """method.squared_distance=true (configs/triplet-*.yaml, as the authors' code and Schroff
    et al.) puts the loss on ||a - b||^2; the default keeps MTriplet's d0 = ||a - b||."""
    assert NormalizedTripletParams().squared_distance is False
    method = build("triplet", dim=4, margin=0.5, squared_distance=True).double()
    x = images().double()
    output = method(x, torch.tensor(LABELS))
    rows = method.embed(x).tolist()
    squares = [[math.dist(a, b) ** 2 for b in rows] for a in rows]
    expected = literal_triplet(squares, LABELS, 0.5, "all")
    assert output.loss.item() == pytest.approx(expected, rel=1e-9)
    roots = [[math.sqrt(v) for v in row] for row in squares]
    assert expected != pytest.approx(literal_triplet(roots, LABELS, 0.5, "all"), rel=1e-6)


@pytest.mark.parametrize("name", ["mtriplet", "msimclr"])
def test_atlas_priors_are_drawn_from_the_step_s_generator(name):
    """Under the trainer (rng given) the MMD's prior sample comes from the step's own stream
    (kdml.seeding: no global RNG), so a step is the same whatever torch's global generator
    holds; drawn from the global generator, two equal steps gave two MMDs."""
    method = build(name, dim=2, n_charts=3).double()
    x, labels = images().double(), torch.tensor(LABELS)
    mmds = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        mmds.append(float(method(x, labels, rng=StepRandom(0, 1, 2)).terms["mmd"]))
    assert mmds[0] == mmds[1]
    other = float(method(x, labels, rng=StepRandom(0, 1, 3)).terms["mmd"])
    assert other != mmds[0]  # and the step's stream is what decides it


def _msimclr_step_replayed(method):
    """A float64 MSimCLR step on ``images()`` and its random draws replayed: the step's
    output, its two views and the two priors its MMD drew."""
    x = images().double()
    torch.manual_seed(5)
    output = method(x, torch.tensor(LABELS))
    torch.manual_seed(5)  # replay the forward's random draws: two views, then two priors
    views = method.augment(x)
    priors = torch.rand(8, 2, dtype=torch.float64), torch.rand(8, 2, dtype=torch.float64)
    return output, views, priors


def test_msimclr_objective_is_nt_xent_plus_regularizers():
    # a clamp that bites (the authors' 10 does not on these coordinates): a recipe that
    # ignored method.coordinate_clamp passed
    method = build("msimclr", dim=2, n_charts=3, tau=0.5, lambda1=2.0, lambda2=0.5,
                   coordinate_clamp=0.05).double()
    output, (view1, view2), (prior1, prior2) = _msimclr_step_replayed(method)
    # each view on its own, as the authors' code forwards them (BatchNorm sees one view)
    first, second = method.charts(view1), method.charts(view2)
    outputs = ChartOutputs(torch.cat([first.coords, second.coords]),
                           torch.cat([first.q, second.q]))
    assert (outputs.coords.abs() > 0.05).any()
    coords = outputs.coords.clamp(-0.05, 0.05)  # method.coordinate_clamp (the authors': 10)
    projections = method.projection(coords, outputs.q)
    nt_xent = literal_nt_xent(projections.tolist(), 0.5)
    mmd = 0.5 * (ManifoldMMD(2, 3)(coords[:8], outputs.q[:8], prior1)
                 + ManifoldMMD(2, 3)(coords[8:], outputs.q[8:], prior2)).item()
    chart = ChartMembershipLoss()(outputs.q).item()
    assert float(output.terms["nt_xent"]) == pytest.approx(nt_xent, rel=1e-9)
    assert output.loss.item() == pytest.approx(nt_xent + 2.0 * mmd + 0.5 * chart, rel=1e-9)


def test_msimclr_step_logs_and_differentiates_the_loss_it_is_made_of():
    """The logged total is the optimised one, the chart term is l_J over both views' 2B
    memberships, and the gradient is that of NT-Xent + lambda1 * (the views' mean MMD) +
    lambda2 * l_J through every term."""
    method = build("msimclr", dim=2, n_charts=3, tau=0.5, lambda1=2.0, lambda2=0.5).double()
    output, (view1, view2), (prior1, prior2) = _msimclr_step_replayed(method)
    first, second = method.charts(view1), method.charts(view2)
    coords = torch.cat([first.coords, second.coords]).clamp(-10.0, 10.0)
    q = torch.cat([first.q, second.q])
    nt_xent = nt_xent_loss(method.projection(coords, q), 0.5)
    mmd = 0.5 * (ManifoldMMD(2, 3)(coords[:8], q[:8], prior1)
                 + ManifoldMMD(2, 3)(coords[8:], q[8:], prior2))
    chart = ChartMembershipLoss()(q)
    expected = nt_xent + 2.0 * mmd + 0.5 * chart
    assert float(output.terms["chart"]) == pytest.approx(literal_chart_loss(q.tolist()),
                                                         rel=1e-9)
    assert float(output.terms["mmd"]) == pytest.approx(mmd.item(), rel=1e-9)
    assert float(output.terms["loss"]) == pytest.approx(output.loss.item(), rel=1e-12)
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-9)
    for got, want in zip(_gradients(output.loss, method), _gradients(expected, method),
                         strict=True):
        assert torch.allclose(got, want, rtol=1e-7, atol=1e-12)


def test_msimclr_defaults_are_the_paper_s_and_the_authors():
    """Sec. 3.1 / A.1: n = 16, lambda1 = 20, lambda2 = 0.1, tau = 1 (MNIST); Table 1's
    projection of the sigmoid coordinates h_i(phi_i(x)); each view forwarded on its own
    (the authors' code); SimCLR's crops down to 8% of the image."""
    params = MSimCLRParams()
    assert (params.n_charts, params.lambda1, params.lambda2, params.tau) == (16, 20.0, 0.1, 1.0)
    assert (params.proj_input, params.joint_views, params.crop_scale_min) == (
        "sigmoid", False, 0.08)


def test_simclr_baseline_is_nt_xent_of_the_projection():
    method = build("simclr", dim=3, tau=0.5, proj_dim=16).double()  # the CIFAR config's tau
    x = images().double()
    torch.manual_seed(6)
    output = method(x, torch.tensor(LABELS))
    torch.manual_seed(6)
    representation = torch.cat([method.embed(view) for view in method.augment(x)])
    w1, w2 = method.projection.hidden_weight[0], method.projection.output_weight[0]
    projections = torch.relu(representation @ w1) @ w2  # h(f(x)), no sigmoid
    assert output.loss.item() == pytest.approx(literal_nt_xent(projections.tolist(), 0.5),
                                               rel=1e-9)


def test_simclr_recipes_need_image_batches():
    method = build("simclr")
    with pytest.raises(KdmlError, match="images"):
        method(torch.rand(8, 40), torch.tensor(LABELS))
    with pytest.raises(KdmlError, match="at least 2"):
        method(images(num=1), torch.tensor([0]))


def test_atlas_embedding_ranks_a_chart_before_the_others():
    gen = torch.Generator().manual_seed(4)
    coords = 20 * torch.randn(64, 3, 2, generator=gen, dtype=torch.float64)  # saturated too
    q = torch.softmax(5 * torch.randn(64, 3, generator=gen, dtype=torch.float64), 1)
    embeddings = atlas_embedding(ChartOutputs(coords, q))
    chart_coords, index = compressed_code(ChartOutputs(coords, q))
    assert embeddings.shape == (64, 5)
    assert torch.equal(embeddings[:, :2], torch.sigmoid(chart_coords))
    distances = torch.cdist(embeddings, embeddings)
    same = index[:, None] == index[None, :]
    assert (~same).any()
    assert distances[same].max() <= math.sqrt(2) < 2.0 <= distances[~same].min()


# ----------------------------------------------------------------- augmentation


@pytest.mark.parametrize("shape", [(6, 1, 8, 8), (4, 1, 28, 28), (4, 3, 32, 32)])
def test_augmentation_is_deterministic_under_a_seed(shape):
    augment = SimCLRAugment()
    batch = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    first = augment(batch)
    torch.manual_seed(1)
    again = augment(batch)
    torch.manual_seed(2)
    other = augment(batch)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], other[0])
    assert not torch.equal(first[0], first[1])  # two different views
    for view in first:
        assert view.shape == batch.shape and view.min() >= 0 and view.max() <= 1


def test_augmentation_options_and_errors():
    batch = torch.rand(4, 1, 8, 8)
    flipping = SimCLRAugment(horizontal_flip=True)
    names = [type(step).__name__ for step in flipping.pipeline(1, 8, 8)]
    assert names == ["RandomResizedCrop", "RandomHorizontalFlip", "ColorJitter"]
    names = [type(step).__name__ for step in SimCLRAugment().pipeline(3, 8, 8)]
    assert names == ["RandomResizedCrop", "ColorJitter", "RandomGrayscale"]
    with pytest.raises(KdmlError, match="channels"):
        SimCLRAugment()(torch.rand(4, 2, 8, 8))
    with pytest.raises(KdmlError, match="crop_scale"):
        SimCLRAugment(crop_scale=(0.5, 0.2))
    # identity settings: full crops (no room for another aspect ratio), no jitter
    identity = SimCLRAugment(crop_scale=(1.0, 1.0), jitter_p=0.0)
    view1, _ = identity(batch)
    assert torch.allclose(view1, batch, atol=1e-6)


@pytest.mark.parametrize("strength", [0.5, 1.0])
def test_colour_jitter_spans_the_documented_ranges(strength):
    """Brightness, contrast and saturation 0.8 s, hue 0.2 s (the docstring; Atlas Sec. A.1),
    applied with probability jitter_p; grey images get no saturation or hue. A hue of 0.1 s
    had passed every test."""
    jitter = SimCLRAugment(jitter_strength=strength, jitter_p=0.7).pipeline(3, 8, 8)[1]
    assert type(jitter).__name__ == "ColorJitter" and jitter.p == 0.7
    ranges = (jitter.brightness, jitter.contrast, jitter.saturation, jitter.hue)
    assert ranges == pytest.approx((0.8 * strength,) * 3 + (0.2 * strength,), abs=1e-12)
    grey = SimCLRAugment(jitter_strength=strength).pipeline(1, 8, 8)[1]
    assert (grey.brightness, grey.contrast, grey.saturation, grey.hue) == pytest.approx(
        (0.8 * strength, 0.8 * strength, 0.0, 0.0), abs=1e-12)


def test_augmentation_docstring_example():
    assert doctest.testmod(augment_module, raise_on_error=False).failed == 0


# ----------------------------------------------------------------- recipe records


def test_recipe_records_and_defaults():
    by_name = {recipe.name: recipe for recipe in RECIPES}
    assert set(by_name) == {"mtriplet", "triplet", "msimclr", "simclr"}
    for name in ("mtriplet", "triplet"):
        assert by_name[name].defaults["data"] == {"batch_size": 20, "samples_per_class": 4}
    for name in ("msimclr", "simclr"):
        assert by_name[name].defaults["data"]["split"] == "seen-holdout"
    assert MTripletParams().lambda1 == 1.0 and MTripletParams().lambda2 == 0.1
    assert MSimCLRParams().lambda1 == 20.0 and MSimCLRParams().tau == 1.0


@pytest.mark.parametrize(("params", "message"), [
    (MTripletParams(n_charts=0), "n_charts"),
    (MTripletParams(lambda1=-1.0), "lambda1"),
    (MTripletParams(distance="cosine"), "distance"),
    (TripletParams(triplet_reduction="sum"), "triplet_reduction"),
    (SimCLRParams(tau=0.0), "tau"),
    (MSimCLRParams(proj_input="tanh"), "proj_input"),
    (SimCLRParams(proj_hidden=-1), r"^method.proj_hidden must be >= 0 \(0 = dim\), got -1$"),
    (SimCLRParams(crop_size=-1),
     r"^method.crop_size must be >= 0 \(0 = the input size\), got -1$"),
    (SimCLRParams(crop_size=True),
     r"^method.crop_size=True has the wrong type; expected int$"),
    (MSimCLRParams(feature_dim=-1), r"^method.feature_dim must be >= 0, got -1$"),
])
def test_bad_parameters(params, message):
    with pytest.raises(KdmlError, match=message):
        params.validate()


@pytest.mark.slow
def test_mtriplet_end_to_end_on_digits(tmp_path, tiny_overrides):
    from kdml.training.trainer import train

    recipe = next(r for r in RECIPES if r.name == "mtriplet")
    overrides = [o for o in tiny_overrides if not o.startswith("train.epochs")]
    config = resolve_config("mtriplet", recipe.params, recipe.defaults, overrides=[
        *overrides, "train.epochs=1", "data.dataset=digits", "method.n_charts=4",
        "model.backbone=mlp"])
    metrics = train(config, tmp_path / "run", progress=False, echo=lambda _: None)
    assert 0.0 <= metrics["recall@1"] <= 1.0 and math.isfinite(metrics["map@r"])
    history = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"]
    assert {"train/triplet", "train/mmd", "train/chart", "train/q_max"} <= history[-1].keys()


@pytest.mark.slow
def test_msimclr_end_to_end_with_the_piecewise_linear_probe(tmp_path):
    from kdml.training.trainer import train

    recipe = next(r for r in RECIPES if r.name == "msimclr")
    config = resolve_config("msimclr", recipe.params, recipe.defaults, overrides=[
        "train.epochs=1", "train.steps_per_epoch=3", "data.dataset=digits",
        "data.batch_size=64", "method.n_charts=4", "eval.nmi=false", "model.backbone=cnn",
        "model.small_input=false"])
    assert config.data.split == "seen-holdout"
    metrics = train(config, tmp_path / "run", progress=False, echo=lambda _: None)
    assert 0.0 <= metrics["linear_accuracy"] <= 1.0 and 0.0 <= metrics["recall@1"] <= 1.0


def test_msimclr_follows_appendix_a1_and_the_authors_code_by_default():
    recipe = next(r for r in RECIPES if r.name == "msimclr")
    config = resolve_config("msimclr", recipe.params, recipe.defaults)
    assert (config.model.backbone, config.model.small_input) == ("torchvision:resnet18", True)
    assert (config.optim.lr, config.optim.weight_decay) == (1e-4, 2e-6)
    assert (config.data.batch_size, config.train.epochs) == (128, 100)
    params = config.method
    assert (params.proj_dim, params.crop_size, params.feature_dim) == (64, 32, 2048)
    assert params.coordinate_clamp == 10.0
    method = build("msimclr", dim=2, n_charts=3)
    assert method.features.out_features == 2048 and method.head.coordinates.in_features == 2048
    view1, _ = method.augment(images())
    assert view1.shape[-2:] == (32, 32)  # crops of 32 also from smaller images


@pytest.mark.parametrize("name", ["msimclr", "simclr"])
def test_simclr_heads_are_as_wide_as_d_unless_proj_hidden_is_set(name):
    """The authors' heads are d -> d -> 64 (neurve/contrastive/models.py); method.proj_hidden
    widens the hidden layer for kdml's ablation, and the logged head_active term is the share
    of its units the samples switch on."""
    for hidden, width in ((0, 3), (7, 7)):
        method = build(name, dim=3, proj_hidden=hidden)
        assert method.projection.hidden_weight.shape[2] == width
        assert method.projection.output_weight.shape[1:] == (width, 64)
        terms = method(images(), torch.tensor(LABELS)).terms
        assert 0.0 <= float(terms["head_active"]) <= 1.0
    with torch.no_grad():  # every unit off: the projections are 0, NT-Xent at chance
        method.projection.hidden_weight.fill_(-1.0)
    if name == "msimclr":  # sigmoid coordinates are > 0, so every unit stays off
        terms = method(images(), torch.tensor(LABELS)).terms
        assert float(terms["head_active"]) == 0.0
        assert float(terms["nt_xent"]) == pytest.approx(math.log(15), abs=1e-6)


def test_msimclr_clamps_coordinates_before_the_mmd():
    method = build("msimclr", dim=2, n_charts=3, lambda1=1.0, lambda2=0.0).double()
    with torch.no_grad():
        method.head.coordinates.bias.fill_(50.0)  # every coordinate far beyond the clamp
    x = images().double()
    torch.manual_seed(1)
    clamped = method(x, torch.tensor(LABELS)).terms["mmd"]
    torch.manual_seed(1)  # replay the forward's random draws: two views, then two priors
    view1, view2 = method.augment(x)
    prior1, prior2 = torch.rand(8, 2, dtype=torch.float64), torch.rand(8, 2, dtype=torch.float64)
    # each view on its own, as the authors' code forwards them (BatchNorm sees one view)
    first, second = method.charts(view1), method.charts(view2)
    outputs = ChartOutputs(torch.cat([first.coords, second.coords]),
                           torch.cat([first.q, second.q]))
    assert bool((outputs.coords > 10).all())
    at_ten = torch.full_like(outputs.coords, 10.0)  # the authors' clamp: [-10, 10]
    expected = 0.5 * (ManifoldMMD(2, 3)(at_ten[:8], outputs.q[:8], prior1)
                      + ManifoldMMD(2, 3)(at_ten[8:], outputs.q[8:], prior2)).item()
    assert float(clamped) == pytest.approx(expected, rel=1e-9)
    method.clamp = 0.0
    torch.manual_seed(1)
    free = method(x, torch.tensor(LABELS)).terms["mmd"]
    assert float(clamped) != pytest.approx(float(free))


@pytest.mark.parametrize("name", ["msimclr", "simclr"])
@pytest.mark.parametrize("joint", [False, True])
def test_simclr_recipes_forward_each_view_on_its_own(name, joint):
    """The authors' code forwards the two views one after the other
    (neurve/contrastive/trainer.py), so BatchNorm normalises each view's images alone and
    updates its running statistics twice a step; one batch of both views had mixed them (now
    ``method.joint_views=true``)."""
    method = build(name, joint_views=joint)
    norms = [module for module in method.backbone.modules()
             if isinstance(module, torch.nn.BatchNorm2d)]
    assert norms, "the test needs a backbone with BatchNorm"
    batches = []
    hooks = [norm.register_forward_pre_hook(lambda _, args: batches.append(len(args[0])))
             for norm in norms[:1]]
    method(images(num=8), torch.tensor(LABELS))
    for hook in hooks:
        hook.remove()
    assert batches == ([16] if joint else [8, 8])
    assert int(norms[0].num_batches_tracked) == (1 if joint else 2)


@pytest.mark.parametrize("name", ["msimclr", "simclr"])
def test_simclr_recipes_augment_raw_images_then_normalise(name, monkeypatch):
    """The colour jitter works on [0, 1] images; the backbone's normalisation comes after it
    (and the trainer leaves training batches unnormalised for these methods)."""
    from kdml.data.transforms import Normalization
    from kdml.training.build import build_pipeline

    method = build(name)
    method.backbone.normalization = Normalization((0.5,), (0.25,))
    seen = {}
    augment_forward = method.augment.forward

    def recording_augment(inputs, *args):
        seen["augmented"] = inputs
        views = augment_forward(inputs, *args)
        seen["views"] = torch.cat(views)
        return views

    original_forward = method.backbone.forward

    def recording_forward(inputs):
        seen.setdefault("backbone", []).append(inputs)
        return original_forward(inputs)

    monkeypatch.setattr(method.augment, "forward", recording_augment)
    monkeypatch.setattr(method.backbone, "forward", recording_forward)
    x = images()
    method(x, torch.tensor(LABELS))
    assert seen["augmented"] is x
    # one view at a time (test_simclr_recipes_forward_each_view_on_its_own)
    assert torch.allclose(torch.cat(seen["backbone"]), (seen["views"] - 0.5) / 0.25)
    assert method.augments_inputs

    class Train:  # what build_pipeline reads of the training samples
        is_file_backed = False
        sample_shape = (1, 8, 8)

    recipe = next(r for r in RECIPES if r.name == name)
    config = resolve_config(name, recipe.params, recipe.defaults)
    assert build_pipeline(config, Train, method).method_augments
    assert not build_pipeline(config, Train, build("mtriplet")).method_augments


def test_atlas_methods_built_directly_check_their_settings():
    """A temperature of 0 gave a NaN loss, a negative margin trained the wrong way round."""
    from kdml.training.recipes.atlas import (
        MSimCLRMethod,
        MTripletMethod,
        SimCLRMethod,
        TripletMethod,
    )

    backbone = SmallCNN(1, 16)
    with pytest.raises(KdmlError, match=r"^method.tau must be at least 1.2e-38 \(.*\), got 0.0$"):
        SimCLRMethod(backbone, SimCLRParams(tau=0.0))
    with pytest.raises(KdmlError, match=r"^method.tau must be at least 1.2e-38 \(.*\), got -1.0$"):
        MSimCLRMethod(backbone, MSimCLRParams(tau=-1.0))
    with pytest.raises(KdmlError, match=r"margin"):
        TripletMethod(backbone, TripletParams(margin=-1))
    with pytest.raises(KdmlError, match=r"lambda1"):
        MTripletMethod(backbone, MTripletParams(lambda1=-1))
    with pytest.raises(KdmlError, match=r"^nt_xent_loss needs a temperature that is a finite "
                                        r"number > 0, at least 1.2e-38 .*, got 0$"):
        nt_xent_loss(torch.randn(4, 3), 0)
    views = torch.randn(4, 3)  # a learned temperature (a tensor) is taken as it is
    assert torch.equal(nt_xent_loss(views, torch.tensor(0.5)), nt_xent_loss(views, 0.5))


def test_projection_heads_are_initialised_per_chart_as_linear_layers():
    """Each chart's layers get nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in being the
    chart layer's input width (hidden 32 from d = 4, output 64 from 32): a bound from the
    output width, or of 1, had passed every test."""
    from kdml.models.atlas_heads import ProjectionHeads

    torch.manual_seed(0)
    heads = ProjectionHeads(dim=4, n_charts=16, out_features=64, hidden=32)
    for weight, fan_in in ((heads.hidden_weight, 4), (heads.output_weight, 32)):
        values, bound = weight.detach().double(), 1 / math.sqrt(fan_in)
        assert 0.98 * bound < values.abs().max().item() <= bound
        assert values.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)


def test_simclr_augment_grayscale_and_jitter_settings_shape_its_views():
    """grayscale_p and jitter_strength could be hard-coded at their defaults (0.2, 0.5) and
    every test had passed: here p = 1 greys every view, p = 0 none, and strength 0 leaves the
    colours as the crop gives them."""
    images = torch.rand(16, 3, 12, 12, generator=torch.Generator().manual_seed(0))

    def view(**settings):
        augment = SimCLRAugment(crop_scale=(1.0, 1.0), **settings)
        return augment.view(images, torch.Generator().manual_seed(1))

    grey = view(jitter_p=0.0, grayscale_p=1.0)
    assert torch.allclose(grey[:, 0], grey[:, 1]) and torch.allclose(grey[:, 1], grey[:, 2])
    colour = view(jitter_p=0.0, grayscale_p=0.0)
    assert not torch.allclose(colour[:, 0], colour[:, 1])
    unjittered = view(jitter_p=1.0, jitter_strength=0.0, grayscale_p=0.0)
    assert torch.allclose(unjittered, colour, atol=1e-6)
    jittered = view(jitter_p=1.0, jitter_strength=0.5, grayscale_p=0.0)
    assert not torch.allclose(jittered, colour, atol=1e-3)


@pytest.mark.parametrize("recipe", ["mtriplet", "triplet"])
def test_triplet_methods_refuse_labels_they_cannot_take_in_one_line(recipe):
    """Called from a PML loop, labels left on another device failed inside the triplet loss
    with torch's "Tensor on device meta is not on the expected device cpu!" (the meta device
    stands in for a GPU), where JRDMethod refuses them in one line."""
    backbone = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 8))
    backbone.feature_size = 8
    method = (MTripletMethod(backbone, MTripletParams(n_charts=2)) if recipe == "mtriplet"
              else TripletMethod(backbone, TripletParams()))
    owner = type(method).__name__
    inputs, labels = torch.randn(6, 16), torch.tensor([0, 0, 1, 1, 2, 2])
    with pytest.raises(KdmlError, match=rf"^{owner}: the labels are on meta but the inputs on "
                                        r"cpu; move the labels with labels\.to\(inputs\.device\)$"):
        method(inputs, labels.to("meta"))
    with pytest.raises(KdmlError, match=rf"^{owner}: labels must be integers, got dtype "
                                        r"torch\.float32$"):
        method(inputs, labels.float())
    assert torch.isfinite(method(inputs, labels.int()).loss)


@pytest.mark.parametrize("name", ["msimclr", "simclr"])
@pytest.mark.parametrize("weights", ["", "backbone.pth"])
def test_simclr_recipes_drop_the_normalisation_of_a_from_scratch_backbone_only(name, weights):
    """From scratch, the SimCLR recipes feed the augmented [0, 1] images as they are (the
    authors' ToTensor without Normalize); a backbone with pretrained weights (model.weights)
    keeps the normalisation its weights were trained with."""
    from kdml.data.transforms import Normalization

    recipe = next(r for r in RECIPES if r.name == name)
    config = RunConfig(recipe=name, method=recipe.params())
    config.model.weights = weights
    backbone = tiny_backbone()
    imagenet = Normalization((0.485,), (0.229,))
    backbone.normalization = imagenet
    method = recipe.build(config, backbone, 4)
    expected = imagenet if weights else Normalization()
    assert method.backbone.normalization == expected


@pytest.mark.parametrize("name", ["msimclr", "simclr"])
@pytest.mark.parametrize("flip", [False, True])
def test_the_simclr_recipes_augment_with_their_view_settings(name, flip):
    """method.horizontal_flip, crop_scale_min and crop_size reach the views' augmentation (the
    flip is off for digits by default and on where a config asks for it)."""
    method = build(name, horizontal_flip=flip, crop_scale_min=0.3, crop_size=6)
    assert method.augment.horizontal_flip is flip
    assert (method.augment.crop_scale, method.augment.size) == ((0.3, 1.0), 6)
