"""Regularizers added to a metric-learning loss."""

from kdml.regularizers.domain import DomainMMD
from kdml.regularizers.jrs import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)
from kdml.regularizers.manifold import ChartMembershipLoss, ManifoldMMD

__all__ = ["ChartMembershipLoss", "DomainMMD", "IntraClassPenalty", "JointIntra", "JointMMD",
           "JointRepresentationSimilarity", "ManifoldMMD"]
