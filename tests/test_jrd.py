"""The JRD head, AM-Softmax (Eq. 12), the recipe family and the generalization analysis."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from pytorch_metric_learning.losses import CosFaceLoss

from kdml import cli
from kdml.config import resolve_config
from kdml.errors import KdmlError
from kdml.evaluation.generalization import generalization_terms
from kdml.kernels import GaussianMixtureKernel
from kdml.losses import am_softmax_loss
from kdml.models import MLP, JRDHead
from kdml.regularizers import JointRepresentationSimilarity
from kdml.training.recipes import RECIPES, get_recipe
from kdml.training.recipes.jrd import JRDMethod, JRDParams


def literal_am_softmax(embeddings, proxies, labels, scale, margin) -> float:
    """Eq. 12 with plain loops in float64: proxies [d, C], embeddings L2-normalized [M, d]."""
    total = 0.0
    num_classes = len(proxies[0])
    for x, y in zip(embeddings, labels, strict=True):
        cosines = []
        for c in range(num_classes):
            w = [proxies[k][c] for k in range(len(x))]
            norm = math.sqrt(sum(v * v for v in w))
            cosines.append(sum(a * b / norm for a, b in zip(x, w, strict=True)))
        target = math.exp(scale * (cosines[y] - margin))
        others = sum(math.exp(scale * cosines[c]) for c in range(num_classes) if c != y)
        total += -math.log(target / (target + others))
    return total / len(labels)


def make_method(regularizer=None, layers=(), alpha=0.0, scale=20.0, margin=0.1):
    overrides = [f"alpha={alpha}", f"scale={scale}", f"margin={margin}"]
    params = resolve_config("jrd", get_recipe("jrd").params, overrides=overrides).method
    torch.manual_seed(0)
    return JRDMethod(MLP(6, (12,)), 5, 4, params, regularizer, layers).double()


def test_head_shares_proxies_with_pml_cosface():
    torch.manual_seed(0)
    head = JRDHead(7, 5, 3)
    loss = CosFaceLoss(3, 5)
    loss.W = head.proxies
    pooled, embedding, cosines = head(torch.randn(4, 7))
    assert torch.allclose(cosines, loss.get_cosine(embedding), atol=1e-6)
    assert torch.allclose(embedding.norm(dim=1), torch.ones(4))
    assert pooled.shape == (4, 7)


@pytest.mark.parametrize(("scale", "margin"), [(20.0, 0.1), (1.0, 0.0), (64.0, 0.35)])
def test_am_softmax_loss_equals_pml_cosface(scale, margin):
    torch.manual_seed(0)
    head = JRDHead(7, 5, 6).double()
    pml = CosFaceLoss(6, 5, margin=margin, scale=scale).double()
    pml.W = head.proxies
    features, labels = torch.randn(10, 7, dtype=torch.float64), torch.randint(0, 6, (10,))
    ours = am_softmax_loss(head(features).class_level, labels, scale, margin)
    theirs = pml(head(features).embedding, labels)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-12)
    grads = [torch.autograd.grad(value, head.parameters()) for value in (ours, theirs)]
    for mine, peer in zip(*grads, strict=True):
        assert torch.allclose(mine, peer, rtol=1e-10, atol=1e-12)


def test_checkpoints_holding_pml_s_proxy_copy_still_load():
    method = make_method()
    state = {**method.state_dict(), "am_softmax.W": method.head.proxies.detach().clone()}
    fresh = make_method()
    fresh.load_state_dict(state)  # strict: only the old duplicate is dropped
    assert torch.equal(fresh.head.proxies, method.head.proxies)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        fresh.load_state_dict({**state, "am_softmax.other": torch.zeros(1)})


@pytest.mark.parametrize(("scale", "margin"), [(20.0, 0.1), (1.0, 0.0), (64.0, 0.35)])
def test_am_softmax_matches_eq_12(scale, margin):
    method = make_method(scale=scale, margin=margin)
    inputs, labels = torch.randn(8, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    output = method(inputs, labels)
    embeddings = method.embed(inputs).tolist()
    expected = literal_am_softmax(embeddings, method.head.proxies.tolist(), labels.tolist(),
                                  scale, margin)
    assert output.loss.item() == pytest.approx(expected, rel=1e-9)


def test_jrd_objective_adds_alpha_times_jrs():
    """Guards the objective and the layer order: the pooling kernel (K = 1) differs from the
    embedding's (K = 3), so feeding one layer to the other's kernel changes the value."""
    kernels_reg = JointRepresentationSimilarity(
        [get_recipe("jrd").params(pool_num_kernels=1).kernel(layer)
         for layer in ("pool", "emb", "cls")])
    method = make_method(kernels_reg, ("pool", "emb", "cls"), alpha=0.7)
    inputs, labels = torch.randn(8, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    output = method(inputs, labels)
    reps = method.head(method.backbone(inputs))
    expected = (am_softmax_loss(reps.class_level, labels, 20.0, 0.1)
                + 0.7 * kernels_reg(list(reps), labels))
    assert output.loss.item() == pytest.approx(expected.item(), rel=1e-12)
    assert output.terms["regularizer"] == pytest.approx(kernels_reg(list(reps), labels).item())


def literal_gaussian_mixture(rows, num_kernels, multiplier=2.0):
    """JRD's self-adaptive mixture of Gaussians (Sec. 5.1) with plain loops in float64: tau
    the mean squared distance over the off-diagonal pairs, bandwidths tau * m^(i - K // 2)."""
    count = len(rows)
    d2 = [[sum((a - b) ** 2 for a, b in zip(x, y, strict=True)) for y in rows] for x in rows]
    tau = sum(d2[i][j] for i in range(count) for j in range(count) if i != j) / (
        count * count - count)
    return [[sum(math.exp(-d2[i][j] / (tau * multiplier ** (k - num_kernels // 2)))
                 for k in range(num_kernels)) / num_kernels for j in range(count)]
            for i in range(count)]


def literal_jrs(layers, num_kernels, labels) -> float:
    """Eq. 10 / N_pairs (Eq. 11): the product of the layers' kernels, averaged over the ordered
    pairs of samples of different classes."""
    kernels = [literal_gaussian_mixture(rows, k) for rows, k in zip(layers, num_kernels,
                                                                     strict=True)]
    pairs = [(i, j) for i in range(len(labels)) for j in range(len(labels))
             if labels[i] != labels[j]]
    return sum(math.prod(kernel[i][j] for kernel in kernels) for i, j in pairs) / len(pairs)


@pytest.mark.parametrize(("name", "layers"), [
    ("jrd", ["pooled", "embedding", "class_level"]), ("mrd", ["embedding"]),
    ("jrd-c", ["pooled", "embedding"]), ("jrd-pooling", ["embedding", "class_level"])])
def test_a_jrd_step_optimises_and_logs_the_literal_objective_at_the_paper_s_settings(name,
                                                                                     layers):
    """The recipes at their defaults, the paper's (Sec. 5.1, Table 4: s = 20, m = 0.1,
    alpha = 1, three Gaussians with bandwidth ratio 2 on the pooling and embedding, one on the
    class level): the loss a step optimises and the one it logs are both Eq. 11's
    L_AMS + alpha * L_JRS / N_pairs, here in float64 loops over the head's representations."""
    recipe = get_recipe(name)
    config = resolve_config(name, recipe.params, recipe.defaults, overrides=[
        "model.embedding_size=5"])
    torch.manual_seed(0)
    method = recipe.build(config, MLP(6, (7,)), 4).double()
    labels = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    inputs = torch.randn(len(labels), 6, dtype=torch.float64)
    output = method(inputs, torch.tensor(labels))
    reps = method.head(method.backbone(inputs))
    am_softmax = literal_am_softmax(reps.embedding.tolist(), method.head.proxies.tolist(),
                                    labels, 20.0, 0.1)
    num_kernels = {"pooled": 3, "embedding": 3, "class_level": 1}
    jrs = literal_jrs([getattr(reps, layer).tolist() for layer in layers],
                      [num_kernels[layer] for layer in layers], labels)
    assert float(output.terms["am_softmax"]) == pytest.approx(am_softmax, rel=1e-9)
    assert float(output.terms["regularizer"]) == pytest.approx(jrs, rel=1e-9)
    for total in (output.loss, output.terms["loss"]):  # optimised and logged: one value
        assert total.item() == pytest.approx(am_softmax + 1.0 * jrs, rel=1e-9)
    assert output.loss.requires_grad and not output.terms["loss"].requires_grad


def test_jrd_params_default_to_the_paper_s_settings():
    """Sec. 5.1 and Table 4: s = 20, m = 0.1, alpha = 1, Gaussian kernels, three on the pooling
    and the embedding and one on the class level, bandwidths twice apart, degree 2 for a
    polynomial kernel (Table 4's first); the authors' proxy initialisation and decay are the
    configs' (configs/jrd-*.yaml), not the recipe's."""
    params = JRDParams()
    assert (params.scale, params.margin, params.alpha, params.regularizer, params.layers) == (
        20.0, 0.1, 1.0, "jrs", ["pool", "emb", "cls"])
    assert [(getattr(params, f"{layer}_kernel"), getattr(params, f"{layer}_num_kernels"))
            for layer in ("pool", "emb", "cls")] == [("gaussian", 3), ("gaussian", 3),
                                                     ("gaussian", 1)]
    assert (params.kernel_multiplier, params.polynomial_degree) == (2.0, 2)
    assert (params.proxy_init, params.decay_proxies) == ("normal", False)


def test_jmmd_defaults_to_the_weight_of_the_paper_s_table3():
    # Chu et al. 2020, Table 3 reports JMMD at alpha = 0.1 (JRD at 1); JIntra has no value.
    alphas = {name: resolve_config(name, get_recipe(name).params,
                                   get_recipe(name).defaults).method.alpha
              for name in ("jrd", "jmmd", "jintra")}
    assert alphas == {"jrd": 1.0, "jmmd": 0.1, "jintra": 1.0}


@pytest.mark.parametrize(("name", "layers", "regularizer"), [
    ("jrd", ["pool", "emb", "cls"], "JointRepresentationSimilarity"),
    ("mrd", ["emb"], "JointRepresentationSimilarity"),
    ("jrd-c", ["pool", "emb"], "JointRepresentationSimilarity"),
    ("jrd-pooling", ["emb", "cls"], "JointRepresentationSimilarity"),
    ("jmmd", ["pool", "emb", "cls"], "JointMMD"),
    ("jintra", ["pool", "emb", "cls"], "JointIntra"),
    ("intra", ["emb"], "IntraClassPenalty"),
])
def test_recipes_pick_their_layers(name, layers, regularizer):
    recipe = get_recipe(name)
    config = resolve_config(name, recipe.params, recipe.defaults)
    method = recipe.build(config, MLP(6, (12,)), 4)
    assert type(method.regularizer).__name__ == regularizer
    assert [("pool", "emb", "cls")[i] for i in method.layer_indices] == layers
    assert "amsoftmax" in RECIPES and get_recipe("amsoftmax").build(
        resolve_config("amsoftmax", get_recipe("amsoftmax").params), MLP(6, (12,)), 4
    ).regularizer is None


@pytest.mark.parametrize(("name", "layers"), [
    ("jrd", ["pool", "emb", "cls"]), ("mrd", ["emb"]), ("jrd-c", ["pool", "emb"]),
    ("jrd-pooling", ["emb", "cls"]), ("jmmd", ["pool", "emb", "cls"]),
    ("jintra", ["pool", "emb", "cls"]), ("intra", ["emb"]),
])
def test_recipes_regularize_the_layers_they_name(name, layers):
    """Guards which layer outputs reach the regularizer in the forward pass: Eq. 9's three
    representations recomputed from the backbone and the head's weights. pool_num_kernels=1
    makes the pooling kernel differ from the embedding's, so a swap of the two shows."""
    recipe = get_recipe(name)
    overrides = ["pool_num_kernels=1"] if name != "intra" else []
    config = resolve_config(name, recipe.params, recipe.defaults, overrides=overrides)
    torch.manual_seed(0)
    method = recipe.build(config, MLP(6, (12,)), 4).double()
    inputs, labels = torch.randn(8, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0, 1, 2, 3])
    pooled = method.backbone(inputs)
    embedding = F.normalize(method.head.embedding.linear(pooled), dim=1)
    cosines = embedding @ F.normalize(method.head.proxies, dim=0)
    outputs = {"pool": pooled, "emb": embedding, "cls": cosines}
    expected = method.regularizer([outputs[layer] for layer in layers], labels)
    assert method(inputs, labels).terms["regularizer"] == pytest.approx(expected.item(),
                                                                        rel=1e-12)


def test_kernel_options_per_layer():
    recipe = get_recipe("jrd")
    config = resolve_config("jrd", recipe.params, recipe.defaults, overrides=[
        "pool_num_kernels=5", "cls_kernel=laplace", "emb_kernel=polynomial",
        "polynomial_degree=5", "kernel_multiplier=3.5"])
    kernels = recipe.build(config, MLP(6, (12,)), 4).regularizer.kernels
    assert kernels[0].num_kernels == 5 and kernels[0].multiplier == 3.5
    assert type(kernels[1]).__name__ == "PolynomialKernel" and kernels[1].degree == 5
    assert type(kernels[2]).__name__ == "LaplaceKernel"
    # each Gaussian layer takes its own count (the emb and cls counts had been untested)
    config = resolve_config("jrd", recipe.params, recipe.defaults, overrides=[
        "pool_num_kernels=2", "emb_num_kernels=4", "cls_num_kernels=5"])
    kernels = recipe.build(config, MLP(6, (12,)), 4).regularizer.kernels
    assert [kernel.num_kernels for kernel in kernels] == [2, 4, 5]
    # in the order the layers are given, as the representations are
    config = resolve_config("jrd", recipe.params, recipe.defaults, overrides=[
        "layers=[cls,emb]", "cls_kernel=laplace"])
    kernels = recipe.build(config, MLP(6, (12,)), 4).regularizer.kernels
    assert [type(kernel).__name__ for kernel in kernels] == ["LaplaceKernel",
                                                             "GaussianMixtureKernel"]


@pytest.mark.parametrize("override", ["layers=[emb,fc]", "layers=[]", "regularizer=mmd",
                                      "emb_kernel=rbf", "alpha=-1", "cls_num_kernels=0"])
def test_bad_jrd_options(override):
    from kdml.errors import KdmlError

    with pytest.raises(KdmlError):
        resolve_config("jrd", get_recipe("jrd").params, overrides=[override])


def test_backbone_head_and_proxies_train_at_their_own_rates():
    method = make_method()
    config = resolve_config("jrd", get_recipe("jrd").params,
                            overrides=["lr=0.5", "head_lr=2", "proxy_lr=3"])
    groups = method.param_groups(config.optim)
    assert [g["lr"] for g in groups] == [0.5, 2.0, 3.0]
    assert {id(p) for p in groups[0]["params"]} == {id(p) for p in method.backbone.parameters()}
    assert {id(p) for p in groups[1]["params"]} == {
        id(p) for name, p in method.named_parameters()
        if name.startswith("head.") and p is not method.head.proxies}
    assert groups[2]["params"] == [method.head.proxies]
    default = resolve_config("jrd", get_recipe("jrd").params, overrides=["lr=0.5"])
    assert method.param_groups(default.optim)[1]["lr"] == 0.5  # head_lr defaults to lr


@pytest.mark.parametrize("init", ["normal", "kaiming"])
def test_proxies_are_initialised_as_method_proxy_init_says(init):
    """normal: N(0, 1), as PML's CosFaceLoss; kaiming: the authors' kaiming_uniform_(a=sqrt(5))
    on the [d, C] matrix, U(-1/sqrt(C), 1/sqrt(C)). Either init could be swapped for the
    other (or randn for rand) and every test had passed."""
    recipe = get_recipe("amsoftmax")
    config = resolve_config("amsoftmax", recipe.params, recipe.defaults, overrides=[
        f"method.proxy_init={init}", "model.embedding_size=64"])
    torch.manual_seed(0)
    proxies = recipe.build(config, MLP(6, (12,)), 200).head.proxies.detach().double()
    assert proxies.shape == (64, 200)
    if init == "normal":
        assert abs(proxies.mean().item()) < 0.03 and proxies.std().item() == pytest.approx(
            1.0, rel=0.03)
    else:
        bound = 1 / math.sqrt(200)
        assert 0.98 * bound < proxies.abs().max().item() <= bound
        assert abs(proxies.mean().item()) < 0.03 * bound
        assert proxies.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.03)


@pytest.mark.parametrize("decay_proxies", [False, True])
def test_proxies_are_decayed_only_with_decay_proxies(decay_proxies):
    """method.decay_proxies=true gives the proxies optim.weight_decay, as the authors' single
    Adam group; by default they get none (a group with 0 had passed every test)."""
    recipe = get_recipe("amsoftmax")
    config = resolve_config("amsoftmax", recipe.params, recipe.defaults, overrides=[
        f"method.decay_proxies={str(decay_proxies).lower()}", "optim.weight_decay=0.003"])
    method = recipe.build(config, MLP(6, (12,)), 4)
    groups = method.param_groups(config.optim)
    proxies = next(group for group in groups if group["params"] == [method.head.proxies])
    assert proxies["weight_decay"] == (0.003 if decay_proxies else 0.0)
    assert all(group["weight_decay"] == 0.003 for group in groups if group is not proxies)


def literal_nn_error(train_x, train_y, test_x, test_y) -> float:
    wrong = 0
    for x, y in zip(test_x, test_y, strict=True):
        dists = [sum((a - b) ** 2 for a, b in zip(x, t, strict=True)) for t in train_x]
        wrong += train_y[int(np.argmin(dists))] != y
    return wrong / len(test_y)


def test_generalization_terms_match_literal_nearest_neighbours():
    rng = np.random.default_rng(3)
    seen, unseen = rng.normal(size=(30, 3)), rng.normal(size=(24, 3)) + 0.5
    seen_y, unseen_y = rng.integers(0, 3, 30), rng.integers(10, 13, 24)
    terms = generalization_terms(seen, seen_y, unseen, unseen_y, repeats=3, seed=7)
    # Replay the same random splits and compute both terms with literal loops.
    replay = np.random.default_rng(7)
    h_values, bd_values, lam_values, unfitted = [], [], [], []
    for _ in range(3):
        s_order, u_order = replay.permutation(30), replay.permutation(24)
        s_fit, s_score, u_fit, u_score = s_order[:15], s_order[15:], u_order[:12], u_order[12:]
        fit_x = np.concatenate([seen[s_fit], unseen[u_fit]])
        fit_domain = [0] * 15 + [1] * 12
        e_s = literal_nn_error(fit_x, fit_domain, seen[s_score], [0] * 15)
        e_u = literal_nn_error(fit_x, fit_domain, unseen[u_score], [1] * 12)
        balanced = min((e_s + e_u) / 2, 1 - (e_s + e_u) / 2)  # better of h and its complement
        h_values.append(1 - balanced)
        bd_values.append(1 - 2 * balanced)
        fit_y = np.concatenate([seen_y[s_fit], unseen_y[u_fit]])
        lam_values.append(literal_nn_error(fit_x, fit_y, seen[s_score], seen_y[s_score])
                          + literal_nn_error(fit_x, fit_y, unseen[u_score], unseen_y[u_score]))
        scored_y = list(seen_y[s_score]) + list(unseen_y[u_score])
        unfitted.append(sum(y not in set(fit_y) for y in scored_y) / len(scored_y))
    assert terms["h_divergence"].values == pytest.approx(h_values)
    assert terms["h_divergence_bd"].values == pytest.approx(bd_values)
    assert terms["lambda"].values == pytest.approx(lam_values)
    assert terms["unfitted"].values == pytest.approx(unfitted)
    half_width = 4.302652729911275 * np.std(lam_values, ddof=1) / math.sqrt(3)  # t_{0.975, 2}
    assert terms["lambda"].ci95 == pytest.approx(half_width)


@pytest.mark.parametrize(("seen_count", "unseen_count"), [(300, 300), (450, 150)])
def test_h_divergence_is_at_chance_for_one_distribution_whatever_the_set_sizes(seen_count,
                                                                              unseen_count):
    """Two samples of one distribution: the balanced error is ~0.5 whatever their sizes (the
    pooled error moved from 0.49 to 0.63 between these two size ratios)."""
    rng = np.random.default_rng(0)
    points = rng.normal(size=(seen_count + unseen_count, 4))
    labels = np.arange(seen_count + unseen_count) % 5
    terms = generalization_terms(points[:seen_count], labels[:seen_count],
                                 points[seen_count:], labels[seen_count:] + 10, repeats=5)
    assert terms["h_divergence"].mean == pytest.approx(0.5, abs=0.04)
    assert terms["h_divergence_bd"].mean == pytest.approx(0.0, abs=0.08)


def test_h_divergence_is_one_for_separated_sets():
    rng = np.random.default_rng(1)
    seen, unseen = rng.normal(size=(60, 2)), rng.normal(size=(40, 2)) + 50
    terms = generalization_terms(seen, np.arange(60) % 3, unseen, np.arange(40) % 2 + 5)
    assert terms["h_divergence"].mean == 1.0 and terms["h_divergence_bd"].mean == 1.0


def test_classes_missing_from_the_fitted_part_are_counted():
    """With 2 of 100 samples fitted, most scored samples are of classes the joint classifier
    never saw: lambda counts them as errors, and ``unfitted`` says how many there are."""
    rng = np.random.default_rng(2)
    seen, unseen = rng.normal(size=(50, 2)), rng.normal(size=(50, 2)) + 9
    labels = np.arange(50) % 10
    few = generalization_terms(seen, labels, unseen, labels + 10, labelled_fraction=0.02)
    assert few["unfitted"].mean >= 0.8 and few["lambda"].mean >= 2 * 0.8
    many = generalization_terms(seen, labels, unseen, labels + 10, labelled_fraction=0.9)
    assert many["unfitted"].mean < few["unfitted"].mean


def test_generalization_terms_take_tensors_and_refuse_bad_inputs():
    """Torch labels used to be compared with NumPy predictions as one bool, so every
    prediction counted as wrong (lambda 2.0 on separated classes); now they are converted."""
    rng = np.random.default_rng(3)
    seen, unseen = rng.normal(size=(40, 2)) * 0.1, rng.normal(size=(40, 2)) * 0.1
    seen[:, 0] += np.arange(40) % 2 * 10
    unseen[:, 1] += np.arange(40) % 2 * 10
    labels = np.arange(40) % 2
    arrays = generalization_terms(seen, labels, unseen + 50, labels + 2, repeats=2)
    tensors = generalization_terms(torch.tensor(seen), torch.tensor(labels),
                                   torch.tensor(unseen + 50), torch.tensor(labels + 2), repeats=2)
    assert arrays["lambda"].mean == 0.0
    assert {key: value.values for key, value in tensors.items()} == {
        key: value.values for key, value in arrays.items()}
    names = np.array(["coat", "shirt"])  # labels the classifiers take as they are
    named = generalization_terms(seen, names[labels], unseen + 50,
                                 np.array(["bag", "boot"])[labels], repeats=2,
                                 neighbors=np.int64(1))
    assert {key: value.values for key, value in named.items()} == {
        key: value.values for key, value in arrays.items()}
    for call, message in [
        (lambda: generalization_terms(seen, labels[:30], unseen, labels + 2),
         r"^seen_labels must have shape \(40,\) to match the embeddings, got \(30,\)$"),
        (lambda: generalization_terms(seen, labels, np.full((40, 2), np.nan), labels + 2),
         r"^unseen contains NaN or infinite values$"),
        (lambda: generalization_terms(seen, labels, unseen[:, :1], labels + 2),
         r"^seen and unseen must have one feature size, got 2 and 1 columns$"),
        (lambda: generalization_terms(seen, labels, unseen, labels + 2, neighbors=0),
         r"^neighbors must be a positive integer, got 0$")]:
        with pytest.raises(KdmlError, match=message):
            call()


def test_generalization_refuses_overlapping_classes():
    from kdml.errors import KdmlError

    x = np.zeros((4, 2))
    with pytest.raises(KdmlError, match="overlap"):
        generalization_terms(x, np.array([0, 0, 1, 1]), x, np.array([1, 1, 2, 2]))


@pytest.mark.slow
def test_jrd_end_to_end_and_analysis(tmp_path, tiny_overrides, capsys):
    out = tmp_path / "jrd"
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(out), "--no-progress",
                     *tiny_overrides]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert {"train/am_softmax", "train/regularizer"} <= metrics["epochs"][-1].keys()
    assert cli.main(["analyze", "generalization", str(out), "--repeats", "3"]) == 0
    printed = capsys.readouterr().out
    assert "H-divergence" in printed and "lambda" in printed
    saved = json.loads((out / "generalization.json").read_text())
    assert 0.0 <= saved["h_divergence"]["mean"] <= 1.0
    assert 0.0 <= saved["lambda"]["mean"] <= 2.0
    assert len(saved["lambda"]["values"]) == 3
    assert "fitted part" not in capsys.readouterr().err
    assert cli.main(["analyze", "generalization", str(out), "--repeats", "2",
                     "--labelled-fraction", "0.001"]) == 0
    assert "of classes with no sample in the fitted part" in capsys.readouterr().err



def test_generalization_terms_refuse_one_split_and_too_many_neighbours():
    """One split has no 95% interval (it would be NaN); k above the fitted samples has no
    k-NN classifier."""
    rng = np.random.default_rng(0)
    seen, unseen = rng.normal(size=(10, 2)), rng.normal(size=(10, 2))
    labels = np.arange(10) % 2
    with pytest.raises(KdmlError, match="at least 2"):
        generalization_terms(seen, labels, unseen, labels + 5, repeats=1)
    with pytest.raises(KdmlError, match=r"neighbors \(11\) is more than the 10 samples"):
        generalization_terms(seen, labels, unseen, labels + 5, repeats=2, neighbors=11)
    assert generalization_terms(seen, labels, unseen, labels + 5, repeats=2,
                                neighbors=10)["lambda"].ci95 >= 0
    # a fractional count or a share that is no number had reached range() or < as a TypeError
    with pytest.raises(KdmlError, match=r"^repeats must be at least 2 .*, got 2\.5$"):
        generalization_terms(seen, labels, unseen, labels + 5, repeats=2.5)
    with pytest.raises(KdmlError, match=r"^labelled_fraction must be in \(0, 1\), got half$"):
        generalization_terms(seen, labels, unseen, labels + 5, labelled_fraction="half")


def test_methods_built_directly_check_their_settings():
    """Built from a config, the recipes' settings are checked when it is read; a user's own
    loop builds the methods directly, and every setting used to be accepted there (a margin
    of 1.5, a regularizer with no weight: computed, logged, and left out of the loss)."""
    from kdml.training.recipes.jrd import AMSoftmaxParams, JRDParams

    def jrd(params, **options):
        return JRDMethod(MLP(6, (12,)), 5, 3, params, **options)

    with pytest.raises(KdmlError, match=r"^method.margin must be in \[0, 1\), got 1.5$"):
        jrd(AMSoftmaxParams(margin=1.5))
    with pytest.raises(KdmlError, match=r"^method.alpha must be >= 0, got -1.0$"):  # as a float
        jrd(JRDParams(alpha=-1))
    for alpha in (float("nan"), float("inf")):  # they had given a NaN or infinite loss
        with pytest.raises(KdmlError, match=rf"^method.alpha must be a finite number, got "
                                            rf"{alpha}$"):
            jrd(JRDParams(alpha=alpha))
    jrs = JointRepresentationSimilarity([GaussianMixtureKernel()])
    with pytest.raises(KdmlError, match=r"^a regularizer needs its weight alpha: pass JRDParams "
                                        r"\(or IntraParams\), not AMSoftmaxParams$"):
        jrd(AMSoftmaxParams(), regularizer=jrs, layers=("emb",))
    with pytest.raises(KdmlError, match=r"^a regularizer needs the layers it sees"):
        jrd(JRDParams(), regularizer=jrs)
    for layers in (("pooling",), "emb"):
        with pytest.raises(KdmlError, match=r"^layers must be a sequence of pool, emb, cls, got"):
            jrd(JRDParams(), regularizer=jrs, layers=layers)
    method = jrd(JRDParams(alpha=0.5), regularizer=jrs, layers=("emb",))
    output = method(torch.randn(8, 6), torch.arange(8) % 3)
    assert torch.allclose(output.loss, output.terms["am_softmax"]
                          + 0.5 * output.terms["regularizer"])


def test_jrd_params_build_their_regularizer_or_are_refused():
    """JRDParams alone had built AM-Softmax, silently: their regularizer, layers and kernels
    were read only by the recipes' builder. from_params builds what they name, as a run does."""
    from kdml.regularizers import JointMMD
    from kdml.training.recipes.jrd import JRDParams

    with pytest.raises(KdmlError, match=r"^JRDParams name a regularizer \(jrs over pool, emb, "
                                        r"cls\) that JRDMethod does not build: use "
                                        r"JRDMethod.from_params"):
        JRDMethod(MLP(6, (12,)), 5, 3, JRDParams())
    params = JRDParams(alpha=0.1, regularizer="jmmd", layers=["emb", "cls"],
                       emb_kernel="laplace")
    torch.manual_seed(0)
    method = JRDMethod.from_params(MLP(6, (12,)), 64, 3, params).double()
    assert isinstance(method.regularizer, JointMMD) and method.alpha == 0.1
    assert [type(kernel).__name__ for kernel in method.regularizer.kernels] == [
        "LaplaceKernel", "GaussianMixtureKernel"]
    # the method a run builds from the same settings, from the same seed
    config = resolve_config("jmmd", get_recipe("jmmd").params, overrides=[
        "alpha=0.1", "regularizer=jmmd", "layers=[emb,cls]", "emb_kernel=laplace",
        "model.embedding_size=64"])
    assert config.method == params
    torch.manual_seed(0)
    built = get_recipe("jmmd").build(config, MLP(6, (12,)), 3).double()
    inputs, labels = torch.randn(9, 6, dtype=torch.float64), torch.arange(9) % 3
    assert torch.equal(method(inputs, labels).loss, built(inputs, labels).loss)


def test_am_softmax_refuses_empty_and_misshapen_batches():
    """An empty batch gave NaN (the mean over no sample)."""
    cosines = torch.zeros(3, 2)
    with pytest.raises(KdmlError, match=r"^am_softmax_loss got an empty batch$"):
        am_softmax_loss(torch.zeros(0, 2), torch.zeros(0, dtype=torch.long), 20.0, 0.1)
    with pytest.raises(KdmlError, match=r"^am_softmax_loss needs cosines \[M, C\] and labels "
                                        r"\[M\], got \(3, 2\) and \(2,\)$"):
        am_softmax_loss(cosines, torch.zeros(2, dtype=torch.long), 20.0, 0.1)
    with pytest.raises(KdmlError, match=r"^am_softmax_loss: labels must be integers, got dtype "
                                        r"torch.float32$"):
        am_softmax_loss(cosines, torch.zeros(3), 20.0, 0.1)
    cosines = torch.rand(3, 2)  # int32, uint8 and bool labels are class indices too, as in JRS
    as_long = am_softmax_loss(cosines, torch.tensor([0, 1, 1]), 20.0, 0.1)
    for dtype in (torch.int32, torch.uint8, torch.bool):
        assert torch.equal(am_softmax_loss(cosines, torch.tensor([0, 1, 1], dtype=dtype), 20.0,
                                           0.1), as_long)


@pytest.mark.parametrize(("labels", "bad"), [([0, 1, 2, 0, 1, 3], 3), ([0, 1, 2, 0, 1, -1], -1)])
@pytest.mark.parametrize("recipe_name", ["amsoftmax", "jrd", "intra"])
def test_labels_outside_the_method_s_classes_are_refused_in_one_line(recipe_name, labels, bad):
    """A PML loop's labels for a method built with too few classes gave torch's "Class values
    must be smaller than num_classes." from inside AM-Softmax (a device-side assert on a GPU)."""
    recipe = get_recipe(recipe_name)
    config = resolve_config(recipe_name, recipe.params, overrides=["model.embedding_size=4"])
    method = recipe.build(config, MLP(6, (12,)), 3)
    with pytest.raises(KdmlError, match=rf"^JRDMethod: labels must be class indices in \[0, 3\), "
                                        rf"as it was built with num_classes=3, got {bad}; number "
                                        r"the classes 0 to 2$"):
        method(torch.randn(6, 6), torch.tensor(labels))
    assert torch.isfinite(method(torch.randn(6, 6), torch.tensor([0, 1, 2, 0, 1, 2])).loss)


def test_the_method_refuses_labels_that_do_not_match_its_inputs_in_one_line():
    """These were refused by am_softmax_loss, about cosines the caller never saw; NumPy inputs
    reached the backbone ("flatten() takes from 0 to 1 positional arguments")."""
    method = JRDMethod.from_params(MLP(6, (12,)), 4, 3, JRDParams())
    inputs, labels = torch.randn(6, 6), torch.tensor([0, 1, 2, 0, 1, 2])
    for bad, shape in ((labels[:5], r"\(5,\)"), (labels[:, None], r"\(6, 1\)")):
        with pytest.raises(KdmlError, match=rf"^JRDMethod needs one label per input, labels \[B\] "
                                            rf"for inputs \[B, \.\.\.\], got labels {shape} for "
                                            r"inputs \(6, 6\)$"):
            method(inputs, bad)
    with pytest.raises(KdmlError, match=r"^JRDMethod takes torch tensors \(the batch's labels and "
                                        r"inputs\), got ndarray; convert with torch.as_tensor$"):
        method(inputs.numpy(), labels)
    with pytest.raises(KdmlError, match=r"^JRDMethod: labels must be integers, got dtype "
                                        r"torch.float32$"):
        method(inputs, labels.float())
    with pytest.raises(KdmlError, match=r"^JRDMethod: the labels are on meta but the inputs on "
                                        r"cpu; move the labels with labels.to\(inputs.device\)$"):
        method(inputs, labels.to("meta"))


@pytest.mark.parametrize(("embedding_size", "num_classes", "message"), [
    (4, 0, "num_classes must be a positive integer, got 0"),  # accepted: [d, 0] proxies
    (4, 2.5, "num_classes must be a positive integer, got 2.5"),  # a TypeError from randn
    (0, 3, "embedding_size must be a positive integer, got 0"),  # accepted: a [0]-wide head
    (4, True, "num_classes must be a positive integer, got True"),
])
def test_the_method_refuses_sizes_that_are_not_positive_integers(embedding_size, num_classes,
                                                                  message):
    with pytest.raises(KdmlError, match=rf"^JRDMethod: {message}$"):
        JRDMethod.from_params(MLP(6, (12,)), embedding_size, num_classes, JRDParams())
