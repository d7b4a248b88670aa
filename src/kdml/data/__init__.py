"""Datasets, splits, samplers, loaders and batch transforms. Nothing here downloads."""

from kdml.data.dataset import ArrayDataset, Batch, DmlDataset
from kdml.data.formats.common import DatasetParts
from kdml.data.images import ImageFiles
from kdml.data.registry import DATASETS, FORMATS, open_dataset
from kdml.data.samplers import ClassBalancedBatches, ShuffledBatches, TargetBatches
from kdml.data.splits import class_disjoint_split, seen_holdout_split

__all__ = [
    "DATASETS",
    "FORMATS",
    "ArrayDataset",
    "Batch",
    "ClassBalancedBatches",
    "DatasetParts",
    "DmlDataset",
    "ImageFiles",
    "ShuffledBatches",
    "TargetBatches",
    "class_disjoint_split",
    "open_dataset",
    "seen_holdout_split",
]
