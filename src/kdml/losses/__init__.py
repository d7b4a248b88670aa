"""Losses kdml adds to pytorch-metric-learning's (which it uses directly where it has them)."""

from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.dtml_objective import DTMLObjective
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.losses.nt_xent import nt_xent_loss

__all__ = ["DTMLObjective", "MarginalFisherLoss", "am_softmax_loss", "nt_xent_loss"]
