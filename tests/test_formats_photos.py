"""The readers of the photo datasets' layouts (CUB, Cars196, SOP, In-Shop) on tiny real-format
fixtures: what they read, and the one-line errors for broken folders."""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from fixtures_array_sets import make_cifar10, make_cifar100, make_idx
from fixtures_photo_sets import (
    make_cars196,
    make_cub,
    make_inshop,
    make_sop,
    write_matlab_v73,
    write_photo,
)

from kdml.data.formats.cars import load_cars196
from kdml.data.formats.common import DatasetParts
from kdml.data.formats.csv_list import load_csv
from kdml.data.formats.cub import folder_class_name, load_cub
from kdml.data.formats.idx import load_mnist
from kdml.data.formats.inshop import load_inshop
from kdml.data.formats.sop import load_sop
from kdml.data.images import ImageFiles
from kdml.data.registry import FORMATS, ROOT_VARIABLE, find_root, open_dataset
from kdml.errors import KdmlError


def one_line_error(load: Callable[[Path], DatasetParts], root: Path, match: str) -> str:
    """``load(root)`` fails with a one-line KdmlError matching ``match`` that names ``root``."""
    with pytest.raises(KdmlError, match=match) as info:
        load(root)
    message = str(info.value)
    assert "\n" not in message
    assert f"searched {root}" in message
    return message


def check_images(parts: DatasetParts, root: Path) -> None:
    """Paths are existing files under ``root``; images decode; the parts cover each sample once."""
    dataset = parts.dataset
    assert isinstance(dataset, ImageFiles)
    assert dataset.labels.dtype == torch.int64
    assert all(Path(path).is_file() and Path(path).is_relative_to(root)
               for path in dataset.paths)
    image = dataset.load(0)
    assert image.dtype == torch.uint8 and image.shape == (3, 256, 256)
    assert dataset.resized(32).load(len(dataset) - 1).shape == (3, 32, 32)
    covered = torch.cat(list(parts.parts.values())).sort().values
    assert torch.equal(covered, torch.arange(len(dataset)))


def set_line(path: Path, number: int, text: str | None) -> None:
    """Replace line ``number`` (1-based) of ``path`` with ``text``, or delete it if None."""
    lines = path.read_text().splitlines()
    if text is None:
        del lines[number - 1]
    else:
        lines[number - 1] = text
    path.write_text("\n".join(lines) + "\n")


def replace_text(path: Path, old: str, new: str) -> None:
    """Replace every ``old`` in the text file ``path`` with ``new``."""
    path.write_text(path.read_text().replace(old, new))


def with_bom(path: Path) -> None:
    """Start ``path`` with a UTF-8 byte-order mark, as some editors save text files."""
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())


def labels_of(parts: DatasetParts, part: str) -> set[int]:
    return set(parts.dataset.labels[parts.parts[part]].tolist())


# CUB-200-2011


def test_cub_reads_classes_and_splits_by_class_id(tmp_path):
    parts = load_cub(make_cub(tmp_path, classes=4, per_class=3))
    dataset = parts.dataset
    assert len(dataset) == 12 and dataset.num_classes == 4
    assert set(parts.parts) == {"train", "test"}
    assert labels_of(parts, "train") == {1, 2} and labels_of(parts, "test") == {3, 4}
    assert len(parts.parts["train"]) == 6
    for path, label in zip(dataset.paths, dataset.labels.tolist(), strict=True):
        assert Path(path).parent.name.startswith(f"{label:03d}.")  # e.g. 001.Black_footed_...
    assert dataset.class_names == {1: "Black footed Albatross", 2: "Laysan Albatross",
                                   3: "Sooty Albatross", 4: "Groove billed Ani"}
    assert parts.eval_ks == (1, 2, 4, 8)
    check_images(parts, tmp_path)


def test_cub_grayscale_photos_decode_to_three_equal_channels(tmp_path):
    dataset = load_cub(make_cub(tmp_path)).dataset
    gray, colour = dataset.load(3), dataset.load(0)  # the fixture makes image id 4 grayscale
    assert torch.equal(gray[0], gray[1]) and torch.equal(gray[1], gray[2])
    assert not torch.equal(colour[0], colour[1])


def test_cub_odd_class_count_trains_on_the_smaller_half(tmp_path):
    parts = load_cub(make_cub(tmp_path, classes=5, per_class=2))
    assert labels_of(parts, "train") == {1, 2} and labels_of(parts, "test") == {3, 4, 5}



def test_cub_parts_index_their_samples_in_ascending_order(tmp_path):
    """Each part lists its samples in the dataset's order (image id), ascending: a part read
    backwards would hold the same samples in another order, which the fingerprint, the
    embeddings' rows and the class-balanced batches all follow."""
    parts = load_cub(make_cub(tmp_path, classes=4, per_class=3))
    assert parts.parts["train"].tolist() == [0, 1, 2, 3, 4, 5]
    assert parts.parts["test"].tolist() == [6, 7, 8, 9, 10, 11]
    assert parts.parts["train"].dtype == torch.int64


def test_dataset_parts_refuse_a_part_name_no_split_reads(tmp_path):
    """A format's parts are train/test or train/query/gallery: a misspelt name ("val") would be
    a part the split never reads, its samples silently left out."""
    dataset = load_cub(make_cub(tmp_path, classes=2, per_class=1)).dataset
    with pytest.raises(ValueError, match=r"unknown part names \['val'\]"):
        DatasetParts(dataset, {"train": torch.tensor([0]), "val": torch.tensor([1])})

