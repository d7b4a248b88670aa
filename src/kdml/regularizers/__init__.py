"""Regularizers added to a metric-learning loss."""

from kdml.regularizers.domain import DomainMMD
from kdml.regularizers.jrs import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)
from kdml.regularizers.manifold import ManifoldMMD

__all__ = ["DomainMMD", "IntraClassPenalty", "JointIntra", "JointMMD",
           "JointRepresentationSimilarity", "ManifoldMMD"]
