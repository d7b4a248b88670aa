"""What a recipe builds: a backbone, its head and an objective, behind one small interface."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from kdml.config import OptimConfig


@dataclass
class StepOutput:
    """The objective of one batch: the total loss and its named terms (floats, for logging)."""

    loss: torch.Tensor
    terms: dict[str, float]
    # The batch's embeddings, for terms added on top of a recipe (the domain MMD).
    embeddings: torch.Tensor | None = None


class Method(nn.Module):
    """Base of every recipe's model. Subclasses set ``self.backbone`` and implement
    :meth:`forward` and :meth:`embed`; :meth:`param_groups` separates class proxies, which train
    at their own learning rate (Sec. 5.1 of Chu et al. 2020)."""

    backbone: nn.Module
    # True for methods that also take an unlabelled target-domain batch: the trainer then calls
    # ``method(inputs, labels, target_inputs=...)``.
    uses_target: bool = False

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor) -> StepOutput:
        raise NotImplementedError

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """Test-time embeddings, shape [B, d]."""
        raise NotImplementedError

    def fit(self, train_inputs: torch.Tensor) -> None:
        """Closed-form fitting for methods with nothing to optimise (e.g. PCA); called once
        by the trainer instead of gradient steps when :meth:`param_groups` is empty."""
        raise NotImplementedError(f"{type(self).__name__} has no parameters and no fit()")

    def proxy_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at ``optim.proxy_lr`` (none by default)."""
        return []

    def param_groups(self, optim: OptimConfig) -> list[dict]:
        proxy_ids = {id(p) for p in self.proxy_parameters()}
        network = [p for p in self.parameters() if id(p) not in proxy_ids]
        groups = [{"params": network, "lr": optim.lr, "weight_decay": optim.weight_decay}]
        if proxy_ids:
            groups.append({"params": self.proxy_parameters(), "lr": optim.proxy_lr,
                           "weight_decay": 0.0})
        return groups
