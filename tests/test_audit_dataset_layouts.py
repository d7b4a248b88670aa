"""Audit: the four photo benchmarks (CUB-200-2011, Cars196, Stanford Online Products, In-Shop)
as users unpack their official archives: a data root one folder too high or too low, an
archive not yet extracted, In-Shop's other image folders, the other Cars release's photos
beside cars_annos.mat, and list files as Windows or an editor leaves them. Each is read as it
is, or refused in one line that names the folder or archive to use."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import torch
from fixtures_array_sets import make_idx
from fixtures_photo_sets import make_cars196, make_cub, make_inshop, make_sop

from kdml import cli
from kdml.data.formats.cars import load_cars196
from kdml.data.formats.inshop import load_inshop
from kdml.data.registry import ROOT_VARIABLE, open_dataset
from kdml.errors import KdmlError

SMALL = {"size": (8, 8)}
LIST = "list_eval_partition.txt"


def cub(root: Path) -> Path:
    return make_cub(root, classes=4, per_class=2, **SMALL)


def cars(root: Path) -> Path:
    return make_cars196(root, classes=4, per_class=2, **SMALL)


def sop(root: Path) -> Path:
    return make_sop(root, classes=4, per_class=2, **SMALL)


def inshop(root: Path, eval_folder: bool = True) -> Path:
    return make_inshop(root, items=4, per_item=2, eval_folder=eval_folder, **SMALL)


MAKERS: dict[str, Callable[[Path], Path]] = {"cub": cub, "cars196": cars, "sop": sop,
                                             "inshop": inshop}

MARKERS = {"cub": "images.txt", "cars196": "cars_annos.mat", "sop": "Ebay_train.txt",
           "inshop": LIST}


def refusal(name: str, root: Path | str) -> str:
    """open_dataset's one-line refusal of ``name`` in the data root ``root``."""
    with pytest.raises(KdmlError) as info:
        open_dataset(name, str(root))
    message = str(info.value)
    assert "\n" not in message
    return message


# A data root one folder above the dataset: the archive extracted into a folder of its own
# name, or a folder that kdml's search does not name (case counts on Linux; In-Shop's Google
# Drive folder). Each had been "missing images.txt" of the folder above, not naming where the
# files are.
@pytest.mark.parametrize(("name", "inside"), [
    ("cub", "CUB_200_2011/CUB_200_2011"),
    ("cub", "cub/CUB_200_2011/CUB_200_2011"),
    ("sop", "Stanford_Online_Products/Stanford_Online_Products"),
    ("cars196", "Cars196"),
    ("inshop", "In-shop Clothes Retrieval Benchmark"),
])
def test_a_dataset_one_folder_further_down_is_named_with_the_data_root_to_give(
        tmp_path, name, inside):
    folder = MAKERS[name](tmp_path / inside)
    message = refusal(name, tmp_path)
    assert message.endswith(f"; {folder} holds them, one folder further down than kdml "
                            f"searches: pass --data-root {folder}")
    assert len(open_dataset(name, str(folder)).dataset) > 0  # as it says


@pytest.mark.parametrize(("name", "inside"), [
    ("cub", "images"), ("cars196", "car_ims"), ("sop", "bicycle_final"), ("inshop", "img"),
])
def test_a_data_root_inside_the_dataset_names_the_folder_above(tmp_path, name, inside):
    """A data root given as the images' folder (or a trailing slash on it) had been "missing
    images.txt" of that folder."""
    root = MAKERS[name](tmp_path / "data")
    message = refusal(name, f"{root / inside}/")
    assert message == (f"{name}: {root / inside} does not hold {name}'s files "
                       f"({MARKERS[name]}); the folder above it, {root}, holds them: pass "
                       f"--data-root {root}")


