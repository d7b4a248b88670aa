"""A user's own data, as a fuzzing session found it mishandled: feature files (``npz:``) whose
labelled target cannot be scored or is of one class, image decoding that let Pillow's own
warnings through, and a ``folder:DIR`` in the common ``train/`` + ``test/`` layout."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from PIL import Image

from kdml.data.formats.folder import load_folder
from kdml.data.images import load_image, load_image_as
from kdml.errors import KdmlError


def _features(path, target_labels):
    """Six source samples of classes 0-2 and one target sample per entry of
    ``target_labels`` (-1 = unlabelled)."""
    rng = np.random.default_rng(0)
    source_labels = [0, 0, 1, 1, 2, 2]
    labels = np.array(source_labels + list(target_labels))
    features = rng.standard_normal((len(labels), 4)).astype(np.float32)
    domain = np.array(["source"] * len(source_labels) + ["target"] * len(target_labels))
    np.savez(path, X=features, y=labels, domain=domain)
    return path


def _train_refused_before_training(tmp_path, capsys, monkeypatch, *args) -> str:
    """``kdml train *args`` refused in one line before any step (a step fails the test)."""
    from kdml import cli
    from kdml.training import trainer

    def never(*_, **__):
        raise AssertionError("trained before the test set was checked")

    monkeypatch.setattr(trainer, "train_one_epoch", never)
    out = tmp_path / "run"
    assert cli.main(["train", *map(str, args), "--out", str(out), "--no-progress",
                     "train.epochs=1", "train.device=cpu", "eval.ks=[1]",
                     "data.batch_size=2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kdml: error: ") and err.count("\n") == 1, err
    return err


def test_a_feature_file_whose_labelled_target_is_one_class_is_warned_about(caplog):
    """Every labelled target sample of one class: the target retrieval metrics are all
    trivially 1 (a run had printed 1.0000 for each without a word), while source_nn_accuracy
    still measures the transfer, so it trains, with a warning saying so."""
    import logging

    import torch

    from kdml.data.dataset import ArrayDataset
    from kdml.data.prepare import domain_splits
    from kdml.training.checks import warn_about_splits

    source = ArrayDataset("src", "s", torch.rand(6, 4), torch.arange(6) % 3)
    target = ArrayDataset("tgt", "t", torch.rand(5, 4), torch.tensor([0, 0, 0, -1, -1]))
    with caplog.at_level("WARNING", logger="kdml.test"):
        warn_about_splits(domain_splits(source, target), logging.getLogger("kdml.test"))
    assert [record.getMessage() for record in caplog.records] == [
        "every labelled target sample of tgt has the same class, so the target retrieval "
        "metrics (Recall@K, MAP@R, R-Precision, NMI) are trivially 1; only source_nn_accuracy "
        "measures the model: label target samples of two classes or more"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="kdml.test"):  # two classes: no warning
        warn_about_splits(domain_splits(source, ArrayDataset(
            "tgt", "t", torch.rand(5, 4), torch.tensor([0, 0, 1, -1, -1]))),
            logging.getLogger("kdml.test"))
    assert caplog.records == []


def test_a_feature_file_without_a_scorable_target_query_is_refused_before_training(
        tmp_path, capsys, monkeypatch):
    """Labelled target samples that are each the only one of their class: no query has
    anything to retrieve. The check that refuses this before training for other datasets
    (check_test_classes) is skipped for domain pairs, so the run trained its first epoch,
    then stopped ("no query has another sample of its class in the reference set") and
    dropped it."""
    path = _features(tmp_path / "singletons.npz", [0, 1, 2, -1])
    err = _train_refused_before_training(tmp_path, capsys, monkeypatch, "jrd", "--dataset",
                                         f"npz:{path}")
    assert err.endswith("has another of its class to retrieve, so Recall@K is undefined; label "
                        "at least two target samples of a class (-1 marks the unlabelled "
                        "ones)\n")


@pytest.mark.parametrize("decode", [lambda path: load_image(path, 16),
                                    lambda path: load_image_as(path, (1, 16, 16))],
                         ids=["image-files", "as-in-memory-samples"])
def test_decoding_a_palette_png_with_transparency_raises_no_python_warning(tmp_path, decode):
    """A palette PNG with a transparency table, as many tools save, made Pillow warn
    ("Palette images with Transparency expressed in bytes should be converted to RGBA
    images") with its own two-line Python warning, a source path and `warnings.warn(` on
    stderr, once per image and command (training, embed, index, search). The pixels are
    those of the RGB conversion, transparency dropped."""
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
    path = tmp_path / "palette.png"
    Image.fromarray(pixels).convert("P").save(path, transparency=bytes([0] * 10 + [255] * 246))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = decode(path)
    assert [str(warning.message) for warning in caught] == []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = np.asarray(Image.open(path).convert("RGB" if image.shape[0] == 3 else "L"))
    assert np.array_equal(image.numpy().transpose(1, 2, 0).squeeze(-1) if image.shape[0] == 1
                          else image.numpy().transpose(1, 2, 0), expected)


def test_decoding_a_large_image_raises_no_python_warning(tmp_path, monkeypatch):
    """An image between Pillow's MAX_IMAGE_PIXELS and twice it (89-179 megapixels: a
    panorama, a scan) is decoded, but printed Pillow's DecompressionBombWarning, as a raw
    Python warning, to stderr. Shrunk here by lowering the limit."""
    Image.fromarray(np.zeros((12, 12, 3), np.uint8)).save(tmp_path / "big.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 144 pixels: a warning, not an error
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_image(tmp_path / "big.png", 8)
    assert [type(warning.message).__name__ for warning in caught] == []


# capitalised as some downloads come (Train/, Test/): the names are compared lower-cased
@pytest.mark.parametrize("splits", [("test", "train"), ("test", "train", "val"), ("Test", "Train")])
def test_a_folder_in_the_train_test_layout_is_refused_naming_the_layout(tmp_path, splits):
    """DIR/train/<class>/ and DIR/test/<class>/ (Kaggle's usual layout) was read as the
    classes "test" and "train" (and "val"): with two, training stopped with "every test sample
    of folder:DIR/test has the same class", which does not say why; with three, or with
    data.split=seen-holdout, it trained on them and printed metrics. kdml already refuses
    DIR/images/<class>/ naming the folder to give; the split folders deserve the same."""
    for split in splits:
        for name in ("cat", "dog", "fox"):
            folder = tmp_path / split / name
            folder.mkdir(parents=True)
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "0.png")
    with pytest.raises(KdmlError) as refused:
        load_folder(tmp_path)
    message = str(refused.value)
    assert f"its sub-folders {'/, '.join(splits)}/ look like a split, each holding class " \
           "folders (cat, dog, fox), but kdml reads each sub-folder as a class: give one of " \
           f"them (e.g. folder:{tmp_path / splits[1]}), which data.split splits" in message
    assert "\n" not in message


def test_folders_named_like_splits_without_class_folders_are_classes(tmp_path):
    """Images directly in train/ and test/ are two classes of those names: nothing to
    refuse, and nor is a class named "train" beside other classes."""
    for names in (("test", "train"), ("bus", "train")):
        root = tmp_path / "-".join(names)
        for name in names:
            (root / name).mkdir(parents=True)
            Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(root / name / "0.png")
            Image.fromarray(np.ones((8, 8, 3), np.uint8)).save(root / name / "1.png")
        assert list(load_folder(root).dataset.class_names.values()) == list(names)


def test_a_class_folder_without_images_says_what_it_holds(tmp_path):
    """A class folder of iPhone photos (.heic) had been refused as holding no images without
    a word of the files it does hold: the warning that counts them came after the error."""
    for name in ("cat", "dog"):
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / name / "0.png")
    (tmp_path / "fox").mkdir()
    for index in range(2):
        (tmp_path / "fox" / f"{index}.HEIC").write_bytes(b"")
    (tmp_path / "fox" / "notes.txt").write_text("")
    with pytest.raises(KdmlError) as refused:
        load_folder(tmp_path)
    assert "class folder fox/ holds no images (extensions: .jpg" in str(refused.value)
    assert ".pgm); it holds 2 .heic, 1 .txt: convert its images to one of those; add its " \
           "images or remove it" in str(refused.value)
    (tmp_path / "fox" / "0.HEIC").unlink()
    (tmp_path / "fox" / "1.HEIC").unlink()
    (tmp_path / "fox" / "notes.txt").unlink()
    with pytest.raises(KdmlError) as refused:
        load_folder(tmp_path)
    assert ".pgm); add its images or remove it (searched" in str(refused.value)


def test_a_feature_file_that_is_a_folder_points_to_folder(tmp_path):
    """npz: given a folder (of images, most likely) had said only "is not a file"; folder:
    given a .npz file already points to npz:."""
    from kdml.data.domains import load_feature_domains

    with pytest.raises(KdmlError) as refused:
        load_feature_domains(tmp_path)
    assert str(refused.value) == (
        f"feature file {tmp_path} is a folder; give the .npz file (npz:FILE), or for a folder "
        f"of images, one sub-folder per class, --dataset folder:{tmp_path}")


def test_a_folder_of_two_classes_is_told_what_can_test_it(tmp_path, capsys):
    """Split in halves, 2 classes leave 1 to test, which is refused; the advice had been
    "data.train_classes, or more classes", and no data.train_classes leaves 2 of 2 to test."""
    from kdml import cli

    for name in ("cat", "dog"):
        (tmp_path / "photos" / name).mkdir(parents=True)
        for index in range(3):
            Image.fromarray(np.full((8, 8, 3), index, np.uint8)).save(
                tmp_path / "photos" / name / f"{index}.png")
    assert cli.main(["train", "amsoftmax", "--dataset", f"folder:{tmp_path / 'photos'}",
                     "--out", str(tmp_path / "run"), "--no-progress", "train.epochs=1"]) == 2
    assert capsys.readouterr().err.endswith(
        "would be trivially 1; a class-disjoint split of 2 classes tests 1: give the dataset 3 "
        "classes or more, or test on held-out samples of its classes with "
        "data.split=seen-holdout\n")