@pytest.mark.parametrize(("break_it", "match"), [
    (lambda root: (root / "images.txt").unlink(), "missing images.txt"),
    (lambda root: (root / "image_class_labels.txt").unlink(), "missing image_class_labels.txt"),
    (lambda root: next((root / "images" / "002.Laysan_Albatross").iterdir()).unlink(),
     r"missing image .*002\.Laysan_Albatross.*\(1 of 12 listed"),
    (lambda root: set_line(root / "images.txt", 5, "5 a b"), r"images\.txt line 5 is malformed"),
    (lambda root: set_line(root / "images.txt", 2, "two 001.X/y.jpg"),
     r"images\.txt line 2 is malformed: 'two' is not an integer"),
    (lambda root: set_line(root / "image_class_labels.txt", 3, "3 three"),
     r"image_class_labels\.txt line 3 is malformed"),
    (lambda root: set_line(root / "image_class_labels.txt", 12, None),
     "image id 12 of images.txt has no line in image_class_labels.txt"),
    (lambda root: set_line(root / "images.txt", 3, "1 001.X/y.jpg"),
     "images.txt lists an image id twice"),
    (lambda root: (root / "images.txt").write_text("\n\n"), "images.txt lists nothing"),
    # The last of two labels would win; a label for no image, or one image under two ids (its
    # twin's perfect match), would be read silently.
    (lambda root: replace_text(root / "image_class_labels.txt", "\n12 4\n", "\n12 4\n1 4\n"),
     r"image_class_labels\.txt lines 1 and 13 both label image id 1; give each image one"),
    (lambda root: replace_text(root / "image_class_labels.txt", "\n12 4\n", "\n12 4\n99 4\n"),
     r"image id 99 of image_class_labels\.txt has no line in images\.txt"),
    (lambda root: set_line(root / "images.txt", 2, (root / "images.txt").read_text()
                           .splitlines()[0].replace("1 ", "2 ./", 1)),
     r"images\.txt lines 1 and 2 list the image 001\.\S+\.jpg under two ids; list each"),
])
def test_cub_broken_layouts(tmp_path, break_it, match):
    make_cub(tmp_path)
    break_it(tmp_path)
    one_line_error(load_cub, tmp_path, match)


# Cars196


def test_cars196_labels_are_class_ids_and_split_ignores_test_flag(tmp_path):
    parts = load_cars196(make_cars196(tmp_path, classes=4, per_class=3))
    dataset = parts.dataset
    assert len(dataset) == 12
    assert labels_of(parts, "train") == {1, 2} and labels_of(parts, "test") == {3, 4}
    annotations = scipy.io.loadmat(tmp_path / "cars_annos.mat")["annotations"].ravel()
    expected = {str(tmp_path / record["relative_im_path"].item()): int(record["class"].item())
                for record in annotations}
    assert dict(zip(dataset.paths.tolist(), dataset.labels.tolist(), strict=True)) == expected
    assert dataset.paths[0].endswith("car_ims/000001.jpg")  # the .mat's order
    flags = torch.tensor([int(record["test"].item()) for record in annotations])
    assert set(flags[parts.parts["train"]].tolist()) == {0, 1}
    assert parts.eval_ks == (1, 2, 4, 8)
    assert dataset.class_names == {1: "AM General Hummer SUV 2000", 2: "Acura RL Sedan 2012",
                                   3: "Acura TL Sedan 2012", 4: "Acura TL Type-S 2008"}
    check_images(parts, tmp_path)



def test_cars196_odd_class_count_trains_on_the_smaller_half(tmp_path):
    """As CUB: the first half of the class ids, rounded down, train (98 of Cars196's 196)."""
    parts = load_cars196(make_cars196(tmp_path, classes=5, per_class=1))
    assert labels_of(parts, "train") == {1, 2} and labels_of(parts, "test") == {3, 4, 5}

def test_cars196_class_names_are_optional_but_must_be_strings(tmp_path):
    make_cars196(tmp_path)
    path = tmp_path / "cars_annos.mat"
    annotations = scipy.io.loadmat(path)["annotations"]
    scipy.io.savemat(path, {"annotations": annotations})
    assert load_cars196(tmp_path).dataset.class_names is None
    scipy.io.savemat(path, {"annotations": annotations, "class_names": np.zeros((1, 4))})
    one_line_error(load_cars196, tmp_path, "'class_names' must be a cell array of strings")


def test_cars196_class_names_saved_as_a_char_matrix_lose_its_padding(tmp_path):
    """A list of names saved with scipy (or a MATLAB char matrix) is padded with spaces to the
    longest name; the padding is no part of a name, which captions and search print."""
    make_cars196(tmp_path)
    path = tmp_path / "cars_annos.mat"
    annotations = scipy.io.loadmat(path)["annotations"]
    names = ["Audi A4", "BMW M3 Coupe", "Fiat 500", "Kia Rio"]
    scipy.io.savemat(path, {"annotations": annotations, "class_names": names})
    assert load_cars196(tmp_path).dataset.class_names == dict(enumerate(names, start=1))


def rewrite_annotations(root: Path, change: Callable[[np.ndarray], np.ndarray]) -> None:
    path = root / "cars_annos.mat"
    contents = scipy.io.loadmat(path)
    scipy.io.savemat(path, {"annotations": change(contents["annotations"]),
                            "class_names": contents["class_names"]})


def first_class_names(root: Path, count: int) -> None:
    path = root / "cars_annos.mat"
    contents = scipy.io.loadmat(path)
    scipy.io.savemat(path, {"annotations": contents["annotations"],
                            "class_names": contents["class_names"][:, :count]})


def without_field(annotations: np.ndarray, field: str) -> np.ndarray:
    kept = [name for name in annotations.dtype.names if name != field]
    smaller = np.zeros(annotations.shape, dtype=[(name, object) for name in kept])
    for name in kept:
        smaller[name] = annotations[name]
    return smaller


def with_class(annotations: np.ndarray, class_id: float | str) -> np.ndarray:
    annotations[0, 1]["class"] = np.array([[class_id]])
    return annotations


def without_path(annotations: np.ndarray) -> np.ndarray:
    annotations[0, 2]["relative_im_path"] = np.zeros((0, 0))
    return annotations


