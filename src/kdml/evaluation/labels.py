"""Class labels as the metrics take them: integers, one per embedding row, checked with an error
that says what is wrong (and spots embeddings passed transposed)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kdml.checks import check_has_values
from kdml.errors import KdmlError


def transposed_hint(length: int, expected_length: int, width: int | None) -> str:
    """A hint for labels whose length is the embeddings' width, not their number of rows."""
    if width is not None and length == width != expected_length:
        return (f"; the embeddings, [{expected_length}, {width}], look transposed: pass them as "
                f"[N, D]")
    return ""


def as_label_vector(labels: Any, name: str, expected_length: int,
                    width: int | None = None) -> np.ndarray:
    """Validate integer class labels of shape ``(expected_length,)``; return them as int64.
    Bool labels are the classes 0 and 1, as the losses and regularizers take them (and
    pytorch-metric-learning's losses and AccuracyCalculator). ``width``, the embeddings'
    dimension, lets the error spot transposed embeddings."""
    if isinstance(labels, torch.Tensor):
        if labels.is_floating_point() or labels.is_complex():
            raise KdmlError(f"{name} must be integers, got dtype {labels.dtype}")
        check_has_values(name, labels)
        array = labels.detach().cpu().numpy()
    else:
        array = np.asarray(labels)
        if array.dtype.kind not in "iub":
            raise KdmlError(f"{name} must be integers, got dtype {array.dtype}")
    if array.ndim != 1 or len(array) != expected_length:
        hint = transposed_hint(len(array), expected_length, width) if array.ndim == 1 else ""
        raise KdmlError(f"{name} must have shape ({expected_length},) to match the embeddings, "
                        f"got {tuple(array.shape)}{hint}")
    # uint64 beyond int64 would wrap to negatives and could equal another set's labels
    if array.dtype == np.uint64 and array.size and array.max() > np.iinfo(np.int64).max:
        raise KdmlError(f"{name} holds {array.max()}, beyond int64: renumber the classes "
                        "(e.g. with numpy.unique(..., return_inverse=True))")
    return array.astype(np.int64, copy=False)
