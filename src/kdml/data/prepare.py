"""``data`` config -> the splits of a run. Reads metadata and labels only: no image is decoded."""

from __future__ import annotations

import dataclasses

import torch

from kdml.config import DataConfig
from kdml.data.dataset import DmlDataset
from kdml.data.domains import fit_source_pca, is_domain_dataset, load_domain_data
from kdml.data.images import ImageFiles
from kdml.data.registry import check_root_is_read, open_dataset
from kdml.data.splits import DOMAIN, DataSplits, make_splits, remapped_to_training
from kdml.errors import KdmlError


def prepare_data(data: DataConfig) -> DataSplits:
    """Open ``data.dataset`` (or a domain pair) and split it as ``data.split`` asks."""
    return prepare_data_and_test_part(data, test_part=False)[0]


def prepare_data_and_test_part(data: DataConfig, test_part: bool = True
                               ) -> tuple[DataSplits, DataSplits]:
    """The splits as trained and, with ``test_part``, the same dataset split without
    ``data.validation`` (the test classes a validated model is finally scored on). The
    dataset is opened once for both; without ``test_part`` or validation both are the same."""
    if is_domain_dataset(data.dataset):
        check_root_is_read(data.dataset, data.root)
        check_split_settings(data, f"{data.dataset} is a domain pair, trained on its source "
                                   "and scored on its target", pair=True)
        if data.validation:
            raise KdmlError("data.validation applies to single datasets, not to domain pairs "
                            "(the target's labels are for evaluation only)")
        pair = load_domain_data(data.dataset)
        if data.pca_dim:
            # in the setting's name: fit_source_pca, a library function, names its argument
            limit = min(pair.source.x.flatten(1).shape)
            if data.pca_dim > limit:
                raise KdmlError(f"data.pca_dim={data.pca_dim} exceeds {limit}, the smaller of "
                                f"the source's samples and features in {data.dataset}; lower "
                                "it")
            pair = fit_source_pca(pair, data.pca_dim)
        splits = domain_splits(pair.source, pair.target)
        return splits, splits
    if data.pca_dim:
        raise KdmlError("data.pca_dim applies to domain pairs (SOURCE->TARGET) only")
    parts = open_dataset(data.dataset, data.root)
    dataset = parts.dataset
    if data.split == "standard" and parts.parts:
        check_split_settings(data, f"{data.dataset} has a split of its own, which "
                                   "data.split=standard takes")
    elif data.split == "seen-holdout":
        check_split_settings(data, "the split is seen-holdout", holdout=True)
    else:
        check_split_settings(data, "the split is class-disjoint", disjoint=True)
    if isinstance(dataset, ImageFiles):
        dataset = dataset.resized(data.resize)

    def split(validation: float) -> DataSplits:
        return make_splits(dataset, parts.parts, data.split, data.train_classes,
                           data.holdout_fraction, parts.eval_ks, validation)

    trained = split(data.validation)
    return trained, split(0.0) if test_part and data.validation else trained


def check_split_settings(data: DataConfig, why: str, disjoint: bool = False,
                         holdout: bool = False, pair: bool = False) -> None:
    """Refuse ``data.train_classes`` (class-disjoint splits only) or ``data.holdout_fraction``
    (seen-holdout only) changed from their defaults where the split does not use them: they
    had been ignored without a word, while config.yaml recorded them."""
    defaults = {field.name: field.default for field in dataclasses.fields(DataConfig)}
    for setting, used, split in (("train_classes", disjoint, "class-disjoint"),
                                 ("holdout_fraction", holdout, "seen-holdout")):
        if not used and getattr(data, setting) != defaults[setting]:
            remedy = "drop it" if pair else f"drop it, or set data.split={split}"
            raise KdmlError(f"data.{setting} applies to the {split} split only, and {why}; "
                            f"{remedy}")


def domain_splits(source: DmlDataset, target: DmlDataset) -> DataSplits:
    """Train on the labelled source (labels remapped to 0..C-1), score on the target."""
    classes, remapped = torch.unique(source.labels, return_inverse=True)
    return DataSplits(remapped_to_training(source, classes, remapped), target, classes.tolist(),
                      DOMAIN, target=target)
