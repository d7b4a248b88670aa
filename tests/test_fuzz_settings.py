"""Training settings against what README.md's configuration table and docs/recipes.md promise,
as a fuzzing session of the settings found them: a setting refused only after the run folder
was made, in words that do not name it; settings that a recipe or another setting makes
inert, taken without a word (where kdml refuses or warns about others of the kind:
data.pca_dim, data.train_classes, model.small_input, train.sharded_kernels, model.pooling,
model.embedding_size)."""

from __future__ import annotations

import numpy as np
import pytest

from kdml import cli
from kdml.config import resolve_config
from kdml.errors import KdmlError
from kdml.training.recipes import get_recipe

TINY = ["train.epochs=1", "train.steps_per_epoch=1", "eval.nmi=false", "--no-progress",
        "train.device=cpu"]


def config_of(recipe, *overrides):
    spec = get_recipe(recipe)
    return resolve_config(spec.name, spec.params, spec.defaults, None,
                          ["train.device=cpu", "eval.nmi=false", "data.dataset=digits",
                           "data.num_workers=0", *overrides])


@pytest.mark.parametrize(("recipe", "backbone"), [("ddml-logistic", "cnn"),
                                                  ("ddml-logistic", "auto"),
                                                  ("pca", "mlp")])
def test_a_dtml_family_or_pca_run_with_another_backbone_is_refused_naming_the_setting(
        tmp_path, capsys, recipe, backbone):
    """These recipes' network is the whole model (docs/recipes.md: the identity backbone):
    _build_dtml/_build_pca build the backbone, keep only its feature size and drop it, so any
    other model.backbone (README lists auto, cnn, mlp, ...) fed raw inputs to a network sized
    for the backbone's features. It was found only at the first step, after the run folder was
    made, as 'DTMLNetwork expects 128 input features, got 64', naming no setting."""
    out = tmp_path / "run"
    status = cli.main(["train", recipe, "--dataset", "digits", "--out", str(out),
                       f"model.backbone={backbone}", "data.batch_size=40", *TINY])
    err = capsys.readouterr().err
    assert status == 2
    assert "model.backbone" in err, err
    assert not out.exists(), sorted(p.name for p in out.iterdir())


@pytest.mark.parametrize("recipe", ["dtml", "dstml", "ddml", "ddml-logistic", "pca"])
def test_a_dtml_family_backbone_is_refused_by_the_recipe_before_the_backbones_shape_check(
        tmp_path, capsys, recipe):
    """On the recipes' own domain pair (feature vectors, (64,)), model.backbone=cnn had been
    refused by the backbone's check of the data's shape, "backbone 'cnn' needs square images
    [C, H, W], got (64,)", before the recipe's clearer "must be identity". The recipe's check
    now comes first, before the data is read (check_before_data)."""
    out = tmp_path / "run"
    assert cli.main(["train", recipe, "--out", str(out), "model.backbone=cnn", *TINY]) == 2
    err = capsys.readouterr().err
    assert err == (f"kdml: error: {recipe}'s network is the whole model, fed the flattened "
                   "inputs: model.backbone must be identity, got 'cnn'; drop the setting\n")
    assert not out.exists()


@pytest.mark.parametrize(("recipe", "batch", "m"), [
    ("triplet", 5, 1),  # one sample per class: no positive pair
    ("mtriplet", 5, 1),
    ("mtriplet", 4, 4),  # one class per batch: no negative
    ("jrd", 4, 4),  # one class per batch: JRS has no different-class pair
    ("intra", 5, 1),  # one sample per class: the intra-class penalty has no pair
])
def test_class_balanced_batches_that_zero_the_metric_term_are_refused(recipe, batch, m):
    """data.samples_per_class=1 gives batches of distinct classes, and data.batch_size equal
    to it batches of one class: a batch-all triplet loss then has no (anchor, positive) or no
    negative in any batch, and JRS (over different-class pairs) nothing to compare, so the
    term is exactly 0 at every step (train/triplet and train/active_triplets 0.0,
    train/regularizer 0.0) and the run trains without its metric loss, without a word."""
    config = config_of(recipe, f"data.samples_per_class={m}", f"data.batch_size={batch}")
    from kdml.training.trainer import Session
    with pytest.raises(KdmlError, match=r"(samples_per_class=1 puts 1 sample of each class|"
                                        r"puts one class in each batch).* would be 0 at every"):
        Session.build(config, echo=lambda line: None)


def _feature_pair(path):
    """A small npz domain pair: 3 source classes of 10, a target of 12 (4 unlabelled)."""
    features = np.random.default_rng(0).normal(size=(42, 5)).astype(np.float32)
    labels = np.concatenate([np.repeat(np.arange(3), 10), np.tile(np.arange(4) - 1, 3)])
    np.savez(path, X=features, y=labels, domain=np.array([0] * 30 + [1] * 12))
    return f"data.dataset=npz:{path}"


