"""The data path below the dataset formats, as a fuzzing session of it found it: a copy of a
folder dataset whose names are in decomposed Unicode (as macOS's HFS+ stores them) refused
as other data, although data.json's fingerprint means to hash it as the same files; data
settings that a run never reads (the crop and resize of in-memory images, class-balanced
batches with data.batch_size=0 or a recipe fitted in closed form) taken without a word, where
README promises a warning; torch's own two-line warning about data.num_workers printed raw;
kdml.data's datasets truncating fractional labels, and its samplers and splits stopping with
Python's AttributeError on a list of labels; Pillow's warnings about a readable image's
damaged metadata printed raw from the loader workers."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from kdml import cli
from kdml.data import (
    ArrayDataset,
    ClassBalancedBatches,
    ImageFiles,
    class_disjoint_split,
    seen_holdout_split,
)
from kdml.data.fingerprint import data_fingerprint, fingerprint_difference
from kdml.data.registry import open_dataset
from kdml.data.samplers import check_batching
from kdml.data.splits import make_splits
from kdml.errors import KdmlError

TINY = ["train.epochs=1", "train.steps_per_epoch=1", "eval.nmi=false", "--no-progress",
        "train.device=cpu"]


def accented_folder(root: Path, form: str, class_names: list[str],
                    file_names: list[str]) -> Path:
    """``root/<class>/<file>``, every name in Unicode normal form ``form``; the same pixels
    whatever the form."""
    rng = np.random.default_rng(0)
    for class_name in class_names:
        folder = root / unicodedata.normalize(form, class_name)
        folder.mkdir(parents=True)
        for file_name in file_names:
            pixels = rng.integers(0, 256, (12, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / unicodedata.normalize(form, file_name))
    return root


def fingerprint_of(folder: Path) -> dict:
    parts = open_dataset(f"folder:{folder}", None)
    return data_fingerprint(make_splits(parts.dataset, parts.parts, "standard"))


@pytest.mark.parametrize(("class_names", "file_names"), [
    # accents in file names only: "é.png" sorts after "f.png" composed, before it decomposed
    (["c0", "c1", "c2", "c3"], ["e.png", "é.png", "f.png"]),
    # accents in class names: the class names are hashed as they are spelled
    (["café", "dune", "crème", "mer"], ["0.png", "1.png"]),
])
def test_a_copy_with_decomposed_names_is_the_same_data(tmp_path, class_names, file_names):
    """fingerprint.py hashes the paths NFC-normalised so that "the same files on ... macOS
    (decomposed accents) hash the same" (tested only on hand-made path lists in
    test_data_fingerprint.py). Through the folder reader they do not: it sorts the files and
    the class folders by their raw code points before the fingerprint normalises them, so
    é = e + U+0301 sorts before "f" where é = U+00E9 sorts after it, and the class names are
    hashed unnormalised. ``kdml eval RUN --data-root COPY`` of an NFD copy (a dataset
    unpacked on a Mac) is refused: "its train part has the same 6 samples of 2 classes but its
    files or labels differ"."""
    composed = accented_folder(tmp_path / "nfc", "NFC", class_names, file_names)
    decomposed = accented_folder(tmp_path / "nfd", "NFD", class_names, file_names)
    difference = fingerprint_difference(fingerprint_of(composed), fingerprint_of(decomposed))
    assert difference is None, difference


def test_the_class_disjoint_split_does_not_depend_on_the_unicode_form(tmp_path):
    """Classes are the sub-folders in name order, so the class-disjoint halves follow it. With
    "cafz" and "café" at the cut, the composed é (U+00E9) sorts after "z" and the decomposed
    one (e + U+0301) before it: the same dataset trains on "cafz" on Linux and on "café" from
    a copy unpacked on a Mac, and each run's test part holds the other's training class."""
    names = ["alp", "café", "cafz", "zinc"]
    trained = {}
    for form in ("NFC", "NFD"):
        folder = accented_folder(tmp_path / form, form, names, ["0.png", "1.png"])
        parts = open_dataset(f"folder:{folder}", None)
        splits = make_splits(parts.dataset, parts.parts, "standard")
        trained[form] = sorted(unicodedata.normalize("NFC", name)
                               for name in splits.train.class_names.values())
    assert trained["NFC"] == trained["NFD"]


@pytest.mark.parametrize(("recipe", "settings"), [
    # digits are in-memory images: neither resized nor cropped (docs/datasets.md, step 3)
    ("amsoftmax", ["data.image_size=4"]),
    ("amsoftmax", ["data.resize=300"]),
    # batch_size=0 draws one shuffled full batch: no class-balanced sampler
    ("amsoftmax", ["data.batch_size=0", "data.samples_per_class=4"]),
    # pca is fitted in closed form: TrainingBatches(drawn=False) ignores samples_per_class
    ("pca", ["data.batch_size=32", "data.samples_per_class=4"]),
])
def test_a_data_setting_the_run_never_reads_is_warned_of(tmp_path, capsys, recipe, settings):
    """README: "A setting given another value than the recipe's default that the run never
    reads is warned of (stderr and train.log)". These are read by no part of the run (a user
    asking for 4-pixel training crops of in-memory images gets no crops at all, and one asking
    for class-balanced batches gets plain ones), and nothing is said."""
    out = tmp_path / "run"
    status = cli.main(["train", recipe, "--dataset", "digits", "--out", str(out),
                       "data.num_workers=0", *settings, *TINY])
    err = capsys.readouterr().err
    key = settings[-1].split("=")[0]
    assert status == 0, err
    assert f"{key} is not read by this run" in err, err


