"""The method interface: what the trainer trains and the evaluator scores.

Both ``kdml.training`` and ``kdml.evaluation`` import this module; neither imports the other.
A method is an ``nn.Module`` with

- ``forward(inputs, labels, target_inputs=None, *, rng=None) -> StepOutput``: one batch's
  objective, with its named terms as tensors (no host sync: the trainer reduces them once per
  epoch);
- ``embed(inputs) -> Tensor``: test-time embeddings;
- optionally ``chart_codes(inputs)`` (``has_charts = True``): the compressed code of an atlas;
- optionally ``fit(batches)`` (``needs_fit = True``): a closed-form fit instead of gradient steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from kdml.config import OptimConfig
from kdml.seeding import StepRandom


@dataclass
class StepOutput:
    """The objective of one batch.

    Args:
        loss: the total loss, a scalar tensor that backpropagates.
        terms: named scalar tensors for logging (detached). ``"loss"`` is the total.
        embeddings: the batch's embeddings [B, d], for terms added on top of a recipe (the
            domain MMD); ``None`` when the method's forward does not embed the batch itself.
    """

    loss: torch.Tensor
    terms: dict[str, torch.Tensor]
    embeddings: torch.Tensor | None = None


# Logged terms that are not losses: fractions and counts, drawn apart from the loss terms
# (a count of hundreds had flattened the loss curves on one axis).
DIAGNOSTIC_TERMS = frozenset({"q_max", "active_triplets", "infinite_positives", "head_active"})


def detached(**terms: torch.Tensor) -> dict[str, torch.Tensor]:
    """``terms`` with every value detached, for :attr:`StepOutput.terms`."""
    return {name: value.detach() for name, value in terms.items()}


class Method(nn.Module):
    """Base of every recipe's model.

    Subclasses set ``self.backbone`` and implement :meth:`forward` and :meth:`embed`;
    :meth:`param_groups` separates class proxies, which train at their own learning rate
    (Sec. 5.1 of Chu et al. 2020).
    """

    backbone: nn.Module
    # True for methods that also take an unlabelled target-domain batch: the trainer then
    # calls ``method(inputs, labels, target_inputs=...)``.
    uses_target: bool = False
    # True for methods with ``chart_codes`` (Atlas): the evaluator scores them per chart.
    has_charts: bool = False
    # True for methods fitted in closed form (e.g. PCA): the trainer calls ``fit`` instead of
    # running an optimiser.
    needs_fit: bool = False
    # True for methods that augment their training inputs themselves (the SimCLR recipes'
    # colour jitter expects [0, 1] images): the trainer then hands them unnormalised batches,
    # and they apply ``backbone.normalization`` after augmenting.
    augments_inputs: bool = False

    @property
    def batch_needs(self) -> tuple[int, int, str]:
        """What a batch must hold for the method's metric term not to be exactly 0: at least
        this many samples of a class, and this many classes, and the term, in words (for the
        refusal of class-balanced batches that hold less). (1, 1): every batch trains it."""
        return 1, 1, ""

    def forward(self, inputs: torch.Tensor, labels: torch.Tensor,
                target_inputs: torch.Tensor | None = None, *,
                rng: StepRandom | None = None) -> StepOutput:
        """One batch's objective. ``rng`` holds the step's random streams; ``None`` draws from
        torch's global generator (for use outside the trainer, as in a PML loop)."""
        raise NotImplementedError

    def embed(self, inputs: torch.Tensor) -> torch.Tensor:
        """Test-time embeddings, shape [B, d]."""
        raise NotImplementedError

    def chart_codes(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Chart coordinates [B, d] and chart index [B] (methods with ``has_charts``)."""
        raise NotImplementedError(f"{type(self).__name__} has no charts")

    def fit(self, batches: Iterable[torch.Tensor]) -> None:
        """Closed-form fit on the training inputs, given batch by batch (``needs_fit``)."""
        raise NotImplementedError(f"{type(self).__name__} has no closed-form fit")

    def check_fit(self, count: int | None = None) -> None:
        """Refuse, in one line, a :meth:`fit` this machine cannot do, or (``count``: the
        samples it will read, where known) these data cannot give: the trainer calls it
        before it makes a run folder (nothing to check for methods without a fit)."""

    def proxy_parameters(self) -> list[nn.Parameter]:
        """Parameters trained at ``optim.proxy_lr`` (none by default)."""
        return []

    def param_groups(self, optim: OptimConfig) -> list[dict]:
        """Three learning rates: the backbone (``optim.lr``), the new layers on top of it
        (``optim.head_lr``, default ``optim.lr``) and the class proxies (``optim.proxy_lr``,
        no weight decay). Empty groups are left out by the trainer."""
        proxy_ids = {id(p) for p in self.proxy_parameters()}
        backbone_ids = {id(p) for p in self.backbone.parameters()}
        head = [p for p in self.parameters() if id(p) not in proxy_ids | backbone_ids]
        return [
            {"params": list(self.backbone.parameters()), "lr": optim.lr,
             "weight_decay": optim.weight_decay},
            {"params": head, "lr": optim.head_lr or optim.lr,
             "weight_decay": optim.weight_decay},
            {"params": self.proxy_parameters(), "lr": optim.proxy_lr, "weight_decay": 0.0},
        ]