def with_path(annotations: np.ndarray, number: int, path: str) -> np.ndarray:
    """Annotation ``number`` (1-based) names the image ``path``."""
    annotations[0, number - 1]["relative_im_path"] = np.array([path])
    return annotations


def classification_release(root: Path) -> None:
    """Turn a Cars196 folder into the other release of the photos, for classification:
    devkit/cars_meta.mat, cars_train/, no cars_annos.mat nor car_ims/."""
    (root / "devkit").mkdir()
    names = scipy.io.loadmat(root / "cars_annos.mat")["class_names"]
    scipy.io.savemat(root / "devkit" / "cars_meta.mat", {"class_names": names})
    (root / "cars_annos.mat").unlink()
    (root / "car_ims").rename(root / "cars_train")


@pytest.mark.parametrize(("break_it", "match"), [
    (lambda root: (root / "cars_annos.mat").unlink(),
     r"missing cars_annos\.mat: put Cars196's cars_annos\.mat beside car_ims/"),
    (lambda root: ((root / "cars_annos.mat").unlink(), shutil.rmtree(root / "car_ims")),
     r"missing cars_annos\.mat: pass the folder that holds cars_annos\.mat and car_ims/"),
    (classification_release,
     r"missing cars_annos\.mat: devkit/cars_meta\.mat is of the Stanford Cars classification "
     r"release .*; get the same page's car_ims\.tgz and cars_annos\.mat"),
    (lambda root: write_matlab_v73(root / "cars_annos.mat"),
     r"cars_annos\.mat is a MATLAB v7\.3 \(HDF5\) file, which scipy cannot read; use the "
     r"original file \(MATLAB v5\), or save it again as v7"),
], ids=["car_ims-only", "empty", "classification-release", "matlab-v7.3"])
def test_cars196_says_what_to_do_without_a_readable_cars_annos_mat(tmp_path, break_it, match):
    """The devkit's files (the classification release) and a v7.3 file are named as such, with
    what to get instead; scipy's own words on a v7.3 file were 'use an HDF reader'."""
    make_cars196(tmp_path)
    break_it(tmp_path)
    one_line_error(load_cars196, tmp_path, match)


@pytest.mark.parametrize(("break_it", "match"), [
    (lambda root: (root / "cars_annos.mat").unlink(), "missing cars_annos.mat"),
    (lambda root: (root / "cars_annos.mat").write_bytes(b"not a MATLAB file" * 20),
     "cars_annos.mat is not a readable MATLAB file"),
    (lambda root: (root / "cars_annos.mat").write_bytes(
        (root / "cars_annos.mat").read_bytes()[:300]),
     "cars_annos.mat is not a readable MATLAB file"),
    (lambda root: scipy.io.savemat(root / "cars_annos.mat", {"class_names": np.zeros(3)}),
     "cars_annos.mat has no 'annotations' variable"),
    (lambda root: rewrite_annotations(root, lambda a: without_field(a, "class")),
     "cars_annos.mat: 'annotations' has no field 'class'"),
    (lambda root: rewrite_annotations(root, lambda a: without_field(a, "relative_im_path")),
     "cars_annos.mat: 'annotations' has no field 'relative_im_path'"),
    (lambda root: rewrite_annotations(root, without_path),
     "cars_annos.mat: annotation 3 has no single path and class id"),
    (lambda root: rewrite_annotations(root, lambda a: a[:, :0]), "cars_annos.mat lists nothing"),
    (lambda root: (root / "car_ims" / "000005.jpg").unlink(),
     r"missing image \S*car_ims/000005\.jpg \(1 of 12"),
    # int() of NaN raised a raw ValueError; 2.7 became class 2.
    (lambda root: rewrite_annotations(root, lambda a: with_class(a, np.nan)),
     "cars_annos.mat: annotation 2 has class id nan, not a whole number"),
    (lambda root: rewrite_annotations(root, lambda a: with_class(a, 2.7)),
     "cars_annos.mat: annotation 2 has class id 2.7, not a whole number"),
    # a class id saved as text: int("3") had read it as class 3, int("x") raised raw
    (lambda root: rewrite_annotations(root, lambda a: with_class(a, "3")),
     "cars_annos.mat: annotation 2 has no single path and class id"),
    # beyond int64, torch.tensor(labels) had stopped with a raw ValueError
    (lambda root: rewrite_annotations(root, lambda a: with_class(a, 1e20)),
     "cars_annos.mat: annotation 2 has class id 100000000000000000000, beyond a 64-bit label"),
    (lambda root: first_class_names(root, 2),  # the real file names all 196 classes
     "cars_annos.mat: 'class_names' names 2 classes but class id 3 has no name"),
    # One file named by two annotations: each copy its twin's perfect match, or two labels.
    (lambda root: rewrite_annotations(root, lambda a: with_path(a, 4, "car_ims/000001.jpg")),
     r"cars_annos\.mat: annotations 1 and 4 both name the image car_ims/000001\.jpg( with "
     r"class ids \d and \d)?; give each image one annotation"),
    (lambda root: rewrite_annotations(root, lambda a: with_path(a, 2, "car_ims/./000001.jpg")),
     r"annotations 1 and 2 both name the image car_ims/000001\.jpg"),
])
def test_cars196_broken_layouts(tmp_path, break_it, match):
    make_cars196(tmp_path)
    break_it(tmp_path)
    one_line_error(load_cars196, tmp_path, match)


def test_cars196_an_image_named_twice_is_refused_with_both_annotations_class_ids(tmp_path):
    """The error names the class ids of the two annotations it names, as the .mat holds them
    (read here without kdml), not those of their neighbours (chosen of other classes)."""
    make_cars196(tmp_path, classes=4, per_class=4)
    annotations = scipy.io.loadmat(tmp_path / "cars_annos.mat")["annotations"][0]
    ids = [int(np.ravel(record["class"])[0]) for record in annotations]  # ids[n - 1]: n's
    first, second = next((a, b) for a in range(1, len(ids)) for b in range(a + 2, len(ids))
                         if len({ids[a - 1], ids[a], ids[b - 1]}) == 3 and ids[b] != ids[b - 1])
    path = f"car_ims/{first:06d}.jpg"
    rewrite_annotations(tmp_path, lambda a: with_path(a, second, path))
    one_line_error(load_cars196, tmp_path,
                   rf"annotations {first} and {second} both name the image {re.escape(path)} "
                   rf"with class ids {ids[first - 1]} and {ids[second - 1]};")


