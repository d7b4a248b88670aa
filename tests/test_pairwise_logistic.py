"""DDML's pairwise generalized logistic loss (Hu, Lu & Tan, CVPR 2014) and the
``ddml-logistic`` recipe: a literal reference, gradients, bad inputs, a training run."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kdml import cli
from kdml.config import resolve_config
from kdml.errors import KdmlError
from kdml.kernels import FLOAT32_SETTING_RANGE
from kdml.losses.pairwise_logistic import PairwiseLogisticLoss, pairwise_logistic_loss
from kdml.models.backbones import FlattenInputs
from kdml.models.method import StepOutput
from kdml.training.recipes import get_recipe
from kdml.training.recipes.dtml import DDMLLogisticMethod


def literal_ddml_loss(embeddings: torch.Tensor, labels: torch.Tensor, threshold: float,
                      sharpness: float) -> tuple[float, float]:
    """The paper's J_1 = 1/2 sum over ordered pairs i != j of g(1 - l_ij (tau - d2_ij)), with
    plain Python floats; returns (J_1, J_1 / number of unordered pairs)."""
    rows = embeddings.double().tolist()
    classes = labels.tolist()
    n = len(rows)
    total = 0.0
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            d2 = sum((a - b) ** 2 for a, b in zip(rows[i], rows[j], strict=True))
            sign = 1.0 if classes[i] == classes[j] else -1.0
            z = 1.0 - sign * (threshold - d2)
            total += 0.5 * math.log1p(math.exp(sharpness * z)) / sharpness
    pairs = n * (n - 1) // 2
    return total, total / pairs


def random_batch(seed: int, n: int, dim: int, num_classes: int):
    generator = torch.Generator().manual_seed(seed)
    embeddings = torch.randn(n, dim, generator=generator, dtype=torch.float64)
    labels = torch.randint(0, num_classes, (n,), generator=generator)
    return embeddings, labels


BATCHES = [
    pytest.param(*random_batch(0, 12, 4, 3), id="three-classes"),
    pytest.param(*random_batch(1, 9, 3, 2), id="two-classes"),
    pytest.param(random_batch(2, 7, 5, 1)[0], torch.zeros(7, dtype=torch.long),
                 id="single-class"),
    pytest.param(random_batch(3, 8, 2, 1)[0], torch.arange(8), id="all-distinct-classes"),
    pytest.param(random_batch(4, 2, 6, 1)[0], torch.tensor([5, 5]), id="one-pair"),
    pytest.param(0.3 * random_batch(5, 10, 4, 1)[0], torch.arange(10) % 4, id="close-points"),
]


@pytest.mark.parametrize(("embeddings", "labels"), BATCHES)
@pytest.mark.parametrize(("threshold", "sharpness"), [(3.0, 2.0), (1.5, 0.5), (6.0, 5.0)])
def test_the_loss_equals_the_literal_double_sum(embeddings, labels, threshold, sharpness):
    summed, mean = literal_ddml_loss(embeddings, labels, threshold, sharpness)
    got_mean = pairwise_logistic_loss(embeddings, labels, threshold, sharpness)
    got_sum = pairwise_logistic_loss(embeddings, labels, threshold, sharpness, reduction="sum")
    assert got_mean.dtype == torch.float64
    # softplus is linear above beta*z = 20: at most log1p(e^-20) ~ 2e-9 off per pair
    assert got_mean.item() == pytest.approx(mean, rel=1e-9, abs=1e-8)
    assert got_sum.item() == pytest.approx(summed, rel=1e-9, abs=1e-8)
    module = PairwiseLogisticLoss(threshold, sharpness)
    assert module(embeddings, labels).item() == pytest.approx(mean, rel=1e-9, abs=1e-8)


def test_the_loss_does_not_depend_on_the_order_or_the_label_values():
    embeddings, labels = random_batch(6, 10, 3, 3)
    order = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    reference = pairwise_logistic_loss(embeddings, labels)
    shuffled = pairwise_logistic_loss(embeddings[order], labels[order])
    relabelled = pairwise_logistic_loss(embeddings, 7 * labels + 100)
    assert shuffled.item() == pytest.approx(reference.item(), rel=1e-12)
    assert relabelled.item() == pytest.approx(reference.item(), rel=1e-12)


def test_satisfied_pairs_cost_little_and_violated_pairs_grow_linearly():
    """Positive pairs at d2 = 0 and negative pairs far beyond tau + 1 cost ~0; a pair that
    violates its constraint by a lot costs ~ its violation (g(z) -> z)."""
    labels = torch.tensor([0, 0, 1, 1])
    separated = torch.tensor([[0.0], [0.0], [10.0], [10.0]], dtype=torch.float64)
    assert pairwise_logistic_loss(separated, labels, threshold=3.0, sharpness=5.0).item() < 1e-4
    swapped = pairwise_logistic_loss(separated, torch.tensor([0, 1, 0, 1]), threshold=3.0,
                                     sharpness=5.0, reduction="sum")
    # 2 positive pairs at d2 = 100: z = 1 - (3 - 100) = 98; 2 negative pairs at d2 = 0: z = 4;
    # 2 negative pairs at d2 = 100: z = -96, g ~ 0
    assert swapped.item() == pytest.approx(2 * 98 + 2 * 4, rel=1e-6)


def test_large_values_stay_finite_without_overflow():
    embeddings = 1e3 * random_batch(7, 6, 3, 1)[0]
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    loss = pairwise_logistic_loss(embeddings, labels, threshold=3.0, sharpness=50.0)
    assert math.isfinite(loss.item()) and loss.item() > 1e4


def test_a_sharp_loss_is_the_hinge_without_overflow():
    """softplus(beta * z) / beta overflowed float32 in beta * z: beta = 1e37 gave an inf loss
    for a positive pair at d^2 = 100 (z = 98), beta = 1e39 a NaN loss and NaN gradients. The
    loss is now the hinge it tends to, and a beta outside float32's normal range is refused
    in one line, as the kernels' settings are."""
    embeddings = torch.tensor([[0.0], [10.0], [1.0], [1.5]])
    labels = torch.tensor([0, 0, 1, 1])
    hinge = pairwise_logistic_loss(embeddings.double(), labels, sharpness=1e6)
    for dtype in (torch.float32, torch.float64):
        points = embeddings.to(dtype).clone().requires_grad_()
        loss = pairwise_logistic_loss(points, labels, sharpness=1e37)
        loss.backward()
        assert loss.item() == pytest.approx(hinge.item(), rel=1e-6)
        assert torch.isfinite(points.grad).all()
    for sharpness in (1e39, 1e-39):
        with pytest.raises(KdmlError, match=r"^sharpness \(DDML's beta\) .* is outside "
                                            r"\[1\.18e-38, 8\.51e\+37\]"):
            PairwiseLogisticLoss(sharpness=sharpness)


