"""Retrieval over disjoint parts of the test set, the protocol of Chu et al. 2020, Table 2.

The paper divides the CUB and Cars test sets "into ten disjoint smaller sets, with each smaller
set contains examples from all the classes", scores retrieval within each part and reports the
mean with a 95% confidence interval. :func:`stratified_parts` deals every class's samples, in a
seeded random order, round-robin into the parts, so each part holds every class and the part
sizes of a class differ by at most one.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

from kdml.checks import check_seed, is_positive_int
from kdml.errors import KdmlError, counted
from kdml.evaluation.estimate import Estimate
from kdml.evaluation.knn import Metric, as_float_matrix
from kdml.evaluation.labels import as_label_vector
from kdml.evaluation.retrieval import retrieval_metrics


def stratified_parts(labels: np.ndarray, num_parts: int, seed: int = 0) -> list[np.ndarray]:
    """Sample indices of ``num_parts`` disjoint parts that each hold every class.

    Args:
        labels: ``[N]`` class labels.
        num_parts: how many parts (10 in the paper).
        seed: seeds the order in which each class's samples are dealt.

    Returns:
        ``num_parts`` sorted index arrays that together cover ``range(N)`` once.
    """
    labels = np.asarray(labels)
    check_seed(seed)
    if not is_positive_int(num_parts):  # 2.5 had raised Python's TypeError, True made 1 part
        raise KdmlError(f"the number of test parts must be an integer of at least 1, got "
                        f"{num_parts!r}")
    if labels.ndim != 1 or not labels.size:
        # 2-D labels had given positions past N, empty ones a ValueError of np.concatenate
        raise KdmlError(f"labels must be [N], one per sample, at least one, got shape "
                        f"{labels.shape}")
    if labels.dtype.kind in "fc" and np.isnan(labels).any():
        # NaN equals no label: its samples had been left out of every part, silently
        raise KdmlError("labels hold NaN, which is no class; give every sample a class")
    classes, counts = np.unique(labels, return_counts=True)
    # Two samples per class and part, so every query of a part has a relevant neighbour.
    too_small = classes[counts < 2 * num_parts]
    if len(too_small):
        raise KdmlError(
            f"{counted(len(too_small), 'test class', 'test classes')} "
            f"{'has' if len(too_small) == 1 else 'have'} fewer than {2 * num_parts} samples "
            f"(e.g. class {too_small[0]}), too few for {num_parts} parts that each hold every "
            "class at least twice; use fewer parts")
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(num_parts)]
    for label in classes:
        members = rng.permutation(np.flatnonzero(labels == label))
        for part in range(num_parts):
            parts[part].append(members[part::num_parts])
    return [np.sort(np.concatenate(chosen)) for chosen in parts]


def retrieval_over_parts(vectors: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor,
                         ks: Sequence[int], num_parts: int = 10, metric: Metric = "cosine",
                         seed: int = 0) -> dict[str, Estimate]:
    """Recall@K, MAP@R and R-Precision scored within each part (leave-one-out), as
    :class:`~kdml.evaluation.estimate.Estimate` over the parts.

    Args:
        vectors: ``[N, d]`` test embeddings.
        labels: ``[N]`` their classes.
        ks: the K of Recall@K.
        num_parts: parts of :func:`stratified_parts`.
        metric: ``"cosine"`` or ``"euclidean"``.
        seed: seeds the parts.
    """
    if isinstance(num_parts, bool) or not isinstance(num_parts, numbers.Integral) or num_parts < 2:
        raise KdmlError(f"num_parts must be an integer of at least 2 (an interval over the parts "
                        f"needs two), got {num_parts!r}; for one part use retrieval_metrics")
    if not isinstance(vectors, torch.Tensor):
        vectors = as_float_matrix(vectors, "vectors")
    if vectors.ndim != 2:
        raise KdmlError(f"vectors must be 2-D (N, D), got shape {tuple(vectors.shape)}")
    # the labels' length is checked here: an index past a shorter label array would score only
    # its first rows, silently
    label_array = as_label_vector(labels, "labels", len(vectors), vectors.shape[1])
    per_part: dict[str, list[float]] = {}
    for indices in stratified_parts(label_array, num_parts, seed):
        rows = torch.as_tensor(indices) if isinstance(vectors, torch.Tensor) else indices
        scores = retrieval_metrics(vectors[rows], label_array[indices], ks=ks, metric=metric,
                                   nmi=False)
        for name, value in scores.items():
            per_part.setdefault(name, []).append(value)
    return {name: Estimate.of(values) for name, values in per_part.items()}