# Stanford Online Products


def test_sop_uses_the_files_split_and_class_ids(tmp_path):
    parts = load_sop(make_sop(tmp_path, classes=6, per_class=3))
    dataset = parts.dataset
    assert len(dataset) == 18
    assert parts.parts["train"].tolist() == list(range(9))
    assert parts.parts["test"].tolist() == list(range(9, 18))
    assert labels_of(parts, "train") == {1, 2, 3} and labels_of(parts, "test") == {4, 5, 6}
    rows = [line.split() for file in ("Ebay_train.txt", "Ebay_test.txt")
            for line in (tmp_path / file).read_text().splitlines()[1:]]
    assert dataset.paths.tolist() == [str(tmp_path / row[3]) for row in rows]
    assert dataset.labels.tolist() == [int(row[1]) for row in rows]
    folders = {Path(path).parent.name for path in dataset.paths}
    assert len(folders) >= 2 and all(folder.endswith("_final") for folder in folders)
    assert torch.bincount(dataset.labels).tolist()[1:] == [3] * 6
    assert parts.eval_ks == (1, 10, 100, 1000)
    check_images(parts, tmp_path)


def copy_path(source: Path, line: int, target: Path, target_line: int) -> None:
    """Give line ``target_line`` of the SOP list ``target`` the image path of ``source``'s
    line ``line``: one image listed twice (the real lists name each image once)."""
    path = source.read_text().splitlines()[line - 1].split()[3]
    fields = target.read_text().splitlines()[target_line - 1].split()
    set_line(target, target_line, " ".join([*fields[:3], f"./{path}"]))


@pytest.mark.parametrize(("break_it", "match"), [
    (lambda root: (root / "Ebay_test.txt").unlink(), "missing Ebay_test.txt"),
    (lambda root: set_line(root / "Ebay_train.txt", 1, "id class super path"),
     r"Ebay_train\.txt line 1 is not the header 'image_id class_id super_class_id path'"),
    (lambda root: set_line(root / "Ebay_test.txt", 1, None),
     r"Ebay_test\.txt line 1 is not the header .*: '5 3 3 "),
    (lambda root: set_line(root / "Ebay_test.txt", 3, "6 3 bicycle_final/1_1.JPG"),
     r"Ebay_test\.txt line 3 is malformed: expected 4 fields"),
    (lambda root: set_line(root / "Ebay_test.txt", 3, "6 3 3 bicycle_final/my bike.JPG"),
     r"Ebay_test\.txt line 3 is malformed: expected 4 fields.*'6 3 3 bicycle_final/my bike\.JPG' "
     r"\(fields are separated by whitespace: rename any file or folder with a space in its name\)"),
    (lambda root: set_line(root / "Ebay_train.txt", 2, "1 one 1 bicycle_final/1_0.JPG"),
     r"Ebay_train\.txt line 2 is malformed: 'one' is not an integer"),
    # int() reads 1_1 as 11; a class id beyond int64 had stopped with a raw OverflowError
    (lambda root: set_line(root / "Ebay_train.txt", 2, "1 1_1 1 bicycle_final/1_0.JPG"),
     r"Ebay_train\.txt line 2 is malformed: '1_1' is not an integer"),
    (lambda root: set_line(root / "Ebay_train.txt", 2, f"1 {2**63} 1 bicycle_final/1_0.JPG"),
     r"Ebay_train\.txt line 2 is malformed: 9223372036854775808 is beyond the 64-bit integers "
     r"an id can be \(searched"),
    (lambda root: next((root / "cabinet_final").iterdir()).unlink(),
     r"missing image \S*cabinet_final/\S+\.JPG \(1 of 8"),
    (lambda root: copy_path(root / "Ebay_test.txt", 2, root / "Ebay_test.txt", 3),
     r"Ebay_test\.txt lines 2 and 3 list the image \S+\.JPG twice; list each image once"),
    (lambda root: copy_path(root / "Ebay_train.txt", 4, root / "Ebay_test.txt", 2),
     r"Ebay_train\.txt line 4 and Ebay_test\.txt line 2 list the image \S+\.JPG twice with "
     r"class ids 2 and 3; list each image once"),
])
def test_sop_broken_layouts(tmp_path, break_it, match):
    make_sop(tmp_path)
    break_it(tmp_path)
    one_line_error(load_sop, tmp_path, match)


def test_sop_reads_files_that_start_with_a_byte_order_mark(tmp_path):
    expected = load_sop(make_sop(tmp_path)).dataset.labels
    with_bom(tmp_path / "Ebay_train.txt")  # the header check saw '\ufeffimage_id ...'
    assert torch.equal(load_sop(tmp_path).dataset.labels, expected)


# In-Shop Clothes Retrieval


def test_inshop_parts_and_item_labels(tmp_path):
    parts = load_inshop(make_inshop(tmp_path, items=6, per_item=3))
    dataset = parts.dataset
    assert len(dataset) == 18
    assert set(parts.parts) == {"train", "query", "gallery"}
    assert [len(parts.parts[part]) for part in ("train", "query", "gallery")] == [9, 6, 3]
    items = [Path(path).parent.name for path in dataset.paths]  # img/.../<item_id>/<file>
    assert items != sorted(items)  # the list is in path order, not item order
    numbered = {item: label for label, item in enumerate(sorted(set(items)))}
    assert dataset.labels.tolist() == [numbered[item] for item in items]
    assert labels_of(parts, "query") == labels_of(parts, "gallery")
    assert not labels_of(parts, "train") & labels_of(parts, "query")
    assert len(labels_of(parts, "train")) == 3 and len(labels_of(parts, "query")) == 3
    assert parts.eval_ks == (1, 10, 20, 30, 40, 50)
    check_images(parts, tmp_path)


