"""Tests from the mutation audit of configuration and data preparation (session 88): each kills
a mutant of src/kdml/config.py or src/kdml/data/{prepare,splits,domains,sample_spec,offline}.py
that the earlier tests let live, checked against an independent statement (the docs, a count
by hand, NumPy)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fixtures_photo_sets import make_inshop

from kdml.config import DataConfig, resolve_config, set_key
from kdml.data.dataset import ArrayDataset
from kdml.data.prepare import prepare_data
from kdml.data.splits import make_splits
from kdml.errors import KdmlError
from kdml.training.recipes import get_recipe


def recipe_defaults(name: str):
    recipe = get_recipe(name)
    return resolve_config(recipe.name, recipe.params, recipe.defaults)


def test_the_defaults_are_those_the_docs_state():
    """docs/datasets.md (train_classes 0.5, holdout_fraction 0.2, select_metric recall@1),
    README's settings table (resize 256, image_size 224), and docs/recipes.md's kdml column for
    JRD (d = 64, Adam at 1e-3 with proxies at 1e-2 and epsilon 1e-8, no schedule, 10 epochs);
    docs/reproduction-dtml.md counts eval.nmi=false a change from the defaults."""
    config = recipe_defaults("jrd")
    assert (config.data.train_classes, config.data.holdout_fraction) == (0.5, 0.2)
    assert (config.data.resize, config.data.image_size) == (256, 224)
    assert config.train.select_metric == "recall@1"
    assert config.model.embedding_size == 64
    assert (config.optim.name, config.optim.lr, config.optim.proxy_lr) == ("adam", 1e-3, 1e-2)
    assert config.optim.adam_eps == 1e-8
    assert (config.optim.lr_step, config.optim.lr_milestones, config.optim.lr_decay) == (
        0, [], 1.0)
    assert config.train.epochs == 10
    assert config.eval.nmi is True
    assert config.data.batch_size == 64  # docs/recipes.md's JRD table: batch, kdml 64
    # README: domain.kernel linear or gaussian, beta * MMD; linear is DTML's Eq. 6
    assert (config.domain.beta, config.domain.kernel) == (0.0, "linear")


def toy_vectors(labels) -> ArrayDataset:
    labels = torch.as_tensor(labels)
    x = torch.arange(len(labels), dtype=torch.float32)[:, None].repeat(1, 3)  # row i = i
    return ArrayDataset("toy", "toy vectors", x, labels)


def held_out_by_hand(labels: torch.Tensor, share: float, seed: int) -> list[int]:
    """The positions a seeded seen-holdout split holds out, by a per-class scan: each class's
    members in a randperm of torch's generator seeded ``seed``, its first round-half-up
    ``share`` held out (at least one, and one kept)."""
    generator = torch.Generator().manual_seed(seed)
    held = []
    for label in labels.unique(sorted=True):
        members = (labels == label).nonzero().squeeze(1)
        members = members[torch.randperm(len(members), generator=generator)]
        count = min(max(int(share * len(members) + 0.5), 1), len(members) - 1)
        held += members[:count].tolist()
    return sorted(held)


def test_a_seen_holdout_run_and_its_validation_part_draw_from_seed_0():
    """data.split=seen-holdout holds out what seed 0 draws (the split every recorded
    seen-holdout run trained on), and a validation part of seen classes is drawn from seed 0
    too, of the training part's positions."""
    labels = torch.arange(6).repeat_interleave(10)[torch.randperm(60, generator=torch.Generator(
        ).manual_seed(1))]
    splits = make_splits(toy_vectors(labels), {}, "seen-holdout", holdout_fraction=0.3)
    held = held_out_by_hand(labels, 0.3, seed=0)
    assert splits.test.x[:, 0].long().tolist() == held
    kept = [i for i in range(60) if i not in held]
    validated = make_splits(toy_vectors(labels), {}, "seen-holdout", holdout_fraction=0.3,
                            validation=0.25)
    inner = held_out_by_hand(labels[kept], 0.25, seed=0)
    assert validated.test.x[:, 0].long().tolist() == [kept[i] for i in inner]


