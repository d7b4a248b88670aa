"""``amsoftmax``: AM-Softmax (CosFace) on an L2-normalized linear embedding head.

Eq. 12 of Chu et al. 2020 with alpha = 0; PML's ``CosFaceLoss`` computes it and holds the class
proxies, which train at ``optim.proxy_lr``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from pytorch_metric_learning.losses import CosFaceLoss
from torch import nn

from kdml.config import RunConfig
from kdml.errors import KdmlError
from kdml.models.heads import EmbeddingHead
from kdml.training.method import Method, StepOutput
from kdml.training.recipes.base import Recipe


@dataclass
class AMSoftmaxParams:
    scale: float = 20.0  # s of Eq. 12 (Sec. 5.1)
    margin: float = 0.1  # m of Eq. 12 (CUB, SOP)

    def validate(self) -> None:
        if self.scale <= 0:
            raise KdmlError(f"method.scale must be positive, got {self.scale}")
        if not 0 <= self.margin < 1:
            raise KdmlError(f"method.margin must be in [0, 1), got {self.margin}")


class AMSoftmaxMethod(Method):
    """Backbone -> affine + L2 embedding -> AM-Softmax over normalized class proxies."""

    def __init__(self, backbone: nn.Module, embedding_size: int, num_classes: int,
                 params: AMSoftmaxParams) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = EmbeddingHead(backbone.feature_size, embedding_size)
        self.am_softmax = CosFaceLoss(num_classes, embedding_size, margin=params.margin,
                                      scale=params.scale)

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> StepOutput:
        loss = self.am_softmax(self.embed(inputs), labels)
        return StepOutput(loss, {"loss": loss.item()})

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(inputs))

    def proxy_parameters(self) -> list[nn.Parameter]:
        return list(self.am_softmax.parameters())


def build(config: RunConfig, backbone: nn.Module, num_classes: int) -> Method:
    return AMSoftmaxMethod(backbone, config.model.embedding_size, num_classes, config.method)


RECIPE = Recipe(
    "amsoftmax", "AM-Softmax (CosFace) baseline: JRD with alpha = 0", AMSoftmaxParams, build
)