@pytest.mark.parametrize(("name", "archive", "folder"), [
    ("cub", "CUB_200_2011.tgz", "CUB_200_2011"),
    ("sop", "Stanford_Online_Products.zip", "Stanford_Online_Products"),
])
def test_an_archive_not_yet_extracted_is_named(tmp_path, monkeypatch, capsys, name, archive,
                                               folder):
    """The downloaded archive beside no extracted folder, under --data-root and
    $KDML_DATA_ROOT alike (and in `kdml datasets`), or beside a folder extracted in part."""
    (tmp_path / archive).write_bytes(b"\x1f\x8b")
    said = (f"{archive} is in {tmp_path}, not extracted (or only in part): extract it there, "
            f"where it unpacks to {folder}/")
    assert refusal(name, tmp_path).endswith(f"; {said}")
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    assert refusal(name, "").endswith(f"; {said}")
    assert cli.main(["datasets"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines()
               if line.split() and line.split()[0] == name]
    assert line.endswith(f"; not found ({said})")
    (tmp_path / folder / "bicycle_final").mkdir(parents=True)  # extraction stopped early
    assert refusal(name, tmp_path).endswith(f"; {said}")
    MAKERS[name](tmp_path / folder)  # extracted: read, the archive beside it left alone
    assert len(open_dataset(name, str(tmp_path)).dataset) == 8


def test_cifar_s_archive_not_yet_extracted_is_named(tmp_path):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b")
    assert refusal("cifar10", tmp_path).endswith(
        f"; cifar-10-python.tar.gz is in {tmp_path}, not extracted (or only in part): extract "
        "it there, where it unpacks to cifar-10-batches-py/")


def test_a_folder_named_as_another_dataset_s_is_not_offered(tmp_path):
    """MNIST's and Fashion-MNIST's files have the same names: a data root holding only
    fashion-mnist/ must not send an MNIST run there."""
    make_idx(tmp_path, train=20, test=10, name="fashion-mnist")
    (tmp_path / "fashion-mnist" / "raw").mkdir()
    for root in (tmp_path, tmp_path / "fashion-mnist" / "raw"):  # below it, and inside it
        message = refusal("mnist", root)
        assert "pass --data-root" not in message and message.startswith("mnist: missing ")


def test_an_extracted_archive_is_not_called_unextracted(tmp_path):
    """CUB_200_2011.tgz kept beside its extracted folder: a data root beside both (here an
    empty folder) is not told to extract it."""
    cub(tmp_path / "CUB_200_2011")
    (tmp_path / "CUB_200_2011.tgz").write_bytes(b"\x1f\x8b")
    (tmp_path / "other").mkdir()
    message = refusal("cub", tmp_path / "other")
    assert "not extracted" not in message and "missing images.txt" in message


def test_kdml_datasets_names_a_copy_one_folder_further_down(tmp_path, monkeypatch, capsys):
    folder = sop(tmp_path / "Stanford_Online_Products" / "Stanford_Online_Products")
    monkeypatch.setenv(ROOT_VARIABLE, str(tmp_path))
    assert cli.main(["datasets"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines()
               if line.split() and line.split()[0] == "sop"]
    assert line.endswith(f"; not complete in {folder.parent}, which training reads (missing "
                         f"Ebay_train.txt, Ebay_test.txt); {folder} holds them, one folder "
                         f"further down than kdml searches: pass --data-root {folder}")


def test_kdml_train_refuses_a_nested_copy_in_one_line_before_a_run_folder(tmp_path, capsys):
    folder = cub(tmp_path / "data" / "CUB_200_2011" / "CUB_200_2011")
    out = tmp_path / "run"
    assert cli.main(["train", "jrd", "--dataset", "cub", "--data-root",
                     str(tmp_path / "data"), "--out", str(out), "train.epochs=1",
                     "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kdml: error: cub: ")
    assert err.endswith(f"pass --data-root {folder}\n")
    assert not out.exists()


# In-Shop: the archive's Eval/ and Img/ folders


def test_inshop_root_given_as_its_eval_folder_names_the_folder_above(tmp_path):
    """Eval/ holds list_eval_partition.txt, so it was read as the root, and every image was
    "missing" under Eval/img/."""
    root = inshop(tmp_path)
    message = refusal("inshop", root / "Eval")
    assert (f"{LIST} is here but its images, img/, are in the folder above: pass --data-root "
            f"{root} (searched {root / 'Eval'};") in message
    assert "missing image" not in message


def test_inshop_eval_folder_list_with_images_above_the_root_is_only_missing(tmp_path):
    """The hint above is of a root that is Eval/ itself: a root whose list is in its Eval/ is
    the right one, and its images are missing, not elsewhere."""
    root = inshop(tmp_path / "data")
    (root / "img").rename(tmp_path / "img")
    message = refusal("inshop", root)
    assert f"missing image {root / 'img'}" in message and "folder above" not in message


@pytest.mark.parametrize("highres", ["img_highres", "Img/img_highres"])
def test_inshop_high_resolution_images_alone_are_named(tmp_path, highres):
    root = inshop(tmp_path)
    (root / highres).parent.mkdir(parents=True, exist_ok=True)
    (root / "img").rename(root / highres)
    message = refusal("inshop", root)
    assert (f"Eval/{LIST} lists the images as img/..., but only the high-resolution copies, "
            f"{highres}/, are here: extract Img/img.zip in {root}, where it unpacks to img/, or "
            f"rename {highres}/ to img/ to use the high-resolution copies") in message


def test_inshop_images_still_zipped_are_named(tmp_path):
    root = inshop(tmp_path)
    shutil.rmtree(root / "img")
    (root / "Img").mkdir()
    (root / "Img" / "img.zip").write_bytes(b"PK")
    message = refusal("inshop", root)
    assert (f"lists the images as img/..., but Img/img.zip is here, not extracted: extract "
            f"Img/img.zip in {root}, where it unpacks to img/ (searched") in message


@pytest.mark.parametrize(("edit", "said"), [
    # a blank line after the count: the header had been counted as an image
    (lambda lines: [lines[0], "", *lines[1:]], "line 2 is not the header"),
    # the header left out: the first image had been taken for it, and the count called wrong
    (lambda lines: [lines[0], *lines[2:]], "line 2 is not the header"),
])
def test_inshop_header_is_checked_before_the_count(tmp_path, edit, said):
    root = inshop(tmp_path, eval_folder=False)
    lines = (root / LIST).read_text().splitlines()
    (root / LIST).write_text("\n".join(edit(lines)) + "\n")
    message = load_error(load_inshop, root)
    assert f"{LIST} {said} 'image_name item_id evaluation_status'" in message
    assert "images but" not in message


def load_error(load: Callable[[Path], object], root: Path) -> str:
    with pytest.raises(KdmlError) as info:
        load(root)
    return str(info.value)


# Cars196 and the classification release of the same photos


def test_cars196_annotations_beside_the_classification_release_s_photos(tmp_path):
    """Some copies hold cars_annos.mat with cars_train/ and cars_test/ but no car_ims/: every
    annotation's image had been "missing", with nothing about why."""
    root = cars(tmp_path)
    (root / "car_ims").rename(root / "cars_train")
    (root / "cars_test").mkdir()
    message = load_error(load_cars196, root)
    assert (": cars_train/ and cars_test/ are of the Stanford Cars classification release, whose "
            f"photos are named and numbered otherwise; get car_ims.tgz and extract it in {root} "
            "(8 of 8 listed images are missing)") in message


def test_cars196_car_ims_extracted_in_part_is_not_called_the_other_release(tmp_path):
    """With car_ims/ there, a missing photo is one of it, whatever else lies beside it."""
    root = cars(tmp_path)
    (root / "cars_train").mkdir()
    (root / "car_ims" / "000003.jpg").unlink()
    message = load_error(load_cars196, root)
    assert "missing image" in message and "classification release" not in message


def test_cars196_one_folder_of_the_classification_release_is_named_alone(tmp_path):
    root = cars(tmp_path)
    (root / "car_ims").rename(root / "cars_train")
    assert ": cars_train/ is of the Stanford Cars classification release" in load_error(
        load_cars196, root)


def test_cars196_hints_only_of_car_ims_photos(tmp_path):
    """The hints (car_ims.tgz, the other release) are about car_ims/: an annotation edited to
    list a photo elsewhere is only missing."""
    root = cars(tmp_path)
    contents = scipy.io.loadmat(root / "cars_annos.mat")
    contents["annotations"][0, 0]["relative_im_path"] = np.array(["elsewhere/000001.jpg"])
    scipy.io.savemat(root / "cars_annos.mat", {key: contents[key]
                                               for key in ("annotations", "class_names")})
    (root / "car_ims.tgz").write_bytes(b"\x1f\x8b")
    (root / "cars_train").mkdir()
    message = load_error(load_cars196, root)
    assert f"missing image {root / 'elsewhere' / '000001.jpg'} (1 of 8" in message


@pytest.mark.parametrize("other", ["cars_test_annos_withlabels.mat", "cars_test/"])
def test_cars196_classification_release_is_named_by_its_test_files_too(tmp_path, other):
    root = cars(tmp_path)
    (root / "cars_annos.mat").unlink()
    shutil.rmtree(root / "car_ims")
    if other.endswith("/"):
        (root / other).mkdir()
    else:
        (root / other).write_bytes(b"")
    assert (f"missing cars_annos.mat: {other} is of the Stanford Cars classification release"
            in load_error(load_cars196, root))


# The split of the class ids, and list files as Windows or an editor saves them


@pytest.mark.parametrize("load", [lambda root: open_dataset("cub", str(make_cub(
    root, classes=7, per_class=2, **SMALL))), lambda root: load_cars196(make_cars196(
        root, classes=7, per_class=2, **SMALL))], ids=["cub", "cars196"])
def test_an_odd_number_of_classes_trains_on_the_first_half_rounded_down(tmp_path, load):
    """200 CUB classes give 100 and 100, 196 Cars give 98 and 98; an odd count (a list edited
    to leave classes out) trains on the smaller half as documented: 7 give 3 and 4 (5 do
    under half-to-even rounding too, so they would not show round() for //)."""
    parts = load(tmp_path)
    labels = parts.dataset.labels
    assert sorted(set(labels[parts.parts["train"]].tolist())) == [1, 2, 3]
    assert sorted(set(labels[parts.parts["test"]].tolist())) == [4, 5, 6, 7]


def test_sop_header_saved_with_tabs_and_windows_line_ends_is_read(tmp_path):
    """A list re-saved by a spreadsheet as tab-separated text with Windows line ends: the
    header, like the rows, is split on any whitespace."""
    root = sop(tmp_path)
    expected = open_dataset("sop", str(root))
    for name in ("Ebay_train.txt", "Ebay_test.txt"):
        text = (root / name).read_text().replace(" ", "\t").replace("\n", "\r\n")
        (root / name).write_bytes(text.encode())
    parts = open_dataset("sop", str(root))
    assert torch.equal(parts.dataset.labels, expected.dataset.labels)
    assert list(parts.dataset.paths) == list(expected.dataset.paths)


def test_inshop_list_with_windows_line_ends_and_blank_lines_reads_alike(tmp_path):
    """Windows line ends, and the blank lines an editor leaves at the end, which the count on
    line 1 does not count. (CUB's lists read alike as well, checked by hand.)"""
    root = inshop(tmp_path)
    expected = open_dataset("inshop", str(root))
    text = (root / "Eval" / LIST).read_text()
    (root / "Eval" / LIST).write_bytes((text + "\n\n").replace("\n", "\r\n").encode())
    parts = open_dataset("inshop", str(root))
    assert list(parts.dataset.paths) == list(expected.dataset.paths)
    assert torch.equal(parts.dataset.labels, expected.dataset.labels)
    assert all(torch.equal(parts.parts[part], expected.parts[part]) for part in expected.parts)