def test_train_classes_1_from_the_command_line_is_one_class_not_every_class():
    """data.train_classes is a float setting, so `train_classes=1` arrives as 1.0: a count of
    one class (docs/datasets.md: a fraction or a count), not the fraction 1.0 of them all."""
    config = recipe_defaults("jrd")
    set_key(config, "train_classes", 1)
    assert config.data.train_classes == 1.0 and isinstance(config.data.train_classes, float)
    splits = make_splits(toy_vectors([0, 0, 1, 1, 2, 2, 3, 3]), {}, "class-disjoint",
                         train_classes=config.data.train_classes)
    assert splits.train_classes == [0]
    assert splits.test.labels.tolist() == [1, 1, 2, 2, 3, 3]


def test_a_datasets_own_split_with_both_a_test_and_a_query_part_is_scored_on_test():
    """The known, documented choice (a dataset with both parts is scored on its test part)."""
    parts = {"train": torch.tensor([0, 1]), "test": torch.tensor([2, 3]),
             "query": torch.tensor([4, 5])}
    splits = make_splits(toy_vectors([0, 0, 1, 1, 2, 2]), parts, "standard")
    assert splits.test.labels.tolist() == [1, 1]


def feature_pair(path, seed: int, source: int = 30, target: int = 20, features: int = 6):
    """An npz: domain pair of random features, three source classes and three target ones."""
    generator = np.random.default_rng(seed)
    x = generator.normal(size=(source + target, features)) * np.arange(1, features + 1)
    y = np.concatenate([np.arange(source) % 3, np.arange(target) % 3])
    domain = np.array(["source"] * source + ["target"] * target)
    np.savez(path, X=x, y=y, domain=domain)
    return f"npz:{path}", x.astype(np.float32), y


def test_a_pair_embedded_by_a_trained_run_goes_through_the_run_s_pca_kept_as_its_input_pca(
        tmp_path):
    """prepare_data(pca=...) projects another pair by the trained run's PCA (fitted on the
    run's own source), not one fitted on this pair's source, and keeps it as the splits'
    input_pca (raw queries go through it); without data.pca_dim it projects nothing."""
    first, _, _ = feature_pair(tmp_path / "a.npz", 0)
    trained = prepare_data(DataConfig(dataset=first, pca_dim=3), new_run=True).input_pca
    assert trained is not None
    other, x, y = feature_pair(tmp_path / "b.npz", 1)
    splits = prepare_data(DataConfig(dataset=other, pca_dim=3), pca=trained)
    assert splits.input_pca is trained
    centred = x[:30].astype(np.float64) - trained.mean  # NumPy's projection, by hand
    np.testing.assert_allclose(splits.train.x.numpy(), centred @ trained.components.T,
                               rtol=1e-5, atol=1e-5)
    assert splits.train.labels.tolist() == y[:30].tolist()
    refitted = prepare_data(DataConfig(dataset=other, pca_dim=3))
    assert not np.allclose(refitted.train.x.numpy(), splits.train.x.numpy(), atol=1e-3)
    unprojected = prepare_data(DataConfig(dataset=other), pca=trained)
    assert unprojected.input_pca is None
    np.testing.assert_array_equal(unprojected.train.x.numpy(), x[:30])


def test_a_pair_s_target_is_its_file_s_target_rows_and_the_source_trains(tmp_path):
    """The trainer's unlabelled target (the MMD term's) and the scored test part are the
    file's target rows; the training part is its source rows."""
    name, x, y = feature_pair(tmp_path / "pair.npz", 2)
    splits = prepare_data(DataConfig(dataset=name), new_run=True)
    assert splits.target is not None
    np.testing.assert_array_equal(splits.target.x.numpy(), x[30:])
    np.testing.assert_array_equal(splits.test.x.numpy(), x[30:])
    assert splits.test.labels.tolist() == y[30:].tolist()
    np.testing.assert_array_equal(splits.train.x.numpy(), x[:30])


def test_a_new_seen_holdout_run_takes_its_holdout_fraction_and_refuses_train_classes():
    """data.holdout_fraction is the seen-holdout split's own setting (docs/datasets.md), read
    by a new run; data.train_classes, the class-disjoint split's, is refused for it."""
    splits = prepare_data(DataConfig(dataset="digits", split="seen-holdout",
                                     holdout_fraction=0.5), new_run=True)
    counts = torch.bincount(splits.test.labels)
    totals = torch.bincount(torch.cat([splits.test.labels, splits.train.labels.new_tensor(
        [splits.train_classes[i] for i in splits.train.labels.tolist()])]))
    assert torch.equal(counts, torch.div(totals + 1, 2, rounding_mode="floor"))  # half up
    with pytest.raises(KdmlError, match=r"data\.train_classes applies to the class-disjoint "
                                        r"split only, and the split is seen-holdout"):
        prepare_data(DataConfig(dataset="digits", split="seen-holdout", train_classes=0.3),
                     new_run=True)


