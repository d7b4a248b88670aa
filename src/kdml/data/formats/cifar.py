"""CIFAR-10 and CIFAR-100 (Krizhevsky, 2009): 60,000 colour images of 32x32 pixels each.

The extracted Python archives::

    cifar-10-batches-py/   data_batch_1 ... data_batch_5 (50,000 train), test_batch (10,000)
    cifar-100-python/      train (50,000), test (10,000)

Each file is a pickled dict with bytes keys: ``b"data"``, a uint8 array [10,000, 3,072] whose
row is an image's red, green and blue 32x32 planes in row-major order, and ``b"labels"``
(CIFAR-10, 10 classes) or ``b"fine_labels"`` (CIFAR-100, 100 classes), a list of ints. The
classes' names, where the metadata file is there, come from ``batches.meta``'s
``b"label_names"`` (CIFAR-10) or ``meta``'s ``b"fine_label_names"`` (CIFAR-100).

Split: the files' own, train files then test file. The pickles are read by an unpickler that
builds NumPy arrays and nothing else, so a file planted in the data folder cannot run code.
"""

from __future__ import annotations

import importlib
import os
import pickle
from pathlib import Path

import numpy as np
import torch

from kdml.data.dataset import ArrayDataset
from kdml.data.formats.common import DatasetParts, Layout

try:  # NumPy 2 renamed numpy.core to numpy._core (the old name warns)
    multiarray = importlib.import_module("numpy._core.multiarray")
    numeric = importlib.import_module("numpy._core.numeric")
except ImportError:  # NumPy 1
    multiarray = importlib.import_module("numpy.core.multiarray")
    numeric = importlib.import_module("numpy.core.numeric")

EXPECTED_10 = "cifar-10-batches-py/ with data_batch_1 ... data_batch_5 and test_batch"
EXPECTED_100 = "cifar-100-python/ with train and test"
IMAGE_BYTES = 3 * 32 * 32


def latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as Python 3 pickles bytes at protocol 2, and only that codec."""
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError(f"refused _codecs.encode with codec {encoding!r}")
    return text.encode("latin1")


# Everything a pickled uint8 array needs, under the names NumPy 1 (the real files) and NumPy 2
# write; ``_codecs.encode`` is how Python 3 stores bytes at pickle protocol 2.
ALLOWED_GLOBALS = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("numpy.core.multiarray", "_reconstruct"): multiarray._reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): multiarray._reconstruct,
    ("numpy.core.numeric", "_frombuffer"): numeric._frombuffer,
    ("numpy._core.numeric", "_frombuffer"): numeric._frombuffer,
    ("_codecs", "encode"): latin1_encode,
}


class ArrayUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED_GLOBALS` and refuses any other global."""

    def find_class(self, module: str, name: str) -> object:
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused to load global {module}.{name} (only NumPy "
                                         "arrays are allowed)") from None


def read_pickle(layout: Layout, relative: str) -> object:
    """The object pickled in ``relative``, read by :class:`ArrayUnpickler`."""
    path = layout.file(relative)
    try:
        with path.open("rb") as stream:
            return ArrayUnpickler(stream, encoding="bytes").load()
    except Exception as error:  # a corrupt pickle can raise almost anything
        detail = " ".join(str(error).split()) or type(error).__name__
        raise layout.error(f"{relative} is not a readable CIFAR pickle: {detail}") from None


def read_class_names(layout: Layout, relative: str, key: bytes,
                     classes: int) -> dict[int, str] | None:
    """Label -> class name from the metadata pickle ``relative`` (``batches.meta`` or ``meta``:
    a dict whose ``key`` holds the ``classes`` names in label order); None if the file is
    absent (not a folder or a broken link in its place), since the images and labels do not
    need it."""
    if not os.path.lexists(layout.root / relative):
        return None
    meta = read_pickle(layout, relative)
    names = meta.get(key) if isinstance(meta, dict) else None
    if not (isinstance(names, list) and len(names) == classes
            and all(isinstance(name, bytes | str) for name in names)):
        raise layout.error(f"{relative}: expected a dict whose {key!r} lists {classes} class "
                           "names")
    return {label: name.decode("latin1") if isinstance(name, bytes) else name
            for label, name in enumerate(names)}