def test_fewer_than_two_samples_give_zero_attached_to_the_graph():
    single = torch.randn(1, 3, requires_grad=True)
    loss = pairwise_logistic_loss(single, torch.tensor([0]))
    assert loss.item() == 0.0 and loss.requires_grad
    loss.backward()
    assert torch.equal(single.grad, torch.zeros(1, 3))


def test_low_precision_inputs_are_computed_in_float32():
    embeddings, labels = random_batch(8, 8, 4, 2)
    half = pairwise_logistic_loss(embeddings.to(torch.bfloat16), labels)
    assert half.dtype == torch.float32
    reference = pairwise_logistic_loss(embeddings.to(torch.bfloat16).double(), labels)
    assert half.item() == pytest.approx(reference.item(), rel=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(("threshold", "sharpness"), [(3.0, 2.0), (0.5, 4.0)])
def test_gradcheck_in_float64(reduction, threshold, sharpness):
    embeddings, labels = random_batch(9, 7, 3, 3)
    embeddings.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: pairwise_logistic_loss(x, labels, threshold, sharpness, reduction),
        (embeddings,), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_descent_pulls_far_positives_together_and_pushes_near_negatives_apart():
    """A positive pair beyond tau - 1 and a negative pair within tau + 1 both violate their
    constraint: a descent step shrinks the first distance and grows the second."""
    for labels, sign in ((torch.tensor([0, 0]), -1.0), (torch.tensor([0, 1]), 1.0)):
        for gap in (0.5, 1.5, 2.5):  # d2 = 0.25 .. 6.25 around tau -+ 1 = 2, 4
            x = torch.tensor([[0.0, 0.0], [gap, 0.0]], dtype=torch.float64, requires_grad=True)
            pairwise_logistic_loss(x, labels, threshold=3.0, sharpness=2.0).backward()
            moved = (x - 1e-3 * x.grad).detach()
            change = (moved[1] - moved[0]).norm() - gap
            assert change * sign > 0, (labels.tolist(), gap)


def test_defaults_are_ddml_s_threshold_3_and_sharpness_2():
    """DDML's tau = 3 and beta = 2 when not given, in the function and the module. Pairs of
    [0], [1], [3] with labels 0, 0, 1: d2 = 1 (same), 9 and 4 (other), z = -1, -5, 0."""
    x, labels = torch.tensor([[0.0], [1.0], [3.0]], dtype=torch.float64), torch.tensor([0, 0, 1])
    expected = (math.log1p(math.exp(-2.0)) + math.log1p(math.exp(-10.0)) + math.log(2.0)) / 6
    assert pairwise_logistic_loss(x, labels).item() == pytest.approx(expected, rel=1e-12)
    module = PairwiseLogisticLoss()
    assert (module.threshold, module.sharpness) == (3.0, 2.0)
    assert module(x, labels).item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("threshold", [0.0, -2.5])
def test_a_threshold_of_zero_or_below_is_accepted(threshold):
    """Any finite tau is a setting (only the sharpness must be > 0): tau = 0 and tau < 0 are
    taken, not refused, and give the literal sum."""
    embeddings, labels = random_batch(0, 6, 3, 2)
    _, mean = literal_ddml_loss(embeddings, labels, threshold, 2.0)
    # softplus is linear above beta*z = 20: at most log1p(e^-20) ~ 2e-9 off per pair
    assert pairwise_logistic_loss(embeddings, labels, threshold).item() == pytest.approx(
        mean, rel=1e-9, abs=1e-8)
    assert PairwiseLogisticLoss(threshold)(embeddings, labels).item() == pytest.approx(
        mean, rel=1e-9, abs=1e-8)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sharpness": 0.0}, "sharpness"),
    ({"sharpness": -1.0}, "sharpness"),
    ({"sharpness": float("nan")}, "sharpness"),
    ({"sharpness": float("inf")}, "sharpness"),
    ({"sharpness": True}, "sharpness"),
    ({"threshold": float("nan")}, "threshold"),
    ({"threshold": float("-inf")}, "threshold"),
    ({"reduction": "max"}, "reduction"),
])
def test_bad_settings_raise_one_line_errors(kwargs, message):
    embeddings, labels = random_batch(10, 4, 2, 2)
    for build in (lambda: PairwiseLogisticLoss(**kwargs),
                  lambda: pairwise_logistic_loss(embeddings, labels, **kwargs)):
        with pytest.raises(KdmlError, match=message) as error:
            build()
        assert "\n" not in str(error.value)