def test_inshop_reads_the_original_archives_eval_folder(tmp_path):
    at_root = load_inshop(make_inshop(tmp_path / "a"))
    in_eval = load_inshop(make_inshop(tmp_path / "b", eval_folder=True))
    assert not (tmp_path / "b" / "list_eval_partition.txt").exists()
    assert torch.equal(at_root.dataset.labels, in_eval.dataset.labels)
    assert all(torch.equal(at_root.parts[part], in_eval.parts[part]) for part in at_root.parts)
    assert all(Path(path).is_file() for path in in_eval.dataset.paths)


LIST = "list_eval_partition.txt"


def list_again(root: Path, status: str, new_status: str, item: str | None = None) -> None:
    """List the first ``status`` row's image again at the end, as ``new_status`` (and under
    ``item``, if given), with the count on line 1 raised to match."""
    lines = (root / LIST).read_text().splitlines()
    path, old_item, _ = next(line.split() for line in lines[2:] if line.split()[2] == status)
    lines.append(f"{path} {item or old_item} {new_status}")
    lines[0] = str(len(lines) - 2)
    (root / LIST).write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(("break_it", "match"), [
    (lambda root: (root / LIST).unlink(), r"missing list_eval_partition\.txt"),
    (lambda root: set_line(root / LIST, 1, "52712"),
     r"list_eval_partition\.txt line 1 says 52712 images but 18 are listed"),
    (lambda root: set_line(root / LIST, 1, "many"),
     r"list_eval_partition\.txt line 1 is malformed: 'many' is not an integer"),
    (lambda root: set_line(root / LIST, 2, "image_name item_id status"),
     r"list_eval_partition\.txt line 2 is not the header"),
    (lambda root: set_line(root / LIST, 5, "img/MEN/Denim/id_00000004/01_1_front.jpg "
                                           "id_00000004 val"),
     r"list_eval_partition\.txt line 5: unknown evaluation_status 'val'"),
    (lambda root: set_line(root / LIST, 7, "img/MEN/Denim/id_00000004/01_1_front.jpg train"),
     r"list_eval_partition\.txt line 7 is malformed: expected 3 fields"),
    (lambda root: next((root / "img" / "MEN" / "Denim" / "id_00000004").iterdir()).unlink(),
     r"missing image \S*img/MEN/Denim/id_00000004/\S+\.jpg \(1 of 18"),
    # Not "the standard split leaves the test part empty", which the list does not speak of.
    (lambda root: replace_text(root / LIST, " query", " gallery"),
     r"list_eval_partition\.txt has no query rows \(no line's evaluation_status is query\)"),
    (lambda root: replace_text(root / LIST, " gallery", " query"),
     r"list_eval_partition\.txt has no gallery rows"),
    # A query that is also a gallery image finds itself: the gallery search does not leave a
    # query's own image out.
    (lambda root: list_again(root, "query", "gallery"),
     r"list_eval_partition\.txt lines \d+ and 21 list the image img/\S+\.jpg twice, as a query "
     r"and a gallery image, so the query would find itself \(a perfect Recall@1\); list each"),
    (lambda root: list_again(root, "gallery", "gallery"),
     r"list_eval_partition\.txt lines \d+ and 21 list the image img/\S+\.jpg twice; list each"),
    (lambda root: list_again(root, "train", "train", item="id_00000099"),
     r"lines \d+ and 21 list the image img/\S+\.jpg twice with item ids id_\d+ and id_00000099"),
])
def test_inshop_broken_layouts(tmp_path, break_it, match):
    make_inshop(tmp_path)
    break_it(tmp_path)
    one_line_error(load_inshop, tmp_path, match)


def test_inshop_and_cub_read_files_that_start_with_a_byte_order_mark(tmp_path):
    expected = load_inshop(make_inshop(tmp_path / "inshop")).dataset.labels
    with_bom(tmp_path / "inshop" / LIST)  # line 1 read as '\ufeff18', not an integer
    assert torch.equal(load_inshop(tmp_path / "inshop").dataset.labels, expected)
    expected = load_cub(make_cub(tmp_path / "cub")).dataset.labels
    with_bom(tmp_path / "cub" / "images.txt")
    with_bom(tmp_path / "cub" / "image_class_labels.txt")
    assert torch.equal(load_cub(tmp_path / "cub").dataset.labels, expected)


def test_inshop_errors_name_the_eval_folders_file(tmp_path):
    make_inshop(tmp_path, eval_folder=True)
    set_line(tmp_path / "Eval" / LIST, 2, "name item status")
    one_line_error(load_inshop, tmp_path, r"Eval/list_eval_partition\.txt line 2")


# Through the registry


MAKERS = {"cub": make_cub, "cars196": make_cars196, "sop": make_sop, "inshop": make_inshop}


@pytest.mark.parametrize("name", MAKERS)
def test_open_dataset_reads_each_format(tmp_path, name):
    expected = {"cub": 12, "cars196": 12, "sop": 8, "inshop": 18}[name]
    parts = open_dataset(name, root=str(MAKERS[name](tmp_path)))
    assert len(parts.dataset) == expected and parts.dataset.name == name


@pytest.mark.parametrize(("name", "file"), [
    ("cub", "images.txt"), ("cars196", "cars_annos.mat"), ("sop", "Ebay_train.txt"),
    ("inshop", "list_eval_partition.txt"),
])
def test_open_dataset_on_an_empty_folder(tmp_path, name, file):
    with pytest.raises(KdmlError, match=f"{name}: missing {file}") as info:
        open_dataset(name, root=str(tmp_path))
    assert "\n" not in str(info.value) and str(tmp_path) in str(info.value)


