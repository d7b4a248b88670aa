"""``data`` config -> the splits of a run. Reads metadata and labels only: no image is decoded."""

from __future__ import annotations

import dataclasses

import torch

from kdml.config import DataConfig
from kdml.data.dataset import DmlDataset
from kdml.data.domains import (
    SourcePCA,
    fit_source_pca,
    is_domain_dataset,
    load_domain_data,
    projected_pair,
)
from kdml.data.images import ImageFiles
from kdml.data.registry import (
    check_root_is_read,
    open_dataset,
)
from kdml.data.splits import DOMAIN, DataSplits, make_splits, remapped_to_training
from kdml.errors import KdmlError


def prepare_data(data: DataConfig, *, new_run: bool = False,
                 pca: SourcePCA | None = None) -> DataSplits:
    """Open ``data.dataset`` (or a domain pair) and split it as ``data.split`` asks
    (``new_run``, ``pca``: see :func:`prepare_data_and_test_part`)."""
    return prepare_data_and_test_part(data, test_part=False, new_run=new_run, pca=pca)[0]


def prepare_data_and_test_part(data: DataConfig, test_part: bool = True, *,
                               new_run: bool = False, pca: SourcePCA | None = None
                               ) -> tuple[DataSplits, DataSplits]:
    """The splits as trained and, with ``test_part``, the same dataset split without
    ``data.validation`` (the test classes a validated model is finally scored on). The
    dataset is opened once for both; without ``test_part`` or validation both are the same.

    ``new_run``: the data of a run about to train from its first epoch, whose config the user
    can still change, so a split setting the split does not use is refused. Otherwise (a
    trained run's data, or another dataset its model embeds) that setting is reset to its
    default (:func:`settled_split_settings`): an older kdml recorded it and ignored it, and the
    run is done.

    ``pca``: for a domain pair with ``data.pca_dim``, the PCA to project it by (a trained
    run's, fitted on its own source: another pair embedded by its model), instead of one fitted
    on this pair's source."""
    if is_domain_dataset(data.dataset):
        check_root_is_read(data.dataset, data.root)
        data = settled_pair_split(data, new_run)
        data = settled_split_settings(data, None, f"{data.dataset} is a domain pair, trained "
                                      "on its source and scored on its target", new_run,
                                      pair=True)
        if data.validation:
            raise KdmlError("data.validation applies to single datasets, not to domain pairs "
                            "(the target's labels are for evaluation only)")
        pair = load_domain_data(data.dataset)
        if data.pca_dim and pca is not None:
            pair = projected_pair(pair, pca, "fitted on the trained run's source")
        elif data.pca_dim:
            # in the setting's name: fit_source_pca, a library function, names its argument
            limit = min(pair.source.x.flatten(1).shape)
            if data.pca_dim > limit:
                raise KdmlError(f"data.pca_dim={data.pca_dim} exceeds {limit}, the smaller of "
                                f"the source's samples and features in {data.dataset}; lower "
                                "it")
            pair = fit_source_pca(pair, data.pca_dim)
        splits = dataclasses.replace(domain_splits(pair.source, pair.target),
                                     input_pca=pair.pca)
        return splits, splits
    check_pca_dataset(data)
    parts = open_dataset(data.dataset, data.root)
    dataset = parts.dataset
    if data.split == "standard" and parts.parts:
        data = settled_split_settings(data, None, f"{data.dataset} has a split of its own, "
                                      "which data.split=standard takes", new_run)
    elif data.split == "seen-holdout":
        data = settled_split_settings(data, SEEN_HOLDOUT, "the split is seen-holdout", new_run)
    else:
        data = settled_split_settings(data, CLASS_DISJOINT, "the split is class-disjoint",
                                      new_run)
    if isinstance(dataset, ImageFiles):
        dataset = dataset.resized(data.resize)

    def split(validation: float) -> DataSplits:
        return make_splits(dataset, parts.parts, data.split, data.train_classes,
                           data.holdout_fraction, parts.eval_ks, validation)

    trained = split(data.validation)
    return trained, split(0.0) if test_part and data.validation else trained


# The split settings, each with the one split that reads it.
CLASS_DISJOINT, SEEN_HOLDOUT = "class-disjoint", "seen-holdout"
SPLIT_SETTINGS = {"train_classes": CLASS_DISJOINT, "holdout_fraction": SEEN_HOLDOUT}


def check_pca_dataset(data: DataConfig) -> None:
    """Refuse ``data.pca_dim`` on a dataset that is no domain pair: the input basis is fitted
    on a pair's source alone."""
    if data.pca_dim and not is_domain_dataset(data.dataset):
        raise KdmlError("data.pca_dim applies to domain pairs (SOURCE->TARGET) only")


def unused_split_settings(data: DataConfig, split: str | None) -> list[str]:
    """The split settings of ``data`` changed from their defaults that ``split``, the split
    that applies (``None``: a dataset's own split or a domain pair's), does not read."""
    defaults = DataConfig()
    return [setting for setting, reader in SPLIT_SETTINGS.items()
            if reader != split and getattr(data, setting) != getattr(defaults, setting)]


def settled_split_settings(data: DataConfig, split: str | None, why: str, new_run: bool,
                           pair: bool = False) -> DataConfig:
    """``data`` with its :func:`unused_split_settings` reset to their defaults, or, for a
    ``new_run``, refused saying ``why`` the split does not read them: they had been ignored
    without a word while config.yaml recorded them (``pair``: a domain pair, which has no
    other split to set). A trained run's config (an older kdml's, or another dataset swapped in
    by ``--dataset``) can no longer change, and loses nothing the split read."""
    unused = unused_split_settings(data, split)
    if unused and new_run:
        setting = unused[0]
        reader = SPLIT_SETTINGS[setting]
        remedy = "drop it" if pair else f"drop it, or set data.split={reader}"
        raise KdmlError(f"data.{setting} applies to the {reader} split only, and {why}; "
                        f"{remedy}")
    defaults = DataConfig()
    return dataclasses.replace(data, **{setting: getattr(defaults, setting)
                                        for setting in unused})


def settled_pair_split(data: DataConfig, new_run: bool) -> DataConfig:
    """``data`` of a domain pair with ``data.split`` reset to its default, or, for a
    ``new_run``, refused where it is not the default: a pair has no split to choose (trained on
    its source, scored on its target), and the setting had been ignored without a word while
    config.yaml recorded it. A trained run's config can no longer change (as in
    :func:`settled_split_settings`)."""
    default = DataConfig().split
    if data.split == default:
        return data
    if new_run:
        raise KdmlError("data.split does not apply to a domain pair, trained on its source and "
                        "scored on its target; drop it")
    return dataclasses.replace(data, split=default)


def domain_splits(source: DmlDataset, target: DmlDataset) -> DataSplits:
    """Train on the labelled source (labels remapped to 0..C-1), score on the target."""
    classes, remapped = torch.unique(source.labels, return_inverse=True)
    return DataSplits(remapped_to_training(source, classes, remapped), target, classes.tolist(),
                      DOMAIN, target=target)