def test_pca_dim_up_to_the_smaller_of_the_source_s_samples_and_features_is_taken(tmp_path):
    """data.pca_dim = min(source samples, features) keeps every direction (the projection
    keeps the distances between samples); one more is refused in one line."""
    name, x, _ = feature_pair(tmp_path / "pair.npz", 3, source=30, features=6)
    splits = prepare_data(DataConfig(dataset=name, pca_dim=6), new_run=True)
    source = x[:30].astype(np.float64)
    distances = np.linalg.norm(source[:, None] - source[None], axis=-1)
    projected = splits.train.x.double().numpy()
    np.testing.assert_allclose(np.linalg.norm(projected[:, None] - projected[None], axis=-1),
                               distances, rtol=1e-4, atol=1e-4)
    with pytest.raises(KdmlError, match=r"^data\.pca_dim=7 exceeds 6"):
        prepare_data(DataConfig(dataset=name, pca_dim=7), new_run=True)
    few, x, _ = feature_pair(tmp_path / "few.npz", 3, source=5, features=6)
    assert prepare_data(DataConfig(dataset=few, pca_dim=5)).train.x.shape == (5, 5)


def test_a_dataset_s_own_recall_ks_reach_its_splits(tmp_path):
    """In-Shop's usual Recall@K (1, 10, 20, ..., 50: the papers' table) are what eval.ks=[]
    scores, through prepare_data; a dataset without its own are 1, 2, 4, 8."""
    root = make_inshop(tmp_path, items=6, per_item=3)
    splits = prepare_data(DataConfig(dataset="inshop", root=str(root)), new_run=True)
    assert splits.eval_ks == (1, 10, 20, 30, 40, 50)
    assert prepare_data(DataConfig(dataset="digits")).eval_ks == (1, 2, 4, 8)


def test_a_trained_run_s_pca_refuses_a_pair_of_other_features_in_one_line(tmp_path):
    first, _, _ = feature_pair(tmp_path / "six.npz", 4, features=6)
    trained = prepare_data(DataConfig(dataset=first, pca_dim=2)).input_pca
    other, _, _ = feature_pair(tmp_path / "five.npz", 4, features=5)
    with pytest.raises(KdmlError, match=r"five\+?.* has 5 features a sample, but the PCA "
                                        r"\(fitted on the trained run's source\) takes 6"):
        prepare_data(DataConfig(dataset=other, pca_dim=2), pca=trained)


@pytest.mark.parametrize("name, pair", [
    ("mnist5k->digits", True), ("npz:feats.npz", True), ("fashion-mnist", False),
    ("folder:/data/im->gs", False), ("csv:list-of-images.csv", False), ("cub200-2011", False)])
def test_only_an_arrow_or_npz_names_a_domain_pair(name, pair):
    """docs/datasets.md: a pair is SOURCE->TARGET or npz:PATH; a hyphen alone is a name."""
    from kdml.data.domains import is_domain_dataset

    assert is_domain_dataset(name) is pair


@pytest.mark.parametrize("name", ["dtml", "dstml", "ddml", "ddml-logistic", "pca"])
def test_the_dtml_family_s_defaults_are_those_the_docs_state(name):
    """README: the family trains on mnist5k->digits unless --dataset names another (MNIST the
    labelled source, scikit-learn's digits the target), `ddml` is DTML with beta = 0;
    docs/recipes.md's DTML table: the metric is Euclidean."""
    config = recipe_defaults(name)
    assert config.data.dataset == "mnist5k->digits"
    assert config.eval.metric == "euclidean"
    if name == "ddml":
        assert config.method.beta == 0.0


def test_flat_784_pixel_digits_convert_as_their_28x28_images():
    """mnist_to_optdigits' documented shapes: (N, 784) rows are the (N, 28, 28) images."""
    from kdml.data.domains import mnist_to_optdigits

    images = torch.zeros(2, 28, 28, dtype=torch.uint8)
    images[0, 4:20, 10:14] = 255  # a vertical bar
    images[1, 12:15, 3:25] = 200  # a horizontal one
    expected = mnist_to_optdigits(images)
    assert torch.equal(mnist_to_optdigits(images.reshape(2, 784)), expected)
    assert expected.sum() > 0