def test_open_dataset_finds_the_folder_under_the_data_root_variable(tmp_path, monkeypatch):
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    make_inshop(tmp_path / "inshop", eval_folder=True)  # found by Eval/list_eval_partition.txt
    assert len(open_dataset("inshop").dataset) == 18
    with pytest.raises(KdmlError, match="cub: no dataset found") as info:
        open_dataset("cub")
    assert "\n" not in str(info.value)


# The folder names searched: --data-root and $KDML_DATA_ROOT alike

ARCHIVE_FOLDERS = {"cub": "CUB_200_2011", "sop": "Stanford_Online_Products",
                   "cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
BUILDERS: dict[str, Callable[[Path], Path]] = {
    **MAKERS, "cifar10": make_cifar10, "cifar100": lambda root: make_cifar100(root, classes=10),
    "mnist": lambda root: make_idx(root, train=20, test=10),
    "fashion-mnist": lambda root: make_idx(root, train=20, test=10, name="fashion-mnist"),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_data_root_and_the_variable_search_the_same_folder_names(tmp_path, monkeypatch, name):
    """A base folder holding the dataset as the folder its archive unpacks to, as ``<name>``,
    or as ``<name>/<archive folder>``, is found both as ``--data-root BASE`` and as
    ``$KDML_DATA_ROOT=BASE``. The variable had looked in ``<name>`` only (not in
    ``CUB_200_2011``), and ``--data-root`` not in ``<name>``."""
    assert set(BUILDERS) == set(FORMATS)
    built = BUILDERS[name](tmp_path / "built")
    archive = ARCHIVE_FOLDERS.get(name, "")
    names = [archive, name, f"{name}/{archive}"] if archive else [name]
    for number, relative in enumerate(names):
        base = tmp_path / f"base{number}"
        shutil.copytree(built, base / relative)
        monkeypatch.delenv(ROOT_VARIABLE, raising=False)
        assert find_root(FORMATS[name], str(base)) == base / relative, relative
        monkeypatch.setenv(ROOT_VARIABLE, str(base))
        assert find_root(FORMATS[name]) == base / relative, relative
    assert len(open_dataset(name).dataset) == len(open_dataset(name, str(built)).dataset)


def test_the_data_root_variable_holds_datasets_and_names_the_folders_searched(tmp_path,
                                                                                monkeypatch):
    """``$KDML_DATA_ROOT`` is a folder of datasets, not one: files directly in it are read as no
    dataset (MNIST's and Fashion-MNIST's have the same names); ``--data-root`` reads them. A
    dataset not found is refused with every folder searched."""
    files = make_idx(tmp_path, train=20, test=10, name="data")
    monkeypatch.setenv(ROOT_VARIABLE, str(files))
    with pytest.raises(KdmlError, match=f"mnist: no dataset found .searched: {files}/mnist.;"):
        open_dataset("mnist")
    assert len(open_dataset("mnist", str(files)).dataset) == 30
    with pytest.raises(KdmlError) as info:
        open_dataset("cub")
    searched = ", ".join(f"{files}/{name}" for name in ("CUB_200_2011", "cub",
                                                        "cub/CUB_200_2011"))
    assert f"(searched: {searched}); pass its folder with --data-root DIR" in str(info.value)
    assert "\n" not in str(info.value)


def test_the_data_root_variable_set_to_a_dataset_s_own_or_a_missing_folder_says_so(
        tmp_path, monkeypatch):
    """``$KDML_DATA_ROOT`` naming the dataset's own folder (``.../CUB_200_2011``) or a folder
    that does not exist had been told only the folders searched inside it, and to set the
    variable it had set."""
    cub = make_cub(tmp_path / "CUB_200_2011")
    monkeypatch.setenv(ROOT_VARIABLE, str(cub))
    with pytest.raises(KdmlError, match=f"; .{ROOT_VARIABLE}={cub} is cub's own folder, but the "
                                        f"variable names the folder that holds the datasets, "
                                        f"each in a folder of its own: set it to {tmp_path}, or "
                                        f"pass this one with --data-root {cub}$"):
        open_dataset("cub")
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))  # what the message says works
    assert len(open_dataset("cub").dataset) == 12
    files = make_idx(tmp_path / "digits", train=20, test=10, name="data")  # not named mnist
    monkeypatch.setenv(ROOT_VARIABLE, str(files))
    with pytest.raises(KdmlError, match=f"move the files into {files}/mnist, or pass this one "
                                        f"with --data-root {files}$"):
        open_dataset("mnist")
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path / "nowhere"))
    with pytest.raises(KdmlError, match=f"; .{ROOT_VARIABLE}={tmp_path}/nowhere does not exist: "
                                        "set it to the folder that holds your datasets") as info:
        open_dataset("cub")
    assert "\n" not in str(info.value)


def test_a_data_root_holding_the_dataset_s_folder_is_read_there_even_when_incomplete(tmp_path):
    """--data-root DIR with the files in DIR/<name>/ but not all of them: the reader names
    what is missing in DIR/<name>, where they are, not in DIR."""
    make_cars196(tmp_path / "cars196")
    classification_release(tmp_path / "cars196")
    assert find_root(FORMATS["cars196"], str(tmp_path)) == tmp_path / "cars196"
    with pytest.raises(KdmlError, match=r"devkit/cars_meta\.mat is of the Stanford Cars "
                                        r"classification release"):
        open_dataset("cars196", root=str(tmp_path))


def test_the_data_root_variable_reads_an_incomplete_dataset_folder_there(tmp_path, monkeypatch):
    """Under ``$KDML_DATA_ROOT`` as under ``--data-root``: a folder named for the dataset but
    without its files is handed to the reader, which names what is missing there (the
    classification release of Stanford Cars, an empty CUB folder), rather than the generic
    "no dataset found"."""
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    make_cars196(tmp_path / "cars196")
    classification_release(tmp_path / "cars196")
    with pytest.raises(KdmlError, match=r"devkit/cars_meta\.mat is of the Stanford Cars "
                                        r"classification release"):
        open_dataset("cars196")
    (tmp_path / "cub" / "CUB_200_2011").mkdir(parents=True)
    with pytest.raises(KdmlError, match="cub: missing images.txt") as info:
        open_dataset("cub")
    assert str(tmp_path / "cub" / "CUB_200_2011") in str(info.value)


