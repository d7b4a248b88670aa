"""Losses kdml adds to pytorch-metric-learning's (PML), or computes itself where PML's would make
a GPU step wait for the host (AM-Softmax, NT-Xent).

:class:`MarginalFisherLoss` and :class:`PairwiseLogisticLoss` take PML's call,
``loss(embeddings, labels)``, and work inside PML's ``MultipleLosses``; they take their pairs
from the whole batch, so a miner's ``indices_tuple`` and a reference batch (``ref_emb``,
``ref_labels``, ``CrossBatchMemory``) are refused. :func:`am_softmax_loss` and
:func:`nt_xent_loss` are functions of the cosines and of two views; :class:`DTMLObjective` takes
every layer's outputs.
"""

from kdml.losses.am_softmax import am_softmax_loss
from kdml.losses.dtml_objective import DTMLObjective
from kdml.losses.marginal_fisher import MarginalFisherLoss
from kdml.losses.nt_xent import nt_xent_loss
from kdml.losses.pairwise_logistic import PairwiseLogisticLoss, pairwise_logistic_loss

__all__ = ["DTMLObjective", "MarginalFisherLoss", "PairwiseLogisticLoss", "am_softmax_loss",
           "nt_xent_loss", "pairwise_logistic_loss"]
