"""Audit of a user's own image sets with unreadable or not yet extracted files: what
``data.on_bad_image=skip`` says of a training class it loses and of a query/gallery split's
skipped images, and Cars196's photos left in their archive."""

from __future__ import annotations

import re
import shutil
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from fixtures_array_sets import make_image_folder
from fixtures_photo_sets import make_cars196

from kdml import cli
from kdml.data.formats.cars import load_cars196
from kdml.errors import KdmlError
from kdml.evaluation import evaluator

TINY = ["train.epochs=2", "model.embedding_size=8", "eval.nmi=false", "--no-progress",
        "data.resize=40", "data.image_size=32", "eval.ks=[1,2]", "train.device=cpu",
        "data.batch_size=4", "data.on_bad_image=skip"]


def test_a_training_class_with_no_readable_image_is_warned_of_once(tmp_path):
    """Six classes, the first three train: every image of c00 is empty, 3 of c01's 4 too.
    The run trained on c01 and c02 alone, and only the per-file "skipping" lines said so (the
    test side stops where skipped images leave it unscorable); it now warns once, naming the
    class lost and how many remain, and not of c01, whose last image of 4 is readable."""
    folder = make_image_folder(tmp_path, classes=6, per_class=4, size=24)
    for image in (folder / "c00").iterdir():
        image.write_bytes(b"")
    for image in sorted((folder / "c01").iterdir())[:3]:
        image.write_bytes(b"")
    out = tmp_path / "run"
    assert cli.main(["train", "amsoftmax", "--dataset", f"folder:{folder}", "--out", str(out),
                     *TINY]) == 0
    log = (out / "train.log").read_text()
    lost = [line for line in log.splitlines() if "every one of" in line]
    assert len(lost) == 1, lost
    assert lost[0].endswith(
        "every one of the 4 images of training class 'c00' is unreadable "
        "(data.on_bad_image=skip): the run trains without it, on the other 2 classes")
    # said once its last image is found, after the file lines
    assert log.index(lost[0]) > max(log.index(f"skipping unreadable image {image}")
                                    for image in (folder / "c00").iterdir())


def _splits(gallery: bool) -> SimpleNamespace:
    return SimpleNamespace(test=list(range(6)), gallery=list(range(6)) if gallery else None,
                           train=None, kind="unseen", validation=False)


@pytest.mark.parametrize("gallery", [False, True])
def test_the_skip_warning_names_the_queries_and_counts_in_the_singular(caplog, gallery):
    """A query/gallery split (In-Shop, a CSV with is_query and is_gallery) had its queries
    called "test samples", which the "test set" line calls queries, and one image left out
    read "1 of the 6 test samples was skipped as unreadable images"."""
    labels = torch.tensor([0, 0, 1, 1, 2])
    scored = {"test": SimpleNamespace(labels=labels)}
    if gallery:
        scored["gallery"] = SimpleNamespace(labels=torch.tensor([0, 1, 2, 2]))
    with caplog.at_level("WARNING"):
        evaluator._warn_of_skipped(scored, _splits(gallery))
    said = "query" if gallery else "test"
    assert (f"1 of the 6 {said} samples was skipped as an unreadable image "
            "(data.on_bad_image=skip): the metrics use the other 5") in caplog.text
    assert ("2 of the 6 gallery samples were skipped as unreadable images "
            "(data.on_bad_image=skip): the metrics use the other 4" in caplog.text) == gallery


@pytest.fixture(scope="module")
def cars(tmp_path_factory) -> Path:
    """Cars196 with its photos also packed in car_ims.tgz, as downloaded."""
    root = make_cars196(tmp_path_factory.mktemp("cars") / "cars", classes=4, per_class=2)
    with tarfile.open(root / "car_ims.tgz", "w:gz") as archive:
        archive.add(root / "car_ims", arcname="car_ims")
    return root


def test_cars196_photos_left_in_their_archive_are_told_to_be_extracted(cars, tmp_path):
    """``car_ims.tgz`` beside ``cars_annos.mat``, not extracted: the error named the first
    missing image only; it now says to extract the archive there."""
    root = tmp_path / "cars"
    shutil.copytree(cars, root)
    shutil.rmtree(root / "car_ims")
    with pytest.raises(KdmlError, match=re.escape(
            f"annotation 1: missing image {root}/car_ims/000001.jpg: car_ims.tgz is there, not "
            f"extracted; extract car_ims.tgz in {root} (8 of 8 listed images are missing)")):
        load_cars196(root)
    # extracted in part (an interrupted tar): said so
    (root / "car_ims").mkdir()
    with pytest.raises(KdmlError, match=re.escape(
            "car_ims.tgz is there, perhaps extracted in part; extract car_ims.tgz in ")):
        load_cars196(root)
    # extracted, the set reads; without the archive, a missing image is plainly missing
    with tarfile.open(root / "car_ims.tgz") as archive:
        archive.extractall(root, filter="data")
    assert len(load_cars196(root).dataset) == 8
    (root / "car_ims.tgz").unlink()
    (root / "car_ims" / "000001.jpg").unlink()
    with pytest.raises(KdmlError, match=re.escape(
            f"missing image {root}/car_ims/000001.jpg (1 of 8 listed images are missing)")):
        load_cars196(root)