def test_cub_orders_the_images_by_image_id_whatever_the_lines_order(tmp_path):
    """images.txt and image_class_labels.txt listed in another order (a re-saved or merged
    copy) give the same dataset: the samples in image-id order, each with its own label."""
    expected = load_cub(make_cub(tmp_path)).dataset
    for file in ("images.txt", "image_class_labels.txt"):
        lines = (tmp_path / file).read_text().splitlines()
        (tmp_path / file).write_text("\n".join(reversed(lines)) + "\n")
    dataset = load_cub(tmp_path).dataset
    assert dataset.paths.tolist() == expected.paths.tolist()
    assert torch.equal(dataset.labels, expected.labels)


def test_cub_class_names_drop_only_a_numeric_prefix():
    """Only CUB's own 'NNN.' prefix is dropped from a folder's name; a folder named otherwise
    (a dot in the name itself) keeps all of it."""
    assert folder_class_name("001.Black_footed_Albatross") == "Black footed Albatross"
    assert folder_class_name("St.Kilda_Wren") == "St.Kilda Wren"
    assert folder_class_name("Wren") == "Wren"


def test_sop_skips_blank_lines_inside_a_list(tmp_path):
    """A blank (or whitespace-only) line inside a list is skipped, not the end of it: the
    images after it are read too."""
    expected = load_sop(make_sop(tmp_path)).dataset
    lines = (tmp_path / "Ebay_test.txt").read_text().splitlines()
    (tmp_path / "Ebay_test.txt").write_text("\n".join([*lines[:2], "", "  ", *lines[2:]]) + "\n")
    dataset = load_sop(tmp_path).dataset
    assert dataset.paths.tolist() == expected.paths.tolist()
    assert torch.equal(dataset.labels, expected.labels)


def test_cars196_reads_annotations_saved_as_a_column(tmp_path):
    """An N x 1 'annotations' struct array (the file saved again with the array transposed)
    is read as the 1 x N original is: every annotation, in order."""
    expected = load_cars196(make_cars196(tmp_path)).dataset
    rewrite_annotations(tmp_path, lambda annotations: annotations.T)
    dataset = load_cars196(tmp_path).dataset
    assert dataset.paths.tolist() == expected.paths.tolist()
    assert torch.equal(dataset.labels, expected.labels)


def with_two_values(annotations: np.ndarray, field: str) -> np.ndarray:
    """Annotation 3 holds two values in ``field`` (two paths, or two class ids)."""
    record = annotations[0, 2]
    record[field] = (np.array(["car_ims/000003.jpg", "car_ims/000003.jpg"])
                     if field == "relative_im_path" else np.array([[1, 2]], dtype=np.uint8))
    return annotations


@pytest.mark.parametrize("field", ["relative_im_path", "class"])
def test_cars196_refuses_an_annotation_with_two_paths_or_class_ids(tmp_path, field):
    """Which of two paths or class ids is meant cannot be told: the first is not taken."""
    make_cars196(tmp_path)
    rewrite_annotations(tmp_path, lambda annotations: with_two_values(annotations, field))
    one_line_error(load_cars196, tmp_path,
                   "cars_annos.mat: annotation 3 has no single path and class id")


def test_inshop_reads_the_root_s_list_before_the_eval_folders(tmp_path):
    """With both, the root's list_eval_partition.txt is read (as the docstring orders them),
    not Eval/'s."""
    make_inshop(tmp_path, items=6, per_item=3)
    (tmp_path / "Eval").mkdir()
    (tmp_path / "Eval" / "list_eval_partition.txt").write_text(
        "1\nimage_name item_id evaluation_status\nimg/MEN/Denim/id_00000004/01_1_front.jpg "
        "id_00000004 train\n")
    assert len(load_inshop(tmp_path).dataset) == 18


def test_inshop_reads_img_even_beside_the_archive_s_img_img(tmp_path):
    """img/ in place is read, even with the archive's Img/img/ also left beside it: the
    'move Img/img/' advice is only for a copy without img/."""
    make_inshop(tmp_path, items=6, per_item=3)
    (tmp_path / "Img" / "img").mkdir(parents=True)
    assert len(load_inshop(tmp_path).dataset) == 18


def test_a_data_root_reads_the_folder_that_holds_the_dataset_before_a_deeper_empty_one(
        tmp_path):
    """--data-root DIR with the dataset in DIR/CUB_200_2011/ and an unrelated DIR/cub/ (say,
    an empty download folder): the folder with the files is read, not the more specific one."""
    make_cub(tmp_path / "CUB_200_2011")
    (tmp_path / "cub").mkdir()
    assert find_root(FORMATS["cub"], str(tmp_path)) == tmp_path / "CUB_200_2011"
    assert len(open_dataset("cub", root=str(tmp_path)).dataset) == 12


def test_cars196_is_found_by_cars_annos_mat_beside_an_empty_cars196_folder(tmp_path):
    """--data-root DIR holding cars_annos.mat and car_ims/, and an empty DIR/cars196/: DIR is
    where the marker file is, so DIR is read."""
    make_cars196(tmp_path)
    (tmp_path / "cars196").mkdir()
    assert find_root(FORMATS["cars196"], str(tmp_path)) == tmp_path
    assert len(open_dataset("cars196", root=str(tmp_path)).dataset) == 12


def as_a_folder(path: Path) -> None:
    """Replace the file ``path`` by a folder of that name."""
    path.unlink()
    path.mkdir()