@pytest.mark.parametrize(("recipe", "batch", "m", "term"), [
    ("dtml", 3, 1, "S_c"),  # one sample per class: no same-class pair, S_c is 0
    ("dstml", 3, 1, "S_c"),
    ("ddml", 4, 4, "S_b"),  # one class per batch: no different-class pair, S_b is 0
    ("dtml", 4, 4, "S_b"),
    ("ddml-logistic", 3, 1, "similar pairs"),  # no pair of one class: it only pushes apart
    ("ddml-logistic", 4, 4, "dissimilar pairs"),  # no pair of different classes
])
def test_class_balanced_batches_that_zero_a_dtml_family_term_are_refused(
        tmp_path, recipe, batch, m, term):
    """As for the triplet and JRS recipes above: `kdml train dtml data.batch_size=10
    data.samples_per_class=1` trained with train/s_c = 0 at every step (the compactness of
    Eq. 4, DTML's main term, gone), and data.batch_size=8 data.samples_per_class=8 with
    train/s_b = 0 (Eq. 5, so the objective only shrinks the embedding), under a warning that
    said the samples "use all they have". DDML's pairwise logistic loss, likewise, kept only
    its dissimilar pairs (pushing apart) or its similar ones (pulling together)."""
    config = config_of(recipe, _feature_pair(tmp_path / "pair.npz"),
                       f"data.samples_per_class={m}", f"data.batch_size={batch}")
    from kdml.training.trainer import Session
    with pytest.raises(KdmlError, match=rf"(samples_per_class=1 puts 1 sample of each class|"
                                        rf"puts one class in each batch).*{term}.* would be 0 at "
                                        "every"):
        Session.build(config, echo=lambda line: None)


def test_one_class_batches_are_taken_for_the_compactness_alone(tmp_path):
    """method.alpha=0 drops S_b (the compactness-only ablation): one class a batch is then
    no loss of a term, and is taken."""
    config = config_of("dtml", _feature_pair(tmp_path / "pair.npz"), "method.alpha=0",
                       "data.samples_per_class=4", "data.batch_size=4")
    from kdml.training.trainer import Session
    assert Session.build(config, echo=lambda line: None).method.batch_needs[1] == 1


def test_one_class_batches_are_taken_without_a_regularizer():
    """method.alpha=0 is AM-Softmax alone (the regularizer is not computed): JRS's need of
    two classes a batch is then no need, and one class a batch is taken."""
    config = config_of("jrd", "method.alpha=0", "data.samples_per_class=4",
                       "data.batch_size=4")
    from kdml.training.trainer import Session
    assert Session.build(config, echo=lambda line: None).method.batch_needs == (1, 1, "")


def test_the_whole_split_as_one_batch_is_not_checked_as_class_balanced():
    """data.batch_size=0 is the whole split as one batch, which holds every class whatever
    data.samples_per_class: it is not refused as "one class in each batch" (0 // m = 0)."""
    config = config_of("jrd", "data.samples_per_class=4", "data.batch_size=0")
    from kdml.training.trainer import Session
    Session.build(config, echo=lambda line: None)


@pytest.mark.parametrize(("recipe", "setting"), [
    ("triplet", "optim.proxy_lr=0.5"),  # triplet has no proxies
    ("mtriplet", "optim.proxy_lr=0.5"),
    ("jrd", "optim.adam_eps=0.5"),  # with optim.name=rmsprop below: RMSprop keeps 1e-8
    ("ddml-logistic", "optim.head_lr=0.5"),  # the DTML network is its "backbone": optim.lr
    ("jrd", "domain.kernel=gaussian"),  # domain.beta is 0: no domain term
    ("jrd", "method.decay_proxies=true"),  # optim.weight_decay is 0: nothing to apply
    ("mrd", "method.pool_kernel=laplace"),  # MRD regularizes the embedding alone
    ("jrd", "train.select_metric=recall@2"),  # no data.validation: no epoch or cell chosen
    ("jrd", "train.select_metric=map@r"),  # validation, but no keep_best, patience or grid
])
def test_a_setting_the_recipe_never_reads_is_warned_of(tmp_path, capsys, recipe,
                                                        setting):
    """As data.pca_dim and model.small_input are refused and model.pooling and
    model.embedding_size warned about where they size nothing, a setting that the recipe's
    optimiser or loss never reads must not be taken silently."""
    extra = {"jrd-optim.adam_eps=0.5": ["optim.name=rmsprop"],
             "ddml-logistic-optim.head_lr=0.5": ["data.batch_size=40"],
             "jrd-train.select_metric=map@r": ["data.validation=0.4"]}.get(
                 f"{recipe}-{setting}", [])
    out = tmp_path / "run"
    status = cli.main(["train", recipe, "--dataset", "digits", "--out", str(out), setting,
                       *extra, *TINY])
    err = capsys.readouterr().err
    key = setting.split("=")[0]
    log = (out / "train.log").read_text() if (out / "train.log").exists() else ""
    assert status == 0, err
    assert f"kdml: warning: {key} is not read by this run: " in err
    assert f"{key} is not read by this run: " in log