def test_more_loader_workers_than_cores_is_not_torchs_raw_warning(tmp_path, capsys,
                                                                 monkeypatch):
    """data.num_workers may be up to 256 (README); above the cores torch's DataLoader warns
    with Python's two-line UserWarning, naming torch's source file, once per loader (twice a
    run, on stderr): not a kdml line. Here the machine is made to have one core."""
    import os
    import warnings
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status = cli.main(["train", "amsoftmax", "--dataset", "digits", "--out", str(out),
                           "data.num_workers=2", "data.batch_size=32", *TINY])
    err = capsys.readouterr().err
    assert status == 0, err
    raw = [str(w.message) for w in caught if w.filename.endswith("dataloader.py")]
    assert not raw, raw


@pytest.mark.parametrize("make", [
    lambda labels: ArrayDataset("toy", "toy", torch.zeros(len(labels), 3), labels),
    lambda labels: ImageFiles("toy", "toy", np.asarray(["a.png"] * len(labels)), labels),
], ids=["ArrayDataset", "ImageFiles"])
def test_fractional_labels_are_refused_not_truncated(make):
    """kdml.data's datasets take "integer labels [N]"; fractional ones (a float column read
    from a table, 0.7 and 1.2) were cast with .long() without a word, to 0 and 1: other
    classes than the caller's, and two labels that differ (1.2 and 1.9) made one class."""
    with pytest.raises(KdmlError, match="label"):
        make(torch.tensor([0.7, 1.2, 1.9]))


@pytest.mark.parametrize("labels", [[0, 0, 1, 1, 2, 2], np.array([0, 0, 1, 1, 2, 2])])
def test_the_public_samplers_and_splits_refuse_labels_that_are_not_a_tensor(labels):
    """ClassBalancedBatches, class_disjoint_split and seen_holdout_split, exported by
    kdml.data, stopped with Python's AttributeError ("'list' object has no attribute
    'unique'") for a list or a NumPy array of labels, where ShuffledBatches says what it
    takes in one line."""
    for call in (lambda: ClassBalancedBatches(labels, 2, 4, seed=0),
                 lambda: class_disjoint_split(labels),
                 lambda: seen_holdout_split(labels)):
        try:
            call()
        except KdmlError:
            continue
        except AttributeError as error:
            pytest.fail(f"raw AttributeError: {error}")


def tiff_with_an_overlong_tag(path: Path) -> Path:
    """An 8x8 RGB TIFF whose Software tag (305) claims more bytes than the file holds, as
    damaged metadata of some scanners' files does: the pixels decode."""
    import struct

    from PIL import TiffImagePlugin
    info = TiffImagePlugin.ImageFileDirectory_v2()
    info[305] = "scanner software name"  # ASCII longer than 4 bytes: stored at an offset
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(path, tiffinfo=info)
    data = bytearray(path.read_bytes())
    (ifd,) = struct.unpack_from("<I", data, 4)
    (entries,) = struct.unpack_from("<H", data, ifd)
    for entry in range(entries):
        at = ifd + 2 + 12 * entry
        if struct.unpack_from("<H", data, at)[0] == 305:
            struct.pack_into("<I", data, at + 4, 100_000)  # its count
    path.write_bytes(bytes(data))
    return path


def test_pillows_advice_on_a_readable_images_metadata_is_not_printed(tmp_path):
    """images.py silences Pillow's warnings about how an image was saved ("advice to
    whoever saved it that a kdml user cannot act on (it had printed Python's two-line warning
    once per image, in every loader worker)"), but only two of them. A TIFF with damaged
    metadata decodes, and Pillow's "Tag data larger than file. Skipping tag 305" (also
    "Corrupt EXIF data", "Truncated File Read", "Metadata Warning") reached stderr raw, naming
    PIL/TiffImagePlugin.py, from each loader worker, once even after the closing "run
    folder:" line."""
    import warnings

    from kdml.data.images import load_image
    path = tiff_with_an_overlong_tag(tmp_path / "scan.tif")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pixels = load_image(path, 8)
    assert pixels.shape == (3, 8, 8)
    assert not [str(w.message) for w in caught], [str(w.message) for w in caught]


@pytest.mark.parametrize(("batch_size", "samples_per_class", "says"), [
    (10, 3, r"^data\.batch_size=10 must be a multiple of data\.samples_per_class=3; set one"),
    (12, 2, r"^data\.batch_size=12 with data\.samples_per_class=2 needs 6 classes but the "
            r"training split has 4; lower data\.batch_size or raise data\.samples_per_class$"),
])
def test_batch_settings_the_split_cannot_fill_are_named_as_config_keys(
        batch_size: int, samples_per_class: int, says: str) -> None:
    """As the check beside them ("data.batch_size=... is larger than the training split"):
    the keys a user sets, with their section (the bare names had been left for guessing)."""
    with pytest.raises(KdmlError, match=says):
        check_batching(torch.arange(40) % 4, samples_per_class, batch_size)
