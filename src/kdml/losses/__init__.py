"""Losses kdml adds to pytorch-metric-learning's. It uses PML's directly where PML has them,
except where PML's would make a GPU step wait for the host (AM-Softmax, NT-Xent)."""

from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.dtml_objective import DTMLObjective
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.losses.nt_xent import nt_xent_loss

__all__ = ["DTMLObjective", "MarginalFisherLoss", "am_softmax_loss", "nt_xent_loss"]
