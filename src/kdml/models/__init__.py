"""Backbones and heads."""

from kdml.models.backbones import MLP, Conv1dNet, SmallCNN, build_backbone, freeze_batchnorm
from kdml.models.heads import EmbeddingHead, JRDHead, JRDRepresentations

__all__ = [
    "MLP",
    "Conv1dNet",
    "EmbeddingHead",
    "JRDHead",
    "JRDRepresentations",
    "SmallCNN",
    "build_backbone",
    "freeze_batchnorm",
]
