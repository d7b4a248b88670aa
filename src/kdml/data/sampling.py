"""Class-balanced batches: m samples of each of a few classes per batch."""

from __future__ import annotations

import torch
from pytorch_metric_learning.samplers import MPerClassSampler
from torch.utils.data import BatchSampler, Sampler

from kdml.errors import KdmlError


def class_balanced_batches(
    labels: torch.Tensor, samples_per_class: int, batch_size: int
) -> BatchSampler:
    """Batches of ``batch_size`` holding ``samples_per_class`` samples from each of
    ``batch_size / samples_per_class`` classes, via PML's ``MPerClassSampler``.

    The sampler draws from NumPy's global generator, so call ``numpy.random.seed`` before each
    epoch (the trainer does) to make epochs repeatable and resumable.
    """
    check_batching(labels, samples_per_class, batch_size)
    sampler: Sampler[int] = MPerClassSampler(
        labels.numpy(), m=samples_per_class, batch_size=batch_size,
        length_before_new_iter=len(labels),
    )
    return BatchSampler(sampler, batch_size=batch_size, drop_last=True)


def check_batching(labels: torch.Tensor, samples_per_class: int, batch_size: int) -> None:
    """Refuse batch settings that the training split cannot fill (one-line errors)."""
    if batch_size > len(labels):
        raise KdmlError(f"data.batch_size={batch_size} is larger than the training split "
                        f"({len(labels)} samples); lower it")
    if not samples_per_class:
        return
    num_classes = int(labels.unique().numel())
    if batch_size % samples_per_class:
        raise KdmlError(
            f"batch_size={batch_size} must be a multiple of samples_per_class={samples_per_class}"
        )
    if batch_size // samples_per_class > num_classes:
        raise KdmlError(
            f"batch_size={batch_size} with samples_per_class={samples_per_class} needs "
            f"{batch_size // samples_per_class} classes but the training split has {num_classes}; "
            "lower batch_size or raise samples_per_class"
        )
