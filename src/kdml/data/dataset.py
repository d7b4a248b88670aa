"""A dataset is samples plus an integer label array.

Labels are known without decoding anything, so splits, class counts and samplers never touch
pixels. A sample is either a row of an in-memory array (:class:`ArrayDataset`: the offline
datasets, MNIST's IDX files, CIFAR's pickles) or an image file decoded on demand
(:class:`~kdml.data.images.ImageFiles`: CUB, Cars196, SOP, In-Shop, a folder, a CSV list).

Datasets hand whole batches to a ``DataLoader`` through ``__getitems__`` and return a
:class:`Batch`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor
from torch.utils.data import Dataset

from kdml.checks import whole_number_labels
from kdml.errors import KdmlError


class Batch(NamedTuple):
    """One batch as the loader yields it (raw samples: no augmentation, no normalisation).

    Args:
        inputs: ``[B, ...]``: float rows, or uint8 images ``[B, C, H, W]``.
        labels: ``[B]`` int64.
        indices: ``[B]`` int64 positions of the samples in their dataset.
        unreadable: ``[B]`` bool, True where an image file could not be decoded (its row of
            ``inputs`` is zeros); the trainer stops or skips as ``data.on_bad_image`` says.
    """

    inputs: Tensor
    labels: Tensor
    indices: Tensor
    unreadable: Tensor


def collate_batch(batch: Batch) -> Batch:
    """The ``collate_fn`` for datasets whose ``__getitems__`` already returns a :class:`Batch`."""
    return batch


class DmlDataset(Dataset):
    """Base of every dataset: ``labels`` [N] int64 and ``len(labels)`` samples.

    ``class_names`` maps a label to the class's name where the files name their classes (a
    folder's sub-folders, a CSV's label column, Fashion-MNIST's, CIFAR's, CUB's and Cars196's
    class lists); it is None otherwise, and :meth:`relabelled` drops it unless it is given
    the names under the new labels, so a name can never describe another class.

    Subclasses implement :meth:`load` (one sample) and :meth:`subset`; they may override
    ``__getitems__`` to fetch a batch at once.
    """

    name: str
    description: str
    labels: Tensor
    default_backbone: str
    class_names: dict[int, str] | None

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def load(self, index: int) -> Tensor:
        """Sample ``index`` as the loader yields it."""
        raise NotImplementedError

    def source_of(self, index: int) -> str:
        """Where sample ``index`` comes from, for messages (a file path or a row number)."""
        return f"{self.name}[{index}]"

    def place_of(self, index: int) -> str:
        """Where sample ``index`` is listed, for messages (``"images.txt line 5"``); ``""``
        where no list file names it."""
        return ""

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """Shape of one sample as the loader yields it, e.g. (1, 28, 28), (3, 256, 256)."""
        raise NotImplementedError

    @property
    def is_image(self) -> bool:
        return len(self.sample_shape) == 3

    @property
    def is_file_backed(self) -> bool:
        """True when samples are decoded from files (worth worker processes)."""
        return False

    @property
    def num_classes(self) -> int:
        return int(self.labels.unique().numel())

    def subset(self, indices: Tensor, name: str | None = None) -> DmlDataset:
        """The samples at ``indices``, in that order (labels unchanged)."""
        raise NotImplementedError

    def relabelled(self, labels: Tensor,
                   class_names: dict[int, str] | None = None) -> DmlDataset:
        """The same samples with other labels (e.g. remapped to 0..C-1), and the classes'
        names under those labels (None: unnamed; see :func:`renamed_classes`)."""
        if labels.shape != self.labels.shape:
            raise KdmlError(f"{self.name}: {len(labels)} new labels for {len(self)} samples")
        # every concrete dataset is a dataclass; replace() re-runs its checks
        return dataclasses.replace(self, labels=labels.long(),  # type: ignore[type-var]
                                   class_names=class_names)

    def class_name(self, label: int) -> str | None:
        """The name of class ``label``, or None where the classes have no names."""
        return None if self.class_names is None else self.class_names.get(int(label))

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self.load(index), int(self.labels[index])

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index_tensor = torch.as_tensor(indices, dtype=torch.long)
        samples = [self.load(int(i)) for i in index_tensor]
        return Batch(torch.stack(samples), self.labels[index_tensor], index_tensor,
                     torch.zeros(len(index_tensor), dtype=torch.bool))


def renamed_classes(class_names: dict[int, str] | None,
                    new_label_of: dict[int, int]) -> dict[int, str] | None:
    """``class_names`` keyed by the new labels that ``new_label_of`` gives the old ones.

    >>> renamed_classes({3: "cat", 7: "dog"}, {3: 0, 7: 1})
    {0: 'cat', 1: 'dog'}
    """
    if class_names is None:
        return None
    return {new: class_names[old] for old, new in new_label_of.items() if old in class_names}


@dataclass
class ArrayDataset(DmlDataset):
    """Samples held in memory as one tensor.

    Args:
        name: registry name, e.g. ``"mnist5k"``.
        description: one line for ``kdml datasets``.
        x: samples ``[N, ...]``: float32 (images in [0, 1], or vectors) or uint8 images
            ``[N, C, H, W]`` (converted to [0, 1] on the training device).
        labels: integer labels ``[N]``.
        default_backbone: the backbone ``"auto"`` resolves to for this data.
        class_names: label -> class name, where the data names its classes.
        folder: the folder whose files the array was read from (MNIST's IDX files, CIFAR's
            pickles), absolute, for messages (``data.json`` names it); None for data made in
            memory (the offline sets, generated or converted data).
    """

    name: str
    description: str
    x: Tensor
    labels: Tensor
    default_backbone: str = "mlp"
    class_names: dict[int, str] | None = None
    folder: str | None = None

    def __post_init__(self) -> None:
        self.labels = whole_number_labels(self.name, self.labels)
        if self.x.shape[0] != self.labels.shape[0]:
            raise KdmlError(f"{self.name}: {self.x.shape[0]} samples but "
                            f"{self.labels.shape[0]} labels")
        if self.x.dtype != torch.uint8:
            self.x = self.x.float()

    @property
    def y(self) -> Tensor:
        """The labels (the name the array datasets have always used)."""
        return self.labels

    def load(self, index: int) -> Tensor:
        return self.x[index]

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        # One indexing operation instead of B: in-memory batches cost one gather.
        index_tensor = torch.as_tensor(indices, dtype=torch.long)
        return Batch(self.x[index_tensor], self.labels[index_tensor], index_tensor,
                     torch.zeros(len(index_tensor), dtype=torch.bool))

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample (the same as :attr:`sample_shape` for in-memory data)."""
        return self.sample_shape

    def subset(self, indices: Tensor, name: str | None = None) -> ArrayDataset:
        return dataclasses.replace(self, name=name or self.name, x=self.x[indices],
                                   labels=self.labels[indices])