@pytest.mark.parametrize(("embeddings", "labels"), [
    (torch.randn(4), torch.tensor([0, 0, 1, 1])),
    (torch.randn(4, 2), torch.tensor([0, 0, 1])),
    (torch.randn(4, 2), torch.tensor([[0, 0, 1, 1]])),
    (torch.ones(4, 2, dtype=torch.long), torch.tensor([0, 0, 1, 1])),
])
def test_bad_inputs_raise_one_line_errors(embeddings, labels):
    with pytest.raises(KdmlError, match="pairwise logistic loss expects") as error:
        pairwise_logistic_loss(embeddings, labels)
    assert "\n" not in str(error.value)


# ----------------------------------------------------------------------------- the recipe


def build(*overrides: str, input_size: int = 6):
    recipe = get_recipe("ddml-logistic")
    config = resolve_config(recipe.name, recipe.params, recipe.defaults, overrides=list(overrides))
    return config, recipe.build(config, FlattenInputs((input_size,)), 3)


def test_recipe_defaults_are_the_dtml_family_network_and_ddml_parameters():
    config, method = build(input_size=64)
    assert isinstance(method, DDMLLogisticMethod) and not method.uses_target
    params = config.method
    assert (params.threshold, params.sharpness, params.weight_decay) == (3.0, 2.0, 1e-2)
    assert (params.activation, params.init, params.layer_sizes) == ("tanh", "identity", [])
    assert config.eval.metric == "euclidean" and config.model.backbone == "identity"
    network = method.backbone
    assert network.layer_sizes == (64, 64, 32)  # [d, d // 2], as dtml/ddml
    for layer in network.layers:  # identity initialisation
        assert torch.equal(layer.weight, torch.eye(*layer.weight.shape))
        assert torch.equal(layer.bias, torch.zeros_like(layer.bias))


def test_the_recipe_has_no_domain_weight_called_beta():
    """DDML's beta is `sharpness`: `beta` is DTML's domain weight and is not a key here."""
    with pytest.raises(KdmlError, match="unknown config key"):
        build("method.beta=2")
    assert build("method.sharpness=4")[0].method.sharpness == 4.0


