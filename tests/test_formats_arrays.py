"""The CIFAR, IDX, folder and CSV readers on tiny files in their real formats."""

from __future__ import annotations

import gzip
import logging
import os
import pickle
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures_array_sets import (
    idx_bytes,
    make_cifar10,
    make_cifar100,
    make_csv_list,
    make_idx,
    make_image_folder,
    write_cifar_file,
    write_cifar_meta,
)
from PIL import Image

from kdml.data import ArrayDataset, ImageFiles, open_dataset
from kdml.data.formats.cifar import load_cifar10, load_cifar100
from kdml.data.formats.common import DEFAULT_KS, real_path
from kdml.data.formats.csv_list import load_csv
from kdml.data.formats.folder import load_folder
from kdml.data.formats.idx import FASHION_MNIST_CLASSES, load_fashion_mnist, load_mnist
from kdml.data.images import IMAGE_EXTENSIONS
from kdml.errors import KdmlError

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def one_line_error(call, *fragments: str) -> str:
    """Run ``call``, which must raise a one-line KdmlError containing every fragment."""
    with pytest.raises(KdmlError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    return message


def unpickle(path: Path) -> dict:
    """A fixture's own pickle, read back with the standard unpickler (trusted: we wrote it)."""
    with path.open("rb") as stream:
        return pickle.load(stream, encoding="bytes")


# CIFAR ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_images_labels_and_split(tmp_path, protocol):
    folder = make_cifar10(tmp_path, per_batch=6, test=4, protocol=protocol)
    parts = load_cifar10(folder)
    data = parts.dataset
    assert isinstance(data, ArrayDataset) and data.name == "cifar10"
    assert data.x.shape == (34, 3, 32, 32) and data.x.dtype == torch.uint8
    assert data.labels.dtype == torch.int64 and data.default_backbone == "cnn"
    assert torch.equal(parts.parts["train"], torch.arange(30))
    assert torch.equal(parts.parts["test"], torch.arange(30, 34))
    assert set(parts.parts) == {"train", "test"} and parts.eval_ks == DEFAULT_KS
    files = [f"data_batch_{n}" for n in range(1, 6)] + ["test_batch"]
    rows = np.concatenate([unpickle(folder / name)[b"data"] for name in files])
    labels = sum((unpickle(folder / name)[b"labels"] for name in files), [])
    assert data.labels.tolist() == labels
    # A row is the red, green and blue planes, each 32 rows of 32 pixels.
    image, row = data.x[31].numpy(), rows[31]
    assert image[0, 0, 0] == row[0] and image[0, 0, 5] == row[5] and image[0, 1, 0] == row[32]
    assert image[1, 0, 0] == row[1024] and image[2, 31, 31] == row[3071]
    assert np.array_equal(data.x.numpy().reshape(34, -1), rows)
    assert data.x.numpy().flags.writeable


def python2_pickle(rows: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR batch as Python 2's cPickle wrote the real files: protocol 2, byte strings
    (SHORT_BINSTRING / BINSTRING) and NumPy 1's ``numpy.core.multiarray`` name."""

    def string(value: bytes) -> bytes:
        if len(value) < 256:
            return b"U" + bytes([len(value)]) + value
        return b"T" + struct.pack("<I", len(value)) + value

    dtype = (b"cnumpy\ndtype\n" + string(b"u1") + b"\x89\x88\x87R"
             b"(K\x03" + string(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb")
    array = (b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + string(b"b")
             + b"\x87R(K\x01M" + struct.pack("<H", rows.shape[0]) + b"M"
             + struct.pack("<H", rows.shape[1]) + b"\x86" + dtype + b"\x89"
             + string(rows.tobytes()) + b"tb")
    label_list = b"](" + b"".join(b"K" + bytes([label]) for label in labels) + b"e"
    return (b"\x80\x02}(" + string(b"data") + array + string(b"labels") + label_list
            + b"u.")


def test_cifar10_reads_python2_pickles(tmp_path):
    folder = make_cifar10(tmp_path, per_batch=3, test=2)
    rows = np.random.default_rng(5).integers(0, 256, (2, 3072), dtype=np.uint8)
    (folder / "test_batch").write_bytes(python2_pickle(rows, [7, 2]))
    data = load_cifar10(folder).dataset
    assert data.labels[-2:].tolist() == [7, 2]
    assert np.array_equal(data.x[-2:].numpy(), rows.reshape(2, 3, 32, 32))


def test_cifar100_uses_fine_labels(tmp_path):
    folder = make_cifar100(tmp_path, train=12, test=5, classes=100)
    parts = open_dataset("cifar100", root=str(folder))
    data = parts.dataset
    assert data.name == "cifar100" and data.x.shape == (17, 3, 32, 32)
    train, test = unpickle(folder / "train"), unpickle(folder / "test")
    assert data.labels.tolist() == train[b"fine_labels"] + test[b"fine_labels"]
    assert data.labels.tolist() != train[b"coarse_labels"] + test[b"coarse_labels"]
    assert np.array_equal(data.x[12:].numpy().reshape(5, -1), test[b"data"])
    assert parts.parts["train"].tolist() == list(range(12))
    assert parts.parts["test"].tolist() == list(range(12, 17))


def test_cifar_class_names_come_from_the_metadata_file(tmp_path):
    cifar10 = load_cifar10(make_cifar10(tmp_path / "10", per_batch=2, test=2)).dataset
    assert cifar10.class_names == {0: "airplane", 1: "automobile", 2: "bird", 3: "cat",
                                   4: "deer", 5: "dog", 6: "frog", 7: "horse", 8: "ship",
                                   9: "truck"}
    cifar100 = load_cifar100(make_cifar100(tmp_path / "100", train=4, test=2)).dataset
    assert len(cifar100.class_names) == 100 and cifar100.class_name(37) == "fine_37"


def test_cifar_without_metadata_has_no_names_and_a_broken_one_is_an_error(tmp_path):
    folder = make_cifar10(tmp_path, per_batch=2, test=2)
    (folder / "batches.meta").unlink()
    data = load_cifar10(folder).dataset
    assert data.class_names is None and data.class_name(3) is None
    write_cifar_meta(folder / "batches.meta", {b"label_names": [b"cat", b"dog"]})
    one_line_error(lambda: load_cifar10(folder), "batches.meta",
                   "b'label_names' lists 10 class names")
    (folder / "batches.meta").write_bytes(b"not a pickle")
    one_line_error(lambda: load_cifar10(folder), "batches.meta is not a readable CIFAR pickle")
    # a folder in its place is no absent file: the names had gone without a word
    (folder / "batches.meta").unlink()
    (folder / "batches.meta").mkdir()
    one_line_error(lambda: load_cifar10(folder), "batches.meta is not a file")


def test_cifar_through_the_registry(tmp_path):
    folder = make_cifar10(tmp_path, per_batch=2, test=2)
    parts = open_dataset("cifar10", root=str(folder))
    assert len(parts.dataset) == 12 and parts.dataset.sample_shape == (3, 32, 32)


class Planted:
    """Pickles as a call of ``os.system``: what a malicious "CIFAR" file would hold."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_cifar_refuses_pickles_that_load_other_globals(tmp_path):
    folder = make_cifar10(tmp_path, per_batch=2, test=2)
    marker = tmp_path / "ran"
    with (folder / "data_batch_2").open("wb") as stream:
        pickle.dump({b"data": Planted(f"touch {marker}"), b"labels": [0]}, stream)
    message = one_line_error(lambda: load_cifar10(folder), "data_batch_2", "refused",
                             "system", str(folder))
    assert not marker.exists(), message


def test_cifar_refuses_other_codecs(tmp_path):
    folder = make_cifar10(tmp_path, per_batch=2, test=2)
    import codecs  # pickled as _codecs.encode, the one allowed non-NumPy global

    class Encoded:
        def __reduce__(self):
            return codecs.encode, ("x", "rot13")

    (folder / "test_batch").write_bytes(pickle.dumps({b"data": Encoded()}, protocol=2))
    one_line_error(lambda: load_cifar10(folder), "test_batch", "rot13")


def test_cifar_file_errors(tmp_path):
    folder = make_cifar10(tmp_path, per_batch=4, test=4)
    (folder / "data_batch_3").unlink()
    one_line_error(lambda: load_cifar10(folder), "missing data_batch_3", str(folder),
                   "cifar-10-batches-py")
    (folder / "data_batch_3").write_bytes((folder / "data_batch_4").read_bytes()[:500])
    one_line_error(lambda: load_cifar10(folder), "data_batch_3", "not a readable CIFAR pickle")
    rows = np.zeros((4, 3072), dtype=np.uint8)
    write_cifar_file(folder / "data_batch_3", rows, np.zeros(3), b"labels")
    one_line_error(lambda: load_cifar10(folder), "data_batch_3", "4 images but 3 labels")
    write_cifar_file(folder / "data_batch_3", rows, np.full(4, 10), b"labels")
    one_line_error(lambda: load_cifar10(folder), "data_batch_3", "0..9")
    write_cifar_file(folder / "data_batch_3", rows[:, :3000], np.zeros(4), b"labels")
    one_line_error(lambda: load_cifar10(folder), "data_batch_3", "[n, 3072]")
    # pixels of another type (floats in [0, 1], int64) are not the bytes the batches scale
    write_cifar_file(folder / "data_batch_3", rows.astype(np.float32), np.zeros(4), b"labels")
    one_line_error(lambda: load_cifar10(folder), "data_batch_3", "must be a uint8 array")
    write_cifar_file(folder / "data_batch_3", rows, np.zeros(4), b"fine_labels")
    one_line_error(lambda: load_cifar10(folder), "data_batch_3", "b'labels'")
    # a label 1.7 had been read as class 1 without a word, and 2**70 ended in a traceback
    for labels in ([0.0, 1.7, 2.9, 0.0], [0, 1, 2**70, 0], ["0", "1", "2", "0"]):
        write_cifar_file(folder / "data_batch_3", rows, np.zeros(4), b"labels",
                         extra={b"labels": labels})
        one_line_error(lambda: load_cifar10(folder), "data_batch_3",
                       "b'labels' is not a list of integer labels (0..9)")


def test_cifar100_missing_file(tmp_path):
    folder = make_cifar100(tmp_path, train=4, test=4)
    (folder / "test").unlink()
    one_line_error(lambda: load_cifar100(folder), "cifar100: missing test", "cifar-100-python")


# IDX ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("gzipped", [True, False])
def test_idx_images_labels_and_split(tmp_path, gzipped):
    folder = make_idx(tmp_path, train=30, test=10, gzipped=gzipped)
    parts = load_mnist(folder)
    data = parts.dataset
    assert isinstance(data, ArrayDataset) and data.name == "mnist"
    assert data.x.shape == (40, 1, 28, 28) and data.x.dtype == torch.uint8
    assert data.labels.dtype == torch.int64 and data.default_backbone == "cnn"
    assert parts.parts["train"].tolist() == list(range(30))
    assert parts.parts["test"].tolist() == list(range(30, 40))
    assert parts.eval_ks == DEFAULT_KS

    def raw(name: str) -> bytes:
        path = folder / (name + ".gz" if gzipped else name)
        return gzip.decompress(path.read_bytes()) if gzipped else path.read_bytes()

    pixels = raw("train-images-idx3-ubyte")[16:] + raw("t10k-images-idx3-ubyte")[16:]
    labels = raw("train-labels-idx1-ubyte")[8:] + raw("t10k-labels-idx1-ubyte")[8:]
    assert data.x.numpy().tobytes() == pixels
    assert data.labels.tolist() == list(labels)
    assert torch.bincount(data.labels[:30]).tolist() == [3] * 10
    assert data.x.numpy().flags.writeable


def test_idx_through_the_registry(tmp_path):
    folder = make_idx(tmp_path, train=20, test=10, name="fashion")
    parts = open_dataset("fashion-mnist", root=str(folder))
    assert parts.dataset.name == "fashion-mnist" and len(parts.dataset) == 30
    assert len(load_fashion_mnist(folder).dataset) == 30
    names = parts.dataset.class_names
    assert names[0] == "T-shirt/top" and names[9] == "Ankle boot" and len(names) == 10
    assert open_dataset("mnist", root=str(folder)).dataset.class_names is None  # the digits


def test_mnist_and_fashion_mnist_refuse_labels_beyond_their_ten_classes(tmp_path):
    folder = make_idx(tmp_path, train=24, test=12, classes=12, name="fashion")
    one_line_error(lambda: load_fashion_mnist(folder), "train-labels-idx1-ubyte.gz: label ",
                   "is 11, but labels must lie in 0..9", str(folder))
    # MNIST, which names no classes, checked none: a label of 200 was refused later as
    # "train and test share 10 of the 11 test classes".
    for label in (200, 10):  # 10: the first label beyond the ten classes
        folder = make_idx(tmp_path / str(label), train=20, test=10, gzipped=False)
        labels = folder / "t10k-labels-idx1-ubyte"
        raw = bytearray(labels.read_bytes())
        raw[8 + 3] = label
        labels.write_bytes(bytes(raw))
        one_line_error(lambda folder=folder: load_mnist(folder), "mnist: t10k-labels-idx1-ubyte: "
                       f"label number 4 is {label}, but labels must lie in 0..9; use the "
                       "dataset's own label file")


def test_idx_file_errors(tmp_path):
    folder = make_idx(tmp_path, train=10, test=5, gzipped=False)
    images = folder / "t10k-images-idx3-ubyte"
    labels = folder / "train-labels-idx1-ubyte"
    good_images, good_labels = images.read_bytes(), labels.read_bytes()

    labels.unlink()
    one_line_error(lambda: load_mnist(folder), "missing train-labels-idx1-ubyte", str(folder))
    labels.write_bytes(good_images)  # images where labels belong
    one_line_error(lambda: load_mnist(folder), "train-labels-idx1-ubyte", "0x00000803",
                   "expected 0x00000801")
    labels.write_bytes(idx_bytes(np.zeros(9, dtype=np.uint8)))
    one_line_error(lambda: load_mnist(folder), "10 images", "9 labels",
                   "train-labels-idx1-ubyte")
    labels.write_bytes(good_labels)

    images.write_bytes(good_images[:-7])
    one_line_error(lambda: load_mnist(folder), "t10k-images-idx3-ubyte", "5x28x28",
                   "holds 3913")
    images.write_bytes(good_images + b"\0")
    one_line_error(lambda: load_mnist(folder), "t10k-images-idx3-ubyte", "5x28x28 = 3920",
                   "holds 3921")
    images.write_bytes(good_images[:10])
    one_line_error(lambda: load_mnist(folder), "t10k-images-idx3-ubyte", "too short")
    images.write_bytes(b"\x00\x00\x0d\x03" + good_images[4:])  # float32 images
    one_line_error(lambda: load_mnist(folder), "t10k-images-idx3-ubyte", "0x00000d03")
    images.unlink()
    Path(f"{images}.gz").write_bytes(b"not gzip at all")
    one_line_error(lambda: load_mnist(folder), "t10k-images-idx3-ubyte.gz", "gzip")
    Path(f"{images}.gz").write_bytes(gzip.compress(good_images)[:-30])
    one_line_error(lambda: load_mnist(folder), "t10k-images-idx3-ubyte.gz", "gzip")


def dotted(folder: Path) -> Path:
    """Rename the IDX files as some copies (Kaggle's) do: ``train-images.idx3-ubyte``."""
    for path in folder.iterdir():
        path.rename(path.with_name(path.name.replace("-idx", ".idx")))
    return folder


@pytest.mark.parametrize("gzipped", [True, False])
def test_idx_files_with_a_dot_before_idx_are_found(tmp_path, monkeypatch, gzipped):
    """``train-images.idx3-ubyte`` (``.gz`` or not) is read as ``train-images-idx3-ubyte``,
    by the reader and by the search of ``$KDML_DATA_ROOT`` (its marker file)."""
    folder = dotted(make_idx(tmp_path, train=20, test=10, gzipped=gzipped,
                             name="fashion-mnist"))
    assert (folder / f"t10k-labels.idx1-ubyte{'.gz' if gzipped else ''}").is_file()
    expected = load_fashion_mnist(make_idx(tmp_path / "dashed", train=20, test=10,
                                           name="fashion-mnist")).dataset
    assert torch.equal(load_fashion_mnist(folder).dataset.x, expected.x)
    monkeypatch.setenv("KDML_DATA_ROOT", str(tmp_path))  # before the system's copy
    found = open_dataset("fashion-mnist").dataset
    assert torch.equal(found.x, expected.x) and torch.equal(found.labels, expected.labels)


@pytest.mark.parametrize("gzipped", [True, False])
def test_idx_files_under_both_spellings_must_hold_the_same_data(tmp_path, gzipped):
    """A Kaggle copy (``t10k-labels.idx1-ubyte``) unpacked beside the original files: the
    dashed name was read and the dotted one passed over without a word, whatever it held.
    The same data is read as before; other data is refused, as a ``.gz`` twin's is."""
    folder = make_idx(tmp_path, train=20, test=10, name="fashion-mnist")
    other = make_idx(tmp_path / "other", train=20, test=10, gzipped=gzipped, seed=1)
    same = make_idx(tmp_path / "same", train=20, test=10, gzipped=gzipped,
                    name="fashion-mnist")
    suffix = ".gz" if gzipped else ""
    labels = f"t10k-labels.idx1-ubyte{suffix}"
    (folder / labels).write_bytes((same / f"t10k-labels-idx1-ubyte{suffix}").read_bytes())
    expected = load_fashion_mnist(same).dataset
    assert torch.equal(load_fashion_mnist(folder).dataset.labels, expected.labels)
    (folder / labels).write_bytes((other / f"t10k-labels-idx1-ubyte{suffix}").read_bytes())
    one_line_error(lambda: load_fashion_mnist(folder), "t10k-labels-idx1-ubyte.gz and "
                   f"{labels} both exist but hold different data; remove the one that is not "
                   "wanted")


def test_an_incomplete_copy_under_the_data_root_variable_is_reported_not_passed_over(
        tmp_path, monkeypatch):
    """``$KDML_DATA_ROOT/fashion-mnist`` without its train labels: the reader names what is
    missing there, where the system folder's copy had been read instead, silently."""
    from dataclasses import replace

    from kdml.data import registry

    system = make_idx(tmp_path / "system", train=20, test=10, name="fashion-mnist")
    monkeypatch.setitem(registry.FORMATS, "fashion-mnist",
                        replace(registry.FORMATS["fashion-mnist"], system_root=str(system)))
    monkeypatch.delenv("KDML_DATA_ROOT", raising=False)
    assert len(open_dataset("fashion-mnist").dataset) == 30  # the variable unset: the system's
    mine = make_idx(tmp_path / "mine", train=12, test=6, name="fashion-mnist")
    (mine / "train-labels-idx1-ubyte.gz").unlink()
    monkeypatch.setenv("KDML_DATA_ROOT", str(tmp_path / "mine"))
    one_line_error(lambda: open_dataset("fashion-mnist"),
                   "fashion-mnist: missing train-labels-idx1-ubyte", str(mine))


def test_a_missing_idx_file_names_every_name_searched(tmp_path):
    folder = make_idx(tmp_path, train=10, test=5, gzipped=False)
    (folder / "t10k-labels-idx1-ubyte").unlink()
    one_line_error(lambda: load_mnist(folder), "mnist: missing t10k-labels-idx1-ubyte (searched "
                   "for t10k-labels-idx1-ubyte, t10k-labels-idx1-ubyte.gz, "
                   "t10k-labels.idx1-ubyte, t10k-labels.idx1-ubyte.gz)", str(folder))


def test_real_fashion_mnist(monkeypatch):
    if not FASHION_MNIST.is_dir():
        pytest.skip("real Fashion-MNIST not installed: apt-get install dataset-fashion-mnist")
    monkeypatch.delenv("KDML_DATA_ROOT", raising=False)
    parts = open_dataset("fashion-mnist")
    data = parts.dataset
    assert data.x.shape == (70_000, 1, 28, 28) and data.x.dtype == torch.uint8
    assert len(parts.parts["train"]) == 60_000 and len(parts.parts["test"]) == 10_000
    assert data.num_classes == 10
    assert torch.bincount(data.labels[parts.parts["train"]]).tolist() == [6_000] * 10
    assert torch.bincount(data.labels[parts.parts["test"]]).tolist() == [1_000] * 10
    assert 0 < data.x.float().mean() < 255
    assert [data.class_names[label] for label in range(10)] == list(FASHION_MNIST_CLASSES)


# Folder ---------------------------------------------------------------------------------------


def test_folder_classes_files_and_labels(tmp_path):
    folder = make_image_folder(tmp_path, classes=3, per_class=3, size=20)
    (folder / "c01" / "nested").mkdir()
    (folder / "c01" / "nested" / "deep.PNG").write_bytes((folder / "c01" / "001.png")
                                                         .read_bytes())
    (folder / "c01" / "notes.txt").write_text("not an image")
    (folder / "c01" / "._000.jpg").write_bytes(b"macOS metadata")
    (folder / "top.jpg").write_bytes((folder / "c00" / "000.jpg").read_bytes())
    (folder / ".cache").mkdir()
    (folder / ".cache" / "x.jpg").write_bytes((folder / "c00" / "000.jpg").read_bytes())
    parts = load_folder(folder)
    data = parts.dataset
    assert isinstance(data, ImageFiles) and data.name == "folder:images"
    assert parts.parts == {} and parts.eval_ks == DEFAULT_KS
    relative = [str(Path(path).relative_to(folder)) for path in data.paths]
    assert relative == ["c00/000.jpg", "c00/001.png", "c00/002.JPEG", "c01/000.jpg",
                        "c01/001.png", "c01/002.JPEG", "c01/nested/deep.PNG", "c02/000.jpg",
                        "c02/001.png", "c02/002.JPEG"]
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2]
    assert data.class_names == {0: "c00", 1: "c01", 2: "c02"}
    assert all(Path(path).is_absolute() for path in data.paths)
    batch = data.resized(16).__getitems__([0, 6])
    assert batch.inputs.shape == (2, 3, 16, 16) and not batch.unreadable.any()


def test_folder_says_which_files_it_left_out(tmp_path, caplog):
    """Photos in a format kdml does not read (.heic, .jfif) and images beside the class
    folders had been dropped without a word; hidden files are still passed over quietly."""
    folder = make_image_folder(tmp_path, classes=2, per_class=2)
    (folder / "c00" / "a.HEIC").write_bytes(b"x")
    (folder / "c01" / "b.jfif").write_bytes(b"x")
    (folder / "c01" / "c.jfif").write_bytes(b"x")
    (folder / "c01" / ".DS_Store").write_bytes(b"x")
    (folder / "loose.jpg").write_bytes((folder / "c00" / "000.jpg").read_bytes())
    with caplog.at_level(logging.WARNING, logger="kdml.data"):
        assert len(load_folder(folder).dataset) == 4
    (record,) = caplog.records
    assert record.getMessage() == (
        "folder:images: files left out: 2 .jfif, 1 .heic in the class folders (not among the "
        f"image extensions {' '.join(IMAGE_EXTENSIONS)}); 1 directly in {folder}, in no class "
        "folder")
    caplog.clear()
    (folder / "loose.jpg").unlink()
    for path in (folder / "c00" / "a.HEIC", folder / "c01" / "b.jfif", folder / "c01" / "c.jfif"):
        path.unlink()
    load_folder(folder)
    assert not caplog.records  # nothing left out: nothing said


def test_folder_passes_over_hidden_files_beside_the_class_folders_quietly(tmp_path, caplog):
    """A hidden file named like an image beside the class folders (macOS's ``._cover.jpg``,
    AppleDouble metadata) is ignored as in a class folder: it had been counted as an image
    left out, in a warning, and as the image a folder without classes holds."""
    folder = make_image_folder(tmp_path, classes=2, per_class=2)
    (folder / "._cover.jpg").write_bytes(b"macOS metadata")
    with caplog.at_level(logging.WARNING, logger="kdml.data"):
        assert len(load_folder(folder).dataset) == 4
    assert not caplog.records
    for name in ("c00", "c01"):
        shutil.rmtree(folder / name)
    with pytest.raises(KdmlError, match=r"folder:images: no class sub-folders \("):
        load_folder(folder)


def test_folder_through_the_registry(tmp_path):
    folder = make_image_folder(tmp_path, classes=4, per_class=2)
    parts = open_dataset("folder:" + str(folder))
    assert len(parts.dataset) == 8 and parts.dataset.num_classes == 4


def test_folder_errors(tmp_path):
    missing = tmp_path / "nowhere"
    one_line_error(lambda: load_folder(missing), "folder:nowhere", "no such folder",
                   str(missing))
    flat = tmp_path / "flat"
    flat.mkdir()
    (flat / "a.jpg").write_bytes(b"")
    one_line_error(lambda: load_folder(flat), "no class sub-folders", str(flat))
    # one level too low (the images of one class, or of none): say where they must go
    (flat / "b.PNG").write_bytes(b"")
    (flat / "notes.txt").write_bytes(b"")
    one_line_error(lambda: load_folder(flat), "folder:flat: it holds 2 images but no class "
                   "sub-folders; a class is a sub-folder: give the folder above, whose "
                   "sub-folders are the classes, or move the images into one sub-folder per "
                   "class", str(flat))
    # one level too high (DIR/images/<class>/): it had trained one class and then refused "a
    # class-disjoint split needs at least 2 classes, got 1", naming neither folder
    images = make_image_folder(tmp_path / "photos", classes=3)
    one_line_error(lambda: load_folder(tmp_path / "photos"), "folder:photos: it holds one "
                   "folder, images/, whose 3 sub-folders (c00, c01, c02) look like the classes: "
                   f"give {images} as the folder")
    folder = make_image_folder(tmp_path, classes=2, per_class=1)
    (folder / "c02_empty").mkdir()
    (folder / "c02_empty" / "readme.md").write_text("no images here")
    one_line_error(lambda: load_folder(folder), "c02_empty/", "no images",
                   "; add its images or remove it")


def test_folder_refuses_a_folder_read_twice_through_a_link(tmp_path):
    # A link would list the same images twice: under two classes, or, in a loop, many times.
    folder = make_image_folder(tmp_path, classes=3, per_class=1)
    (folder / "c01" / "more").symlink_to(folder / "c00", target_is_directory=True)
    one_line_error(lambda: load_folder(folder), "c01/more/ and c00/ are the same folder",
                   "remove the link")
    (folder / "c01" / "more").unlink()
    (folder / "c02" / "loop").symlink_to(folder, target_is_directory=True)
    one_line_error(lambda: load_folder(folder), "c02/loop/ and ./ are the same folder")
    (folder / "c02" / "loop").unlink()
    linked = tmp_path / "elsewhere"  # a class folder that is a link is read as usual
    (folder / "c02").rename(linked)
    (folder / "c02").symlink_to(linked, target_is_directory=True)
    assert load_folder(folder).dataset.labels.tolist() == [0, 1, 2]


def test_folder_refuses_an_image_listed_twice_through_a_link(tmp_path):
    """A linked image file is the same image under two names: each copy its twin's perfect
    match, or one image under two labels. Links to images outside DIR (a class folder built
    from links into a shared pool) are read as usual."""
    folder = make_image_folder(tmp_path, classes=3, per_class=2)
    (folder / "c01" / "twin.jpg").symlink_to(folder / "c00" / "000.jpg")
    one_line_error(lambda: load_folder(folder), "c01/twin.jpg and c00/000.jpg are the same "
                   "image through a link", "remove the link")
    (folder / "c01" / "twin.jpg").unlink()
    (folder / "c00" / "again.jpg").symlink_to("000.jpg")  # the same class, a relative link
    one_line_error(lambda: load_folder(folder), "c00/again.jpg and c00/000.jpg are the same")
    (folder / "c00" / "again.jpg").unlink()
    pool = tmp_path / "pool"
    pool.mkdir()
    (folder / "c01" / "loop").symlink_to("loop")  # a link to itself: ignored, as os.walk did
    (folder / "c01" / "self.jpg").symlink_to("self.jpg")  # an image that leads nowhere
    one_line_error(lambda: load_folder(folder), "missing image " + str(folder / "c01" / "self.jpg"),
                   "a link to self.jpg that leads to no file", "(1 of 7 listed")
    (folder / "c01" / "self.jpg").unlink()
    assert len(load_folder(folder).dataset) == 6
    (folder / "c02" / "001.png").rename(pool / "a.png")
    (folder / "c02" / "001.png").symlink_to(pool / "a.png")
    data = load_folder(folder).dataset
    assert data.labels.tolist() == [0, 0, 1, 1, 2, 2]
    assert [Path(path).name for path in data.paths][-2:] == ["000.jpg", "001.png"]

def test_folder_refuses_a_link_to_no_image_before_training(tmp_path):
    """It was listed, and training stopped on it only when its first batch was decoded."""
    folder = make_image_folder(tmp_path, classes=3, per_class=2)
    (folder / "c02" / "gone.jpg").symlink_to(tmp_path / "nothere.jpg")
    one_line_error(lambda: load_folder(folder), "folder:images", str(folder),
                   f"missing image {folder / 'c02' / 'gone.jpg'}, a link to "
                   f"{tmp_path / 'nothere.jpg'} that leads to no file", "(1 of 7 listed")


def test_folder_and_csv_without_a_path(tmp_path, monkeypatch):
    # Path("") is the current folder: "folder:" must not read it.
    make_image_folder(tmp_path)
    monkeypatch.chdir(tmp_path / "images")
    one_line_error(lambda: open_dataset("folder:"), "folder: needs a path", "folder:DIR")
    one_line_error(lambda: open_dataset("csv: "), "csv: needs a path", "csv:FILE")


# CSV ------------------------------------------------------------------------------------------


def test_csv_train_test(tmp_path):
    csv_file = make_csv_list(tmp_path, classes=4, per_class=3)
    parts = load_csv(csv_file)
    data = parts.dataset
    assert isinstance(data, ImageFiles) and data.name == "csv:list.csv"
    assert data.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert data.class_names == {label: f"label_{label:02d}" for label in range(4)}
    assert parts.parts["train"].tolist() == list(range(6))
    assert parts.parts["test"].tolist() == list(range(6, 12))
    assert set(parts.parts) == {"train", "test"} and parts.eval_ks == DEFAULT_KS
    assert data.paths[4] == str(tmp_path.resolve() / "photos" / "c01" / "001.png")
    assert not data.__getitems__([0, 11]).unreadable.any()


def test_csv_query_gallery(tmp_path):
    csv_file = make_csv_list(tmp_path, classes=4, per_class=3, query_gallery=True)
    parts = open_dataset("csv:" + str(csv_file))
    assert set(parts.parts) == {"train", "query", "gallery"}
    assert parts.parts["train"].tolist() == list(range(6))
    # Test rows 6..11 are c02/000-002 and c03/000-002: 000 and 002 query, 001 gallery.
    assert parts.parts["query"].tolist() == [6, 8, 9, 11]
    assert parts.parts["gallery"].tolist() == [7, 10]


def write_csv(tmp_path: Path, text: str | bytes) -> Path:
    """``text`` as ``tmp_path/list.csv`` beside the images of :func:`make_csv_list`."""
    make_csv_list(tmp_path, classes=2, per_class=2)
    csv_file = tmp_path / "list.csv"
    data = text if isinstance(text, bytes) else text.encode("utf-8")
    csv_file.write_bytes(data)
    return csv_file


def test_csv_labels_absolute_paths_and_leniency(tmp_path):
    absolute = tmp_path.resolve() / "photos" / "c01" / "000.jpg"
    csv_file = write_csv(tmp_path, "\ufeffSplit, Path ,LABEL,notes\n"
                                   "train,photos/c00/000.jpg,10,x\n"
                                   "\n"
                                   " Test ,photos/c00/001.png, 9,y\n"
                                   f"train,{absolute},100,z\n")
    parts = load_csv(csv_file)
    assert parts.dataset.labels.tolist() == [1, 0, 2]  # 9 < 10 < 100, not "10" < "100" < "9"
    assert parts.dataset.class_names == {0: "9", 1: "10", 2: "100"}
    assert parts.dataset.paths[2] == str(absolute)
    assert parts.parts["test"].tolist() == [1]


@pytest.mark.parametrize(("text", "fragments"), [
    ("", ["the file is empty"]),
    ("path,label,split\n", ["no images"]),
    ("path,label\nphotos/c00/000.jpg,a\n", ["line 1", "'split' column"]),
    ("path,label,split\nphotos/c00/000.jpg,a,train\nphotos/c00/001.png,a,val\n",
     ["line 3", "train or test", "'val'"]),
    ("path,label,split\nphotos/c00/000.jpg,a,train,extra\n", ["line 2", "got 4"]),
    ("path,label,split\nphotos/c00/000.jpg,,train\n", ["line 2", "empty label"]),
    ("path,label,split,is_query,is_gallery\nphotos/c00/000.jpg,a,test,yes,0\n",
     ["line 2", "is_query", "'yes'"]),
    ("path,label,split,is_query\nphotos/c00/000.jpg,a,test,1\n", ["line 1", "is_gallery"]),
    # which of two label columns was meant is not for kdml to guess (the first had been read)
    ("path,label,split,Label\nphotos/c00/000.jpg,a,train,b\n",
     ["line 1", "names the 'label' column 2 times (label, Label", "keep one"]),
    ("path,label,split\nphotos/c00/000.jpg,a,train\nphotos/c00/gone.jpg,a,test\n",
     ["line 3", "missing image", "gone.jpg", "1 of 2"]),
    # a folder is there: "missing image" had sent the user looking for it
    ("path,label,split\nphotos/c00/000.jpg,a,train\nphotos/c01,b,test\n",
     ["line 3", "photos/c01 is a folder, not an image file", "list its images one per line",
      "1 of 2 listed images are not files"]),
    ('path,label,split\n"photos/c00/000.jpg,a,train\n', ["line 2", "malformed CSV"]),
    (b"path,label,split\nphotos/c00/\xe9.jpg,a,train\n", ["not UTF-8"]),
    # An image listed twice would be its twin's perfect match, or have two labels.
    ("path,label,split\nphotos/c00/000.jpg,a,train\nphotos/c00/001.png,a,test\n"
     "./photos/c00/000.jpg,a,test\n",
     ["lines 2 and 4", "image ./photos/c00/000.jpg twice", "list each image once"]),
    ("path,label,split\nphotos/c00/000.jpg,a,train\n\nphotos/c00/000.jpg,b,train\n",
     ["lines 2 and 4", "with labels 'a' and 'b'", "under its one label"]),
    ("path,label,split,is_query,is_gallery\nphotos/c00/000.jpg,a,test,1,0\n"
     "photos/c00/000.jpg,a,test,0,1\n", ["lines 2 and 3", "the image photos/c00/000.jpg twice"]),
    # A test row in neither part was left out without a word.
    ("path,label,split,is_query,is_gallery\nphotos/c00/000.jpg,a,train,0,0\n"
     "photos/c00/001.png,a,test,1,0\nphotos/c01/000.jpg,b,test,0,0\n",
     ["line 4", "photos/c01/000.jpg has is_query=0 and is_gallery=0", "left out of the test",
      "mark it a query (is_query=1), a gallery image (is_gallery=1) or a train row"]),
    ("path,label,split,is_query,is_gallery\nphotos/c00/000.jpg,a,test,1,0\n"
     "photos/c01/000.jpg,b,test, , false\n", ["line 3", "is_query=0 and is_gallery=0"]),
    # A query that is also a gallery image would find itself: a perfect Recall@1.
    ("path,label,split,is_query,is_gallery\nphotos/c00/000.jpg,a,train,1,1\n"
     "photos/c00/001.png,a,test,1,1\n", ["line 3", "is_query=1 and is_gallery=1",
                                         "find itself", "drop both columns"]),
])
def test_csv_errors(tmp_path, text, fragments):
    csv_file = write_csv(tmp_path, text)
    one_line_error(lambda: load_csv(csv_file), "csv:list.csv", str(csv_file), *fragments)


def test_csv_does_not_read_a_train_rows_flags(tmp_path):
    """As the module says, a train row's is_query and is_gallery are ignored: a value there
    that is not a flag had refused the whole list."""
    csv_file = write_csv(tmp_path, "path,label,split,is_query,is_gallery\n"
                                   "photos/c00/000.jpg,a,train,n/a,-\n"
                                   "photos/c00/001.png,a,test,1,0\n"
                                   "photos/c01/000.jpg,b,test,0,1\n")
    parts = load_csv(csv_file).parts
    assert {name: part.tolist() for name, part in parts.items()} == {
        "train": [0], "query": [1], "gallery": [2]}


def test_csv_refuses_an_image_listed_twice_through_a_link(tmp_path):
    """Two names of one file (a link) are one image listed twice, as folder:DIR refuses."""
    csv_file = write_csv(tmp_path, "path,label,split\nphotos/c00/000.jpg,a,train\n"
                                   "photos/c01/000.jpg,b,test\nphotos/c01/twin.jpg,b,test\n")
    (tmp_path / "photos" / "c01" / "twin.jpg").symlink_to("000.jpg")
    one_line_error(lambda: load_csv(csv_file), "csv:list.csv", "lines 3 and 4 list "
                   "photos/c01/000.jpg and photos/c01/twin.jpg, one image through a link, twice",
                   "list each image once")
    (tmp_path / "photos" / "c01" / "twin.jpg").unlink()
    (tmp_path / "photos" / "c01" / "twin.jpg").symlink_to(tmp_path / "photos" / "c00" / "000.jpg")
    one_line_error(lambda: load_csv(csv_file), "lines 2 and 4", "with labels 'a' and 'b'")


def test_csv_refuses_a_link_to_no_image(tmp_path):
    csv_file = write_csv(tmp_path, "path,label,split\nphotos/c00/000.jpg,a,train\n"
                                   "photos/c01/gone.jpg,b,test\n")
    (tmp_path / "photos" / "c01" / "gone.jpg").symlink_to("nothere.jpg")
    one_line_error(lambda: load_csv(csv_file), "csv:list.csv", "line 3: missing image",
                   "gone.jpg, a link to nothere.jpg that leads to no file", "(1 of 2 listed")


def test_csv_labels_differ_by_case_and_other_values_do_not(tmp_path):
    """As the module says: column names, splits and flags in any case; labels as written."""
    csv_file = write_csv(tmp_path, "PATH,Label,Split,Is_Query,IS_GALLERY\n"
                                   "photos/c00/000.jpg,Cat,TRAIN,,\n"
                                   "photos/c00/001.png,cat,Train,,\n"
                                   "photos/c01/000.jpg,dog,Test,TRUE,False\n"
                                   "photos/c01/001.png,dog,test,0,True\n")
    parts = load_csv(csv_file)
    assert parts.dataset.class_names == {0: "Cat", 1: "cat", 2: "dog"}
    assert parts.dataset.labels.tolist() == [0, 1, 2, 2]
    assert [parts.parts[part].tolist() for part in ("train", "query", "gallery")] == [
        [0, 1], [2], [3]]


def test_csv_integer_labels_are_written_with_digits_alone(tmp_path):
    """int() reads 1_0 as 10 and +1 as 1: those labels had merged with 10 and 1 into one
    class each. A leading zero is still the same number (07 is 7), as the docstring says."""
    csv_file = write_csv(tmp_path, "path,label,split\n"
                                   "photos/c00/000.jpg,1_0,train\n"
                                   "photos/c00/001.png,10,train\n"
                                   "photos/c01/000.jpg,+1,test\n"
                                   "photos/c01/001.png,1,test\n")
    assert load_csv(csv_file).dataset.labels.tolist() == [3, 2, 0, 1]  # four text labels
    csv_file.write_text("path,label,split\nphotos/c00/000.jpg,07,train\n"
                        "photos/c00/001.png,7,train\nphotos/c01/000.jpg,10,test\n")
    parts = load_csv(csv_file)
    assert parts.dataset.labels.tolist() == [0, 0, 1]
    assert parts.dataset.class_names == {0: "07", 1: "10"}


def test_csv_missing_file(tmp_path):
    one_line_error(lambda: open_dataset("csv:" + str(tmp_path / "none.csv")), "csv:none.csv",
                   "no such file")


def test_folder_names_a_sub_folder_it_cannot_read(tmp_path, monkeypatch):
    """os.walk skipped an unreadable folder and its images without a word."""
    from kdml.data.formats import folder as folder_format

    folder = make_image_folder(tmp_path, classes=2, per_class=1)
    (folder / "c01" / "private").mkdir()
    scandir = os.scandir

    def locked(path):
        if str(path).endswith("private"):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(folder_format.os, "scandir", locked)
    one_line_error(lambda: load_folder(folder), "c01/private/ cannot be read (Permission denied)",
                   "make it readable")


def test_a_csv_query_gallery_split_without_queries_names_the_query_part(tmp_path):
    """Its test rows are all gallery rows: the message speaks of the query part, as the flags
    do, not of a "test part" the file does not have."""
    from kdml.data.splits import make_splits

    csv_file = write_csv(tmp_path, "path,label,split,is_query,is_gallery\n"
                                   "photos/c00/000.jpg,a,train,0,0\n"
                                   "photos/c01/000.jpg,b,test,0,1\n")
    parts = load_csv(csv_file)
    with pytest.raises(KdmlError, match=r"the standard split leaves the query part empty;"):
        make_splits(parts.dataset, parts.parts, "standard")


@pytest.mark.parametrize("split", ["standard", "seen-holdout"])
def test_a_split_that_leaves_a_part_empty_says_what_to_change(tmp_path, split):
    """A CSV of training rows only (the standard split), or one image a class (the
    seen-holdout split): the one-line error names the part and what fills it."""
    from kdml.data.splits import make_splits

    csv_file = write_csv(tmp_path, "path,label,split\n"
                                   "photos/c00/000.jpg,a,train\n"
                                   "photos/c01/000.jpg,b,train\n")
    parts = load_csv(csv_file)
    remedy = {"standard": "mark some of the dataset's images test in its own split, or choose "
                          "data.split=class-disjoint or seen-holdout",
              "seen-holdout": "give each class at least two images, or choose "
                              "data.split=class-disjoint"}[split]
    with pytest.raises(KdmlError) as error:
        make_splits(parts.dataset, parts.parts, split)
    assert str(error.value) == f"csv:{csv_file.name}: the {split} split leaves the test part " \
                               f"empty; {remedy}"


def test_idx_reads_a_decompressed_file_whose_gz_agrees(tmp_path):
    """torchvision leaves each download's ``.gz`` beside the file it extracts: such a folder is
    read (the decompressed files), whereas a ``.gz`` with other bytes is refused, naming both."""
    folder = make_idx(tmp_path, train=20, test=10, gzipped=False)
    expected = load_mnist(folder).dataset
    for path in list(folder.iterdir()):  # torchvision's raw/ folder: both of each
        Path(f"{path}.gz").write_bytes(gzip.compress(path.read_bytes(), mtime=0))
    both = load_mnist(folder).dataset
    assert torch.equal(both.x, expected.x) and torch.equal(both.labels, expected.labels)

    labels = folder / "t10k-labels-idx1-ubyte"
    good = labels.read_bytes()
    changed = good[:-1] + bytes([(good[-1] + 1) % 10])  # same size, another last label
    for gz_content in (gzip.compress(changed), gzip.compress(good + b"\0"), b"gz"):
        Path(f"{labels}.gz").write_bytes(gz_content)
        one_line_error(lambda: load_mnist(folder), "mnist: t10k-labels-idx1-ubyte and "
                       "t10k-labels-idx1-ubyte.gz both exist but hold different data; remove "
                       "the one that is not wanted", str(folder))
    Path(f"{labels}.gz").write_bytes(gzip.compress(good))  # another mtime: the data agree
    assert torch.equal(load_mnist(folder).dataset.labels, expected.labels)
    Path(f"{labels}.gz").write_bytes(gzip.compress(changed))  # and with a dot before idx
    dotted(folder)
    one_line_error(lambda: load_mnist(folder), "t10k-labels.idx1-ubyte and "
                   "t10k-labels.idx1-ubyte.gz both exist but hold different data")


def test_csv_negative_integer_labels_sort_as_numbers(tmp_path):
    """-1 is an integer label too: the labels sort in numeric order, -10 < -1 < 2 < 10, not as
    text ("-1" < "-10" < "10" < "2")."""
    csv_file = write_csv(tmp_path, "path,label,split\n"
                                   "photos/c00/000.jpg,-1,train\n"
                                   "photos/c00/001.png,10,train\n"
                                   "photos/c01/000.jpg,-10,test\n"
                                   "photos/c01/001.png,2,test\n")
    parts = load_csv(csv_file)
    assert parts.dataset.labels.tolist() == [1, 3, 0, 2]
    assert parts.dataset.class_names == {0: "-10", 1: "-1", 2: "2", 3: "10"}


def test_folder_reads_a_class_s_sub_folders_in_sorted_order(tmp_path):
    """As os.walk (the docstring's order): a folder's own images, then its sub-folders one by
    one in sorted order, each with all its own sub-folders."""
    folder = make_image_folder(tmp_path, classes=2, per_class=1, size=20)
    image = (folder / "c00" / "000.jpg").read_bytes()
    for relative in ("c00/a/1.jpg", "c00/a/z/2.jpg", "c00/b/3.jpg", "c00/c/4.jpg"):
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(image)
    paths = load_folder(folder).dataset.paths
    assert [str(Path(path).relative_to(folder)) for path in paths] == [
        "c00/000.jpg", "c00/a/1.jpg", "c00/a/z/2.jpg", "c00/b/3.jpg", "c00/c/4.jpg",
        "c01/000.jpg"]


def test_folder_one_level_too_high_with_two_classes(tmp_path):
    """Two classes are enough to show the folder is one level too high (DIR/images/c00, c01):
    it is refused, not read as one class."""
    images = make_image_folder(tmp_path / "photos", classes=2, per_class=1)
    one_line_error(lambda: load_folder(tmp_path / "photos"), "folder:photos: it holds one "
                   "folder, images/, whose 2 sub-folders (c00, c01) look like the classes: "
                   f"give {images} as the folder")


def test_folder_refuses_a_link_to_an_image_of_a_linked_class_folder(tmp_path):
    """A class folder that is a link holds its images under their real paths: a link in
    another class to one of them is the same image twice."""
    folder = make_image_folder(tmp_path, classes=3, per_class=2)
    linked = tmp_path / "elsewhere"
    (folder / "c01").rename(linked)
    (folder / "c01").symlink_to(linked, target_is_directory=True)
    (folder / "c00" / "twin.jpg").symlink_to(linked / "000.jpg")
    one_line_error(lambda: load_folder(folder), "c01/000.jpg and c00/twin.jpg are the same "
                   "image through a link", "remove the link")


def test_csv_skips_rows_of_spaces(tmp_path):
    """A row whose fields are all blank (spaces a spreadsheet left) is skipped, as an empty
    line is, not read as an image with an empty path."""
    csv_file = write_csv(tmp_path, "path,label,split\n"
                                   "photos/c00/000.jpg,a,train\n"
                                   " , , \n"
                                   "photos/c01/000.jpg,b,test\n")
    assert load_csv(csv_file).dataset.labels.tolist() == [0, 1]


def test_cifar_refuses_a_negative_label(tmp_path):
    """A label -1 (an 'unlabelled' marker some tools write) is no CIFAR-10 class."""
    folder = make_cifar10(tmp_path, per_batch=4, test=4)
    rows = np.zeros((4, 3072), dtype=np.uint8)
    write_cifar_file(folder / "data_batch_3", rows, np.array([0, -1, 2, 3]), b"labels")
    one_line_error(lambda: load_cifar10(folder), "data_batch_3",
                   "labels must lie in 0..9, got -1..3")


def test_cifar_refuses_labels_that_are_not_a_flat_list(tmp_path):
    """Labels as a column ([[0], [1], ...], the right count) are not a list of labels."""
    folder = make_cifar10(tmp_path, per_batch=4, test=4)
    rows = np.zeros((4, 3072), dtype=np.uint8)
    write_cifar_file(folder / "data_batch_3", rows, np.zeros(4), b"labels",
                     extra={b"labels": [[0], [1], [2], [3]]})
    one_line_error(lambda: load_cifar10(folder), "data_batch_3 holds 4 images but labels of "
                   "shape (4, 1), not a list of 4")


def test_idx_train_and_t10k_images_of_other_sizes(tmp_path):
    """t10k images of another size (another dataset's file) are named, not a raw NumPy
    error from joining the two parts."""
    folder = make_idx(tmp_path, train=20, test=10, gzipped=False)
    (folder / "t10k-images-idx3-ubyte").write_bytes(idx_bytes(np.zeros((10, 20, 20),
                                                                       dtype=np.uint8)))
    one_line_error(lambda: load_mnist(folder), "train images are (28, 28) but t10k images are "
                   "(20, 20)")


def test_fashion_mnist_class_names_are_the_dataset_s_own(tmp_path):
    """Written out, not compared with FASHION_MNIST_CLASSES itself: the README's order
    (github.com/zalandoresearch/fashion-mnist), label 1 Trouser, label 2 Pullover."""
    folder = make_idx(tmp_path, train=20, test=10, name="fashion")
    assert load_fashion_mnist(folder).dataset.class_names == {
        0: "T-shirt/top", 1: "Trouser", 2: "Pullover", 3: "Dress", 4: "Coat", 5: "Sandal",
        6: "Shirt", 7: "Sneaker", 8: "Bag", 9: "Ankle boot"}


def test_folder_does_not_count_a_class_s_sub_folders_as_left_out(tmp_path, caplog):
    """A sub-folder of a class is read, not also reported as a file left out."""
    folder = make_image_folder(tmp_path, classes=2, per_class=2)
    (folder / "c01" / "nested").mkdir()
    (folder / "c01" / "nested" / "deep.png").write_bytes((folder / "c01" / "001.png")
                                                         .read_bytes())
    with caplog.at_level(logging.WARNING, logger="kdml.data"):
        assert len(load_folder(folder).dataset) == 5
    assert not caplog.records


def test_cifar_class_names_pickled_as_text(tmp_path):
    """A batches.meta pickled by Python 3 (a copy saved again) holds its names as str, not
    bytes: they are read as they are."""
    folder = make_cifar10(tmp_path, per_batch=2, test=2)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
             "truck"]
    write_cifar_meta(folder / "batches.meta", {b"label_names": names})
    assert load_cifar10(folder).dataset.class_names == dict(enumerate(names))


def csv_rows(*rows: str) -> str:
    return "path,label,split\n" + "".join(f"{row}\n" for row in rows)


def test_csv_finds_one_image_under_two_names_through_a_linked_folder(tmp_path):
    """A folder reached through a link (and a file link made through it) names the images of
    its target: one image listed under both names is refused, as a linked file is."""
    csv_file = write_csv(tmp_path, csv_rows("photos/c00/000.jpg,a,train",
                                            "photos/c01/000.jpg,b,test",
                                            "photos/alias/000.jpg,a,test"))
    (tmp_path / "photos" / "alias").symlink_to("c00", target_is_directory=True)
    one_line_error(lambda: load_csv(csv_file), "lines 2 and 4 list photos/c00/000.jpg and "
                   "photos/alias/000.jpg, one image through a link, twice")
    (tmp_path / "photos" / "c01" / "twin.jpg").symlink_to("../alias/000.jpg")  # link to a link
    csv_file.write_text(csv_rows("photos/c01/000.jpg,b,test", "photos/c00/000.jpg,a,train",
                                 "photos/c01/twin.jpg,b,test"))
    one_line_error(lambda: load_csv(csv_file), "lines 3 and 4 list photos/c00/000.jpg and "
                   "photos/c01/twin.jpg, one image through a link,", "with labels 'a' and 'b'")
    csv_file.write_text(csv_rows("photos/alias/000.jpg,a,train", "photos/c01/000.jpg,b,test",
                                 "photos/alias/001.png,a,train"))
    assert [Path(path).relative_to(tmp_path).as_posix() for path in
            load_csv(csv_file).dataset.paths] == [  # read under the names the rows give
        "photos/alias/000.jpg", "photos/c01/000.jpg", "photos/alias/001.png"]


def test_csv_rows_with_dot_dot_name_the_file_the_system_opens(tmp_path):
    """``..`` in a row is read as the system reads it, after the link before it: through a
    linked folder it leaves the link's target, not the folder the link is in. A hard link,
    like a copy, is a second image (as for folder:DIR)."""
    csv_file = write_csv(tmp_path, csv_rows("photos/c01/../c00/000.jpg,a,train",
                                            "photos/c01/000.jpg,b,test",
                                            "photos/c00/000.jpg,a,train"))
    one_line_error(lambda: load_csv(csv_file), "lines 2 and 4 list the image "
                   "photos/c00/000.jpg twice")
    pool = tmp_path / "pool" / "deep"
    for folder in ("c00", "c01"):
        (pool / folder).mkdir(parents=True)
    (pool / "c01" / "000.jpg").write_bytes((tmp_path / "photos" / "c00" / "000.jpg").read_bytes())
    (tmp_path / "photos" / "alias").symlink_to(pool / "c00", target_is_directory=True)
    # photos/alias/.. is pool/deep, so the row names pool/deep/c01/000.jpg ...
    csv_file.write_text(csv_rows("photos/alias/../c01/000.jpg,a,train", "photos/c01/000.jpg,b,test",
                                 "pool/deep/c01/000.jpg,a,test"))
    one_line_error(lambda: load_csv(csv_file), "lines 2 and 4 list photos/alias/../c01/000.jpg "
                   "and pool/deep/c01/000.jpg, one image through a link, twice")
    # ... not photos/c01/000.jpg, which its spelling suggests
    csv_file.write_text(csv_rows("photos/alias/../c01/000.jpg,a,train", "photos/c01/000.jpg,b,test",
                                 "photos/c01/001.png,b,test"))
    parts = load_csv(csv_file)
    assert len(parts.dataset) == 3 and parts.dataset.load(0).shape == (3, 256, 256)
    (tmp_path / "photos" / "c01" / "hard.jpg").hardlink_to(tmp_path / "photos" / "c01" / "000.jpg")
    csv_file.write_text(csv_rows("photos/c00/000.jpg,a,train", "photos/c01/000.jpg,b,test",
                                 "photos/c01/hard.jpg,b,test"))
    assert len(load_csv(csv_file).dataset) == 3
    # a missing image listed twice (through ..) is said to be listed twice, before it is missing
    csv_file.write_text(csv_rows("photos/c00/000.jpg,a,train", "photos/c09/../c09/x.jpg,b,test",
                                 "photos/c09/x.jpg,b,test"))
    one_line_error(lambda: load_csv(csv_file), "lines 3 and 4 list the image photos/c09/x.jpg "
                   "twice")


def test_real_path_is_realpath_at_one_call_per_folder(tmp_path):
    """The CSV reader's per-folder real paths are os.path.realpath's, file by file: plain
    files, links to files and folders (relative, absolute, chained, dangling, in a loop),
    ``..`` after a link, missing files and folders, a folder named like an image."""
    photos = tmp_path / "photos"
    (photos / "a").mkdir(parents=True)
    (photos / "a" / "x.jpg").write_bytes(b"x")
    (photos / "a" / "dir.jpg").mkdir()
    (photos / "a" / "link.jpg").symlink_to("x.jpg")
    (photos / "a" / "chain.jpg").symlink_to("link.jpg")
    (photos / "a" / "gone.jpg").symlink_to("nothere.jpg")
    (photos / "a" / "self.jpg").symlink_to("self.jpg")
    (photos / "b").symlink_to("a", target_is_directory=True)
    (photos / "c").symlink_to(photos / "b", target_is_directory=True)
    (photos / "loop").symlink_to("loop")
    (tmp_path / "pool" / "deep" / "d").mkdir(parents=True)
    (tmp_path / "pool" / "deep" / "e.jpg").write_bytes(b"e")
    (photos / "d").symlink_to(tmp_path / "pool" / "deep" / "d", target_is_directory=True)
    names = ("x.jpg", "dir.jpg", "link.jpg", "chain.jpg", "gone.jpg", "self.jpg", "none.jpg",
             "..", ".")
    paths = [str(photos / folder / name) for folder in ("a", "b", "c", "d", "loop", "none")
             for name in names]
    paths += [str(photos / "d" / ".." / "e.jpg"), str(photos / "c" / ".." / "a" / "x.jpg"),
              str(photos / "none" / ".." / "a" / "link.jpg")]
    folders: dict[str, tuple[str, frozenset[str]]] = {}
    assert [real_path(path, folders) for path in paths] == [os.path.realpath(path)
                                                            for path in paths]
    # one realpath and one listing per folder (a path ending in .. takes realpath itself)
    assert set(folders) == {os.path.dirname(path) for path in paths
                            if os.path.basename(path) != ".."}


def test_folder_sorts_classes_by_their_composed_names_and_names_each_its_own(tmp_path):
    """A class folder named on macOS (HFS+: "café" stored decomposed, e + U+0301) sorts as the
    composed name, after "cafz", as on any other copy; each label keeps its own folder's name."""
    for name in ("cafe\u0301", "cafz"):
        (tmp_path / name).mkdir()
        Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(tmp_path / name / "a.png")
    dataset = load_folder(tmp_path).dataset
    assert [Path(path).parent.name for path in dataset.paths] == ["cafz", "cafe\u0301"]
    assert dataset.labels.tolist() == [0, 1]
    assert dataset.class_names == {0: "cafz", 1: "cafe\u0301"}


def test_folder_sorts_a_class_s_images_by_their_composed_names(tmp_path):
    """A class's images (and its sub-folders) sort as their composed names too, as its classes
    do: "cafe\u0301.png" (é stored decomposed, as on macOS) after "cafz.png", so a copy made
    on a Mac lists the images in the order of any other copy."""
    (tmp_path / "c0" / "sub").mkdir(parents=True)
    (tmp_path / "c1").mkdir()
    pixels = Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8))
    for name in ("cafe\u0301.png", "cafz.png", "sub/x.png"):
        pixels.save(tmp_path / "c0" / name)
    pixels.save(tmp_path / "c1" / "a.png")
    paths = load_folder(tmp_path).dataset.paths
    assert [str(Path(path).relative_to(tmp_path)) for path in paths] == [
        "c0/cafz.png", "c0/cafe\u0301.png", "c0/sub/x.png", "c1/a.png"]


def test_folder_reads_a_class_named_train_beside_other_classes(tmp_path):
    """A class folder named "train" beside classes of other names is a class like them, even
    when it holds sub-folders: only sub-folders that all name split parts (train/, test/)
    look like a split."""
    (tmp_path / "train" / "nested").mkdir(parents=True)
    (tmp_path / "zebra").mkdir()
    pixels = Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8))
    pixels.save(tmp_path / "train" / "nested" / "a.png")
    pixels.save(tmp_path / "zebra" / "b.png")
    dataset = load_folder(tmp_path).dataset
    assert dataset.labels.tolist() == [0, 1]
    assert dataset.class_names == {0: "train", 1: "zebra"}


