"""Regularizers added to a metric-learning loss."""

from kdml.regularizers.jrs import (
    IntraClassPenalty,
    JointIntra,
    JointMMD,
    JointRepresentationSimilarity,
)

__all__ = ["IntraClassPenalty", "JointIntra", "JointMMD", "JointRepresentationSimilarity"]
