"""Train/test splits used in deep metric learning."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdml.data.dataset import ArrayDataset
from kdml.errors import KdmlError


@dataclass
class DataSplits:
    """What the trainer trains on and the evaluator scores.

    ``train`` labels are remapped to 0..C-1 (``train_classes`` maps them back); ``test`` keeps
    the dataset's labels. For a domain pair, ``train`` is the labelled source, ``target`` the
    target samples whose labels the method never sees, and ``test`` the same target samples
    with their labels, for evaluation only.
    """

    train: ArrayDataset
    test: ArrayDataset
    train_classes: list[int]
    target: ArrayDataset | None = None
    kind: str = "class-disjoint"  # class-disjoint | seen-holdout | domain


def class_disjoint_split(
    labels: torch.Tensor, train_classes: float | int = 0.5
) -> tuple[torch.Tensor, torch.Tensor]:
    """Split by class, as in DML benchmarks (CUB: classes 1-100 train, 101-200 test).

    The sorted classes are cut in two: the first ``train_classes`` go to training and the rest to
    testing, so test classes are never seen in training.

    Args:
        labels: integer labels, shape [N].
        train_classes: a fraction in (0, 1) of the classes, or a count >= 1.

    Returns:
        ``(train_indices, test_indices)``, each a sorted long tensor.
    """
    classes = labels.unique(sorted=True)
    num_train = _num_train_classes(classes.numel(), train_classes)
    is_train = torch.isin(labels, classes[:num_train])
    return is_train.nonzero().squeeze(1), (~is_train).nonzero().squeeze(1)


def seen_holdout_split(
    labels: torch.Tensor, holdout_fraction: float = 0.2, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Hold out a fraction of every class's samples: both parts contain the same (seen) classes.

    Each class keeps at least one sample on each side when it has two or more.

    Returns:
        ``(kept_indices, held_out_indices)``, each sorted.
    """
    if not 0.0 < holdout_fraction < 1.0:
        raise KdmlError(f"holdout_fraction must be in (0, 1), got {holdout_fraction}")
    generator = torch.Generator().manual_seed(seed)
    held_out = []
    for label in labels.unique(sorted=True):
        members = (labels == label).nonzero().squeeze(1)
        members = members[torch.randperm(members.numel(), generator=generator)]
        count = int(round(holdout_fraction * members.numel()))
        count = min(max(count, 1), members.numel() - 1) if members.numel() > 1 else 0
        held_out.append(members[:count])
    held_out_idx = torch.cat(held_out).sort().values
    is_held = torch.zeros_like(labels, dtype=torch.bool)
    is_held[held_out_idx] = True
    return (~is_held).nonzero().squeeze(1), held_out_idx


def _num_train_classes(num_classes: int, train_classes: float | int) -> int:
    if num_classes < 2:
        raise KdmlError(f"a class-disjoint split needs at least 2 classes, got {num_classes}")
    if isinstance(train_classes, float) and 0.0 < train_classes < 1.0:
        count = int(round(train_classes * num_classes))
    elif float(train_classes).is_integer() and train_classes >= 1:
        count = int(train_classes)
    else:
        raise KdmlError(
            f"train_classes must be a fraction in (0, 1) or a class count, got {train_classes}"
        )
    if not 1 <= count < num_classes:
        raise KdmlError(
            f"train_classes={train_classes} leaves {count} of {num_classes} classes for training; "
            "both sides need at least one class"
        )
    return count