def test_folder_says_when_the_only_files_left_out_are_images_beside_the_classes(tmp_path,
                                                                                caplog):
    folder = make_image_folder(tmp_path, classes=2, per_class=2)
    (folder / "loose.jpg").write_bytes((folder / "c00" / "000.jpg").read_bytes())
    with caplog.at_level(logging.WARNING, logger="kdml.data"):
        assert len(load_folder(folder).dataset) == 4
    (record,) = caplog.records
    assert record.getMessage() == (f"folder:images: images left out: 1 directly in {folder}, "
                                   "in no class folder")


def test_csv_one_number_written_two_ways_is_named_as_its_first_row_writes_it(tmp_path):
    """`07` and `7` are one class, named (captions, ``class_name``) by the spelling of its
    first row in the file, whichever that is, as docs/datasets.md says; the docs had said
    only that `07` is `7`, not which of the two a caption shows."""
    csv_file = write_csv(tmp_path, "path,label,split\nphotos/c00/000.jpg,7,train\n"
                                   "photos/c00/001.png,07,test\nphotos/c01/000.jpg,10,test\n")
    assert load_csv(csv_file).dataset.class_names == {0: "7", 1: "10"}
    docs = " ".join((Path(__file__).parent.parent / "docs" / "datasets.md").read_text(
        encoding="utf-8").split())
    assert ("`07` is `7` and `1.0`, as pandas writes one, is `1`, one class, named as its first "
            "row in the file spells it") in docs