@pytest.mark.parametrize(("override", "message"), [
    ("method.sharpness=0", "sharpness"),
    ("method.sharpness=-2", "sharpness"),
    ("method.weight_decay=-0.1", "weight_decay"),
    ("method.threshold=nan", "threshold"),
    ("method.activation=swish", "activation"),
])
def test_bad_recipe_settings_raise_one_line_errors(override, message):
    with pytest.raises(KdmlError, match=message) as error:
        build(override)
    assert "\n" not in str(error.value)


def test_a_training_step_is_the_pair_loss_plus_half_lambda_times_the_penalty():
    # threshold and sharpness not at their defaults: a recipe that ignored them passed
    config, method = build("method.weight_decay=0.3", "method.threshold=1.5",
                           "method.sharpness=4")
    generator = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    inputs = torch.randn(9, 6, generator=generator) + labels[:, None].float()
    before = [p.detach().clone() for p in method.parameters()]
    output = method(inputs, labels)
    assert isinstance(output, StepOutput) and output.embeddings.shape == (9, 3)
    embeddings = method.embed(inputs)
    expected_pairs = pairwise_logistic_loss(embeddings, labels, 1.5, 4.0)
    penalty = method.backbone.weight_penalty()
    assert output.terms["pair_loss"].item() == pytest.approx(expected_pairs.item(), rel=1e-6)
    assert output.terms["weight_penalty"].item() == pytest.approx(penalty.item(), rel=1e-6)
    assert output.loss.item() == pytest.approx(
        expected_pairs.item() + 0.15 * penalty.item(), rel=1e-6)
    assert output.terms["loss"].item() == pytest.approx(output.loss.item())
    optimizer = torch.optim.SGD(method.param_groups(config.optim), lr=0.1)
    output.loss.backward()
    optimizer.step()
    assert all(not torch.equal(b, p) for b, p in zip(before, method.parameters(), strict=True))


def test_zero_weight_decay_leaves_the_penalty_out():
    _, method = build("method.weight_decay=0")
    output = method(torch.randn(4, 6), torch.tensor([0, 0, 1, 1]))
    assert "weight_penalty" not in output.terms
    assert output.loss.item() == pytest.approx(output.terms["pair_loss"].item())


# ----------------------------------------------------------------------------- end to end

TINY = ["train.epochs=1", "train.steps_per_epoch=5", "data.batch_size=40",
        "data.samples_per_class=4", "eval.nmi=false", "--no-progress", "train.device=cpu",
        "data.num_workers=0"]


def test_kdml_train_ddml_logistic_on_a_domain_pair(tmp_path):
    out = tmp_path / "run"
    assert cli.main(["train", "ddml-logistic", "--dataset", "mnist5k->digits", "--out",
                     str(out), *TINY]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    last = metrics["epochs"][-1]
    assert {"train/loss", "train/pair_loss", "train/weight_penalty"} <= set(last)
    assert "train/d_ts" not in last  # no target term
    final = metrics["final"]
    assert 0.0 <= final["source_nn_accuracy"] <= 1.0 and "recall@1" in final


@pytest.mark.slow
def test_two_processes_train_as_one_on_the_concatenated_batch(tmp_path):
    """Under torchrun the pair loss sees the global batch (gathered with its gradient)."""
    from distributed_harness import run_ranks, train_steps, write_domains
    from test_distributed import COMMON, assert_same_training

    features = write_domains(tmp_path / "domains.npz")
    overrides = [*COMMON, f"data.dataset=npz:{features}", "data.batch_size=16",
                 "data.samples_per_class=4", "method.threshold=2"]
    single = run_ranks(1, train_steps, "ddml-logistic", overrides, tmp_path=tmp_path)
    double = run_ranks(2, train_steps, "ddml-logistic", overrides, tmp_path=tmp_path)
    assert_same_training(single, double)


def test_the_ends_of_the_sharpness_range_are_taken():
    """FLOAT32_SETTING_RANGE is closed: its ends are taken and give finite losses, log(2) /
    beta at the low end and the hinge at the high one (mutation audit: < for <= refused
    them)."""
    low, high = FLOAT32_SETTING_RANGE
    points, labels = torch.tensor([[0.0], [1.0]]), torch.tensor([0, 1])  # z = 1 + 3 - 1 = 3
    assert pairwise_logistic_loss(points, labels, sharpness=low).item() == pytest.approx(
        math.log(2.0) / low, rel=1e-6)
    assert PairwiseLogisticLoss(sharpness=high)(points, labels).item() == pytest.approx(3.0)
