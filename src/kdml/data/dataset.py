"""One in-memory dataset type for images and vectors."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset


@dataclass
class ArrayDataset(Dataset):
    """Samples and integer labels held as tensors.

    Args:
        name: registry name, e.g. ``"mnist5k"``.
        description: one line for ``kdml datasets``.
        x: samples, float32, shape [N, C, H, W] for images or [N, D] for vectors.
        y: integer labels, shape [N].
        default_backbone: the backbone ``"auto"`` resolves to for this data.
    """

    name: str
    description: str
    x: torch.Tensor
    y: torch.Tensor
    default_backbone: str = "mlp"

    def __post_init__(self) -> None:
        if self.x.shape[0] != self.y.shape[0]:
            raise ValueError(f"{self.name}: {self.x.shape[0]} samples but {self.y.shape[0]} labels")
        self.x = self.x.float()
        self.y = self.y.long()

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]

    @property
    def input_shape(self) -> tuple[int, ...]:
        """Shape of one sample, e.g. (1, 28, 28) or (40,)."""
        return tuple(self.x.shape[1:])

    @property
    def is_image(self) -> bool:
        return self.x.dim() == 4

    @property
    def num_classes(self) -> int:
        return int(self.y.unique().numel())

    def subset(self, indices: torch.Tensor, name: str | None = None) -> ArrayDataset:
        """A new dataset holding the samples at ``indices`` (labels unchanged)."""
        return ArrayDataset(
            name or self.name, self.description, self.x[indices], self.y[indices],
            self.default_backbone,
        )