def read_batch(layout: Layout, relative: str, label_key: bytes,
               classes: int) -> tuple[np.ndarray, np.ndarray]:
    """The images ``[n, 3, 32, 32]`` uint8 and labels ``[n]`` int64 of one pickled file."""
    batch = read_pickle(layout, relative)
    if not isinstance(batch, dict) or b"data" not in batch or label_key not in batch:
        raise layout.error(f"{relative} is not a CIFAR batch: expected a dict with keys "
                           f"b'data' and {label_key!r}")
    data = batch[b"data"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == IMAGE_BYTES):
        shape = getattr(data, "shape", type(data).__name__)
        raise layout.error(f"{relative}: b'data' must be a uint8 array [n, {IMAGE_BYTES}], "
                           f"got {shape}")
    try:  # no dtype here: np.int64 would truncate a label 1.7 to 1 without a word
        labels = np.asarray(batch[label_key])
    except (TypeError, ValueError):
        labels = np.asarray(None)
    if labels.dtype.kind not in "iu":  # floats, strings, or ints beyond 64 bits (object)
        raise layout.error(f"{relative}: {label_key!r} is not a list of integer labels "
                           f"(0..{classes - 1})")
    if labels.shape != (data.shape[0],):  # a column of the right count had read "4 but 4"
        what = (f"{labels.size} labels" if labels.ndim == 1 else
                f"labels of shape {labels.shape}, not a list of {data.shape[0]}")
        raise layout.error(f"{relative} holds {data.shape[0]} images but {what}")
    if labels.size and not 0 <= labels.min() <= labels.max() < classes:
        raise layout.error(f"{relative}: labels must lie in 0..{classes - 1}, got "
                           f"{labels.min()}..{labels.max()}")
    return data.reshape(-1, 3, 32, 32), labels.astype(np.int64)


def load_batches(layout: Layout, train: list[str], test: list[str], label_key: bytes,
                 classes: int, description: str,
                 class_names: dict[int, str] | None = None) -> DatasetParts:
    """The train files then the test files as one dataset, split as the files are."""
    batches = [read_batch(layout, relative, label_key, classes) for relative in [*train, *test]]
    x = np.concatenate([images for images, _ in batches])  # a fresh, writable copy
    labels = np.concatenate([labels for _, labels in batches])
    num_train = sum(len(labels) for _, labels in batches[: len(train)])
    dataset = ArrayDataset(layout.dataset, description, torch.from_numpy(x),
                           torch.from_numpy(labels), default_backbone="cnn",
                           class_names=class_names, folder=str(layout.root.absolute()))
    return DatasetParts(dataset, {"train": torch.arange(num_train),
                                  "test": torch.arange(num_train, len(labels))})


def load_cifar10(root: Path) -> DatasetParts:
    """Read CIFAR-10 from its extracted folder ``root`` (``cifar-10-batches-py``)."""
    layout = Layout("cifar10", root, EXPECTED_10)
    train = [f"data_batch_{number}" for number in range(1, 6)]
    return load_batches(layout, train, ["test_batch"], b"labels", 10,
                        "CIFAR-10, 3x32x32 images, 10 classes; files' train/test split",
                        read_class_names(layout, "batches.meta", b"label_names", 10))


def load_cifar100(root: Path) -> DatasetParts:
    """Read CIFAR-100 (its 100 fine labels) from its extracted folder ``root``."""
    layout = Layout("cifar100", root, EXPECTED_100)
    return load_batches(layout, ["train"], ["test"], b"fine_labels", 100,
                        "CIFAR-100, 3x32x32 images, 100 fine classes; files' train/test split",
                        read_class_names(layout, "meta", b"fine_label_names", 100))