def test_a_setting_the_run_reads_is_not_called_unread(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli.main(["train", "jrd", "--dataset", "digits", "--out", str(out),
                     "optim.proxy_lr=0.5", "optim.adam_eps=1e-6", "optim.head_lr=0.5",
                     *TINY]) == 0
    assert "is not read by this run" not in capsys.readouterr().err


@pytest.mark.parametrize("reader", ["train.keep_best=true", "train.patience=2", "grid"])
def test_a_select_metric_something_compares_by_is_not_called_unread(tmp_path, capsys,
                                                                     reader):
    """train.select_metric with data.validation is read by train.keep_best, train.patience
    and a grid's choice of its best cell (where a misspelt one is refused)."""
    grid = tmp_path / "grid.yaml"
    grid.write_text("recipe: jrd\ngrid: {optim.lr: [0.001, 0.002]}\n")
    extra = ["--config", str(grid)] if reader == "grid" else ["jrd", reader]
    status = cli.main(["train", *extra, "--dataset", "digits", "--out", str(tmp_path / "run"),
                       "data.validation=0.4", "train.select_metric=map@r", *TINY])
    err = capsys.readouterr().err
    assert status == 0, err
    assert "is not read by this run" not in err


def test_the_mmd_kernel_of_beta_0_is_said_to_change_the_logged_d_ts():
    """ddml (beta = 0) still logs train/d_ts, measured with method.mmd_kernel: a Gaussian one
    gave 0.1035 where the linear one gave 0.3504 (2 steps on mnist5k->digits), and the
    warning said only "method.mmd_kernel is not read by this run: method.beta=0 adds no
    domain term", so a user comparing ddml's train/d_ts with a Gaussian dtml's dropped it."""
    config, default = config_of("ddml", "method.mmd_kernel=gaussian"), config_of("ddml")
    [(setting, why)] = config.method.unread_settings(default.method)
    assert setting == "method.mmd_kernel" and "train/d_ts" in why


def unread_method_settings(recipe, *overrides):
    config = config_of(recipe, *overrides)
    default = config_of(recipe)
    return [setting for setting, _ in config.method.unread_settings(default.method)]


@pytest.mark.parametrize(("recipe", "overrides", "unread"), [
    # a layer's kernel that method.layers leaves out
    ("mrd", ["method.pool_kernel=laplace", "method.cls_num_kernels=3"],
     ["method.pool_kernel", "method.cls_num_kernels"]),
    ("jrd-c", ["method.cls_kernel=polynomial", "method.emb_kernel=laplace"],
     ["method.cls_kernel"]),
    # a count of bandwidths of a kernel with none; a multiplier with no Gaussian mixture
    ("jrd", ["method.emb_kernel=laplace", "method.emb_num_kernels=5"],
     ["method.emb_num_kernels"]),
    ("jrd", ["method.pool_num_kernels=1", "method.emb_num_kernels=1", "method.kernel_multiplier=3"],
     ["method.kernel_multiplier"]),
    ("jrd", ["method.kernel_multiplier=3"], []),
    ("jrd", ["method.polynomial_degree=3"], ["method.polynomial_degree"]),
    ("jrd", ["method.polynomial_degree=3", "method.cls_kernel=polynomial"], []),
    # no regularizer at all
    ("jrd", ["method.alpha=0", "method.emb_kernel=laplace", "method.layers=[emb]"],
     ["method.layers", "method.emb_kernel"]),
    # DTML: the MMD's kernel without a domain term or with the linear MMD; tau without omega
    ("ddml", ["method.mmd_kernel=gaussian"], ["method.mmd_kernel"]),
    ("dtml", ["method.mmd_num_kernels=5"], ["method.mmd_num_kernels"]),
    ("dtml", ["method.mmd_kernel=gaussian", "method.mmd_num_kernels=5"], []),
    ("dtml", ["method.tau=0.5"], ["method.tau"]),
    ("dstml", ["method.tau=0.5"], []),
])
def test_a_method_setting_the_objective_never_reads_is_named(recipe, overrides, unread):
    """configs/ and grids vary kernels per layer; MRD (emb alone) and JRD-C (no cls) built
    only their layers' kernels, so a pool or cls kernel given to them, a bandwidth count of a
    one-bandwidth kernel, DTML's tau without omega or its Gaussian MMD settings with beta 0
    trained the same run as the defaults, without a word."""
    assert unread_method_settings(recipe, *overrides) == unread