def test_idx_file_saved_decompressed_under_its_gz_name_is_named_so(tmp_path):
    """A browser (Safari) decompresses a ``.gz`` download and keeps the name: the bytes are a
    good IDX file, so "not a readable gzip file" would send the user to download it again."""
    folder = make_idx(tmp_path, train=20, test=10, gzipped=True)
    labels = folder / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(gzip.decompress(labels.read_bytes()))
    one_line_error(lambda: load_mnist(folder), "mnist: t10k-labels-idx1-ubyte.gz is not "
                   "gzip-compressed but an IDX file already decompressed; rename it "
                   "t10k-labels-idx1-ubyte", str(folder))


def test_idx_file_gzipped_under_the_decompressed_name_is_named_so(tmp_path):
    """A ``.gz`` whose name lost its suffix: its gzip magic, read as an IDX magic number
    (0x1f8b0800), would say nothing of what to do."""
    folder = make_idx(tmp_path, train=20, test=10, gzipped=True)
    images = folder / "train-images-idx3-ubyte.gz"
    images.rename(folder / "train-images-idx3-ubyte")
    message = one_line_error(lambda: load_mnist(folder), "mnist: train-images-idx3-ubyte is "
                             "gzip-compressed, but its name does not end in .gz; rename it "
                             "train-images-idx3-ubyte.gz", str(folder))
    assert "magic" not in message


def test_a_damaged_idx_gz_says_to_download_it_again(tmp_path):
    """A truncated download is named, with what to do about it."""
    folder = make_idx(tmp_path, train=20, test=10, gzipped=True)
    images = folder / "train-images-idx3-ubyte.gz"
    images.write_bytes(images.read_bytes()[:-30])
    one_line_error(lambda: load_mnist(folder), "mnist: train-images-idx3-ubyte.gz is not a "
                   "readable gzip file: ", "is damaged or incomplete: download it again")


def test_idx_images_and_labels_files_swapped_are_named_so(tmp_path):
    """A magic number of the other kind of IDX file says what the file holds and what to do,
    not only the two numbers."""
    folder = make_idx(tmp_path, train=20, test=10, gzipped=False)
    images, labels = folder / "train-images-idx3-ubyte", folder / "train-labels-idx1-ubyte"
    images_bytes = images.read_bytes()
    images.write_bytes(labels.read_bytes())
    labels.write_bytes(images_bytes)
    one_line_error(lambda: load_mnist(folder), "mnist: train-images-idx3-ubyte has magic number "
                   "0x00000801, expected 0x00000803 (uint8 images, 3 dimensions): it holds "
                   "uint8 labels, 1 dimension; give each file its own name")
