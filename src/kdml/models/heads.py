"""Heads that turn pooled backbone features into embeddings."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class EmbeddingHead(nn.Module):
    """Affine map followed by L2 normalisation: ``x = (W^T f + b) / ||W^T f + b||``.

    Shape:
        - Input: [B, in_features] pooled features.
        - Output: [B, embedding_size], unit norm.
    """

    def __init__(self, in_features: int, embedding_size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, embedding_size)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return F.normalize(self.linear(features), dim=1)