@pytest.mark.parametrize(("make", "load", "needed", "match"), [
    (make_cub, load_cub, "images.txt", r"cub: images\.txt is not a file \(searched"),
    (make_cars196, load_cars196, "cars_annos.mat",
     r"cars196: cars_annos\.mat is not a file: put Cars196's cars_annos\.mat beside car_ims/"),
    (make_inshop, load_inshop, "list_eval_partition.txt",
     r"inshop: list_eval_partition\.txt is not a file \(searched"),
    (lambda root: make_idx(root, train=20, test=10, gzipped=False, name="."), load_mnist,
     "train-images-idx3-ubyte", r"mnist: train-images-idx3-ubyte is not a file \(searched for "
                                r"train-images-idx3-ubyte, train-images-idx3-ubyte\.gz"),
], ids=["cub", "cars196", "inshop", "idx"])
def test_a_needed_file_that_is_a_folder_is_called_so_not_missing(tmp_path, make, load, needed,
                                                                  match):
    """A folder where a needed file belongs had been reported as the file "missing", which
    sends the user looking for a file that seems to be there."""
    make(tmp_path)
    as_a_folder(tmp_path / needed)
    one_line_error(load, tmp_path, match)


def listed_path(root: Path, relative: str, number: int, column: int, under: str = "") -> Path:
    """The image that line ``number`` (1-based) of the list ``relative`` names in ``column``."""
    line = (root / relative).read_text().splitlines()[number - 1]
    return root / under / line.split()[column]


def reversed_lines(path: Path) -> None:
    """Write the lines of ``path`` in reverse order (CUB's images.txt listed last id first)."""
    path.write_text("\n".join(reversed(path.read_text().splitlines())) + "\n")


@pytest.mark.parametrize(("make", "load", "break_it", "match"), [
    # listed last id first: the line of image id 2, not its place in id order (2)
    (make_cub, load_cub, lambda root: (reversed_lines(root / "images.txt"),
                                       listed_path(root, "images.txt", 11, 1, "images").unlink()),
     r"cub: images\.txt line 11: missing image \S*/images/001\.\S+_2\.jpg \(1 of 12"),
    (make_sop, load_sop, lambda root: listed_path(root, "Ebay_test.txt", 3, 3).unlink(),
     r"sop: Ebay_test\.txt line 3: missing image \S+\.JPG \(1 of 8"),
    (make_sop, load_sop, lambda root: as_a_folder(listed_path(root, "Ebay_train.txt", 2, 3)),
     r"sop: Ebay_train\.txt line 2: \S+\.JPG is a folder, not an image file"),
    (lambda root: make_inshop(root, eval_folder=True), load_inshop,
     lambda root: listed_path(root, "Eval/list_eval_partition.txt", 7, 0).unlink(),
     r"inshop: Eval/list_eval_partition\.txt line 7: missing image \S+\.jpg \(1 of 18"),
    (make_cars196, load_cars196, lambda root: (root / "car_ims" / "000005.jpg").unlink(),
     r"cars196: cars_annos\.mat annotation 5: missing image \S*car_ims/000005\.jpg \(1 of 12"),
], ids=["cub", "sop", "sop-folder", "inshop", "cars196"])
def test_a_listed_image_that_is_not_a_file_is_named_with_its_line(tmp_path, make, load,
                                                                   break_it, match):
    """A missing image (or a folder in its place) is reported on its line of the list file that
    names it, as a CSV list's is: in a list of 120,053 lines the path alone leaves the user
    searching for which line to correct or remove."""
    make(tmp_path)
    break_it(tmp_path)
    one_line_error(load, tmp_path, match)


def _write_csv_list(root: Path) -> Path:
    """A CSV list of 4 photos (lines 2-5), two classes, two train and two test."""
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    rows = []
    for index in range(4):
        write_photo(root / f"p{index}.jpg", rng.uniform(30, 225, 3), rng, (20, 20))
        rows.append(f"p{index}.jpg,{index % 2},{'train' if index < 2 else 'test'}")
    (root / "list.csv").write_text("path,label,split\n" + "\n".join(rows) + "\n")
    return root / "list.csv"


@pytest.mark.parametrize(("make", "load", "position", "place"), [
    (lambda root: make_cub(root), load_cub, 4, "images.txt line 5"),
    (lambda root: make_sop(root), load_sop, 5, "Ebay_test.txt line 3"),
    (lambda root: make_inshop(root), load_inshop, 4, "list_eval_partition.txt line 7"),
    (lambda root: make_cars196(root), load_cars196, 4, "cars_annos.mat annotation 5"),
    (_write_csv_list, load_csv, 2, "list.csv line 4"),
])
def test_an_image_that_does_not_decode_is_named_with_its_place_in_the_list(
        tmp_path, caplog, make, load, position, place):
    """A listed image that is there but does not decode (here a 0-byte file) had been named by
    its path alone, while a missing one names its list file and line: the row to fix in a list
    of 120,053. The error (data.on_bad_image=error) and the skip warning now name both, also
    for a part of the dataset (the loader's subsets keep each image's place)."""
    from kdml.data.loaders import readable_batches, sequential_loader

    parts = load(make(tmp_path / "set"))
    dataset = parts.dataset.resized(8)
    assert isinstance(dataset, ImageFiles)
    Path(dataset.paths[position]).write_bytes(b"")
    part = dataset.subset(torch.tensor([position, 0]))  # the bad image first, in a part
    for files in (dataset, part):
        with pytest.raises(KdmlError, match=re.escape(
                f"cannot decode image {dataset.paths[position]} ({place}): ")) as error:
            list(readable_batches(sequential_loader(files, 4, 0), files, "error"))
        assert "\n" not in str(error.value)
    caplog.clear()
    with caplog.at_level("WARNING", logger="kdml"):
        list(readable_batches(sequential_loader(part, 4, 0), part, "skip"))
    assert [record.getMessage() for record in caplog.records] == [
        f"skipping unreadable image {dataset.paths[position]} ({place})"]
