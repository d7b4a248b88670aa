"""Builders of tiny datasets in the real on-disk formats, for tests (plain functions).

Each builder writes under ``root`` (e.g. pytest's ``tmp_path``), returns the folder or file to
pass to the reader (``open_dataset(name, root=str(folder))``, ``"folder:" + str(folder)``,
``"csv:" + str(file)``) and is deterministic for a given ``seed``. Labels are balanced: every
class has the same number of samples, give or take one. Images of one class share a colour
(plus noise), so that a few training steps can separate the classes.
"""

from __future__ import annotations

import csv
import gzip
import pickle
from pathlib import Path

import numpy as np
from PIL import Image


def balanced_labels(count: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` labels in 0..classes-1, each class (almost) equally often, shuffled."""
    return rng.permutation(np.arange(count) % classes)


def write_cifar_file(path: Path, images: np.ndarray, labels: np.ndarray, label_key: bytes,
                     protocol: int = 2, extra: dict[bytes, object] | None = None) -> None:
    """One pickled CIFAR batch: a dict with bytes keys, as the real files hold.

    ``images`` are uint8 ``[n, 3072]`` (or ``[n, 3, 32, 32]``); ``extra`` adds entries.
    """
    batch = {b"batch_label": path.name.encode(), label_key: [int(v) for v in labels],
             b"data": images.reshape(len(images), -1),
             b"filenames": [f"image_{i}.png".encode() for i in range(len(images))],
             **(extra or {})}
    with path.open("wb") as stream:
        pickle.dump(batch, stream, protocol=protocol)


def make_cifar10(root: Path, per_batch: int = 20, test: int = 20, seed: int = 0,
                 protocol: int = 2) -> Path:
    """``root/cifar-10-batches-py`` with five train batches of ``per_batch`` images and a
    ``test_batch`` of ``test``, random uint8 pixels, labels in 0..9, and ``batches.meta`` with
    the class names; ``protocol`` is the pickle protocol (the real files use 2)."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    names = [f"data_batch_{number}" for number in range(1, 6)] + ["test_batch"]
    for name in names:
        count = test if name == "test_batch" else per_batch
        images = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        write_cifar_file(folder / name, images, balanced_labels(count, 10, rng), b"labels",
                         protocol)
    write_cifar_meta(folder / "batches.meta", {b"label_names": list(CIFAR10_CLASSES),
                                               b"num_cases_per_batch": per_batch,
                                               b"num_vis": 3072}, protocol)
    return folder


CIFAR10_CLASSES = (b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog",
                   b"horse", b"ship", b"truck")


def write_cifar_meta(path: Path, meta: dict[bytes, object], protocol: int = 2) -> None:
    """A pickled metadata dict (``batches.meta``, ``meta``) with bytes keys and names."""
    with path.open("wb") as stream:
        pickle.dump(meta, stream, protocol=protocol)


def make_cifar100(root: Path, train: int = 200, test: int = 100, classes: int = 100,
                  seed: int = 0) -> Path:
    """``root/cifar-100-python`` with ``train`` and ``test`` files of that many images, fine
    labels in 0..classes-1 (at most 100) and coarse labels (fine // 5), and ``meta`` naming
    the 100 fine classes ``fine_00`` ... ``fine_99``."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    for name, count in (("train", train), ("test", test)):
        images = rng.integers(0, 256, (count, 3072), dtype=np.uint8)
        fine = balanced_labels(count, classes, rng)
        write_cifar_file(folder / name, images, fine, b"fine_labels",
                         extra={b"coarse_labels": [int(v) // 5 for v in fine]})
    write_cifar_meta(folder / "meta", {
        b"fine_label_names": [f"fine_{label:02d}".encode() for label in range(100)],
        b"coarse_label_names": [f"coarse_{label:02d}".encode() for label in range(20)]})
    return folder


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8, 1 or 3 dimensions) as an IDX file: magic, big-endian dims, values."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()


def make_idx(root: Path, train: int = 60, test: int = 20, gzipped: bool = True,
             classes: int = 10, seed: int = 0, name: str = "mnist") -> Path:
    """``root/name`` with MNIST's four IDX files (``.gz`` when ``gzipped``): ``train`` and
    ``test`` 28x28 uint8 images whose brightness follows the label, labels in 0..classes-1."""
    rng = np.random.default_rng(seed)
    folder = Path(root) / name
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        labels = balanced_labels(count, classes, rng).astype(np.uint8)
        noise = rng.integers(0, 64, (count, 28, 28))
        images = (noise + labels[:, None, None] * (190 // classes)).astype(np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            data = idx_bytes(array)
            path = folder / f"{prefix}-{kind}-ubyte"
            if gzipped:
                path.with_name(path.name + ".gz").write_bytes(gzip.compress(data, mtime=0))
            else:
                path.write_bytes(data)
    return folder


def write_images(folder: Path, classes: int, per_class: int, size: int,
                 rng: np.random.Generator) -> list[tuple[str, int]]:
    """``folder/cNN/NNN.ext`` images of ``classes`` colours; returns (relative path, class).

    The files alternate .jpg, .png and .JPEG; each side is between ``size`` and 1.5 ``size``.
    """
    written = []
    colours = rng.integers(0, 256, (classes, 3))
    extensions = (".jpg", ".png", ".JPEG")
    for label in range(classes):
        (folder / f"c{label:02d}").mkdir(parents=True, exist_ok=True)
        for number in range(per_class):
            width, height = rng.integers(size, size + size // 2 + 1, 2)
            noise = rng.integers(-20, 21, (height, width, 3))
            pixels = np.clip(colours[label] + noise, 0, 255).astype(np.uint8)
            relative = f"c{label:02d}/{number:03d}{extensions[number % 3]}"
            Image.fromarray(pixels, "RGB").save(folder / relative)
            written.append((relative, label))
    return written


def make_image_folder(root: Path, classes: int = 4, per_class: int = 3, size: int = 24,
                      seed: int = 0) -> Path:
    """``root/images/c00 ... c{classes-1}/``, each with ``per_class`` small RGB images."""
    folder = Path(root) / "images"
    write_images(folder, classes, per_class, size, np.random.default_rng(seed))
    return folder


def make_csv_list(root: Path, classes: int = 4, per_class: int = 4, size: int = 24,
                  query_gallery: bool = False, seed: int = 0) -> Path:
    """``root/list.csv`` and its images under ``root/photos/``: columns path,label,split
    (labels are strings ``label_00``, ``label_01``...; the first half of the classes train,
    the rest test).

    With ``query_gallery`` the CSV also has is_query and is_gallery columns: of the test rows,
    even-numbered ones are queries and odd-numbered ones gallery images.
    """
    root = Path(root)
    images = write_images(root / "photos", classes, per_class, size, np.random.default_rng(seed))
    csv_file = root / "list.csv"
    with csv_file.open("w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["path", "label", "split", *(["is_query", "is_gallery"]
                                                      if query_gallery else [])])
        for relative, label in images:
            split = "train" if label < classes // 2 else "test"
            row = [f"photos/{relative}", f"label_{label:02d}", split]
            if query_gallery:
                number = int(Path(relative).stem)
                row += [int(number % 2 == 0), int(number % 2 == 1)]
            writer.writerow(row)
    return csv_file
