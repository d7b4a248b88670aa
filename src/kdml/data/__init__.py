"""Datasets, splits and samplers. Nothing here downloads."""

from kdml.data.dataset import ArrayDataset
from kdml.data.registry import DATASETS, load_dataset
from kdml.data.sampling import class_balanced_batches
from kdml.data.splits import class_disjoint_split, seen_holdout_split

__all__ = [
    "DATASETS",
    "ArrayDataset",
    "class_balanced_batches",
    "class_disjoint_split",
    "load_dataset",
    "seen_holdout_split",
]
