"""Atlas (Korman) beyond its formulas, as a fuzzing session found it mishandled (the
formulas themselves agreed with literal float64 loops and the authors' code): the chart NMI
scored with more clusters than allocate_clusters promises, a NaN distance read as a chart
boundary by the batch-all triplet loss, a column of labels taken, NT-Xent temperatures below
float32's range taken, and bad arguments that gave tracebacks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kdml.errors import KdmlError
from kdml.evaluation.charts import allocate_clusters, piecewise_linear_accuracy
from kdml.losses.nt_xent import nt_xent_loss
from kdml.regularizers.manifold import ManifoldMMD
from kdml.training.recipes.atlas import SimCLRParams, batch_all_triplet_loss

# ----------------------------------------------------------------- chart NMI clusters


@pytest.mark.parametrize(("sizes", "num_clusters"), [
    ([1, 1, 98], 10),  # floors 0, 0, 9: raising the small charts to 1 gave 11 clusters
    # the charts of a 2-epoch mtriplet run on digits (5 test classes): 9 clusters, not 7
    ([30, 5, 47, 34, 555, 221, 4], 5),
    ([7, 40, 10, 2], 5),
])
def test_allocate_clusters_total_is_max_of_clusters_and_charts_for_skewed_charts(
        sizes, num_clusters):
    # docstring: "The total is max(K, number of charts) (capped at N)"
    allocation = allocate_clusters(sizes, num_clusters)
    assert (allocation >= 1).all() and (allocation <= np.asarray(sizes)).all()
    assert allocation.sum() == min(max(num_clusters, len(sizes)), sum(sizes))


# ----------------------------------------------------------------- batch-all triplet loss


def _reference_batch_all(distances: np.ndarray, labels: np.ndarray, margin: float) -> float:
    losses = [max(0.0, distances[a, p] - distances[a, n] + margin)
              for a in range(len(labels)) for p in range(len(labels))
              for n in range(len(labels))
              if a != p and labels[a] == labels[p] and labels[n] != labels[a]]
    return sum(losses) / len(losses)


def test_batch_all_triplet_loss_column_labels_are_refused_or_read_as_a_vector():
    # labels documented as (B,); a (B, 1) column (a common shape) broadcast into a
    # (B, B, B) "same class" mask and gave another number without any error
    rng = np.random.default_rng(0)
    distances = rng.random((6, 6))
    distances = (distances + distances.T) / 2
    np.fill_diagonal(distances, 0.0)
    labels = np.array([0, 0, 1, 1, 2, 2])
    expected = _reference_batch_all(distances, labels, 0.2)
    loss, _ = batch_all_triplet_loss(torch.tensor(distances), torch.tensor(labels), 0.2)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    try:
        column, _ = batch_all_triplet_loss(torch.tensor(distances),
                                           torch.tensor(labels)[:, None], 0.2)
    except KdmlError:
        return
    assert column.item() == pytest.approx(expected, rel=1e-12)


def test_batch_all_triplet_loss_nan_distance_is_not_an_infinite_positive():
    # a NaN positive distance (NaN embeddings) was counted as +inf, left out, and the loss
    # read 0: a diverged triplet baseline reported a perfect, finite loss
    distances = torch.full((4, 4), float("nan"))
    labels = torch.tensor([0, 0, 1, 1])
    loss, stats = batch_all_triplet_loss(distances, labels, 0.2)
    assert stats["infinite_positives"].item() == 0
    assert torch.isnan(loss)


# ----------------------------------------------------------------- bad inputs


def test_manifold_mmd_forward_refuses_a_generator_that_is_not_one():
    # the constructor refuses it in one line; forward raised AttributeError ('int' object
    # has no attribute 'device')
    mmd = ManifoldMMD(2, 3)
    coords, q = torch.randn(4, 3, 2), torch.softmax(torch.randn(4, 3), dim=1)
    with pytest.raises(KdmlError, match="generator"):
        mmd(coords, q, generator=0)


@pytest.mark.parametrize("max_iter", [-1, 1.5])
def test_piecewise_linear_accuracy_refuses_bad_max_iter_in_one_line(max_iter):
    # a raw sklearn InvalidParameterError came out of the first logistic fit
    rng = np.random.default_rng(0)
    codes = rng.standard_normal((20, 2))
    charts, labels = np.arange(20) % 2, (np.arange(20) // 2) % 2
    with pytest.raises(KdmlError, match="max_iter"):
        piecewise_linear_accuracy(codes, charts, labels, codes, charts, labels,
                                  max_iter=max_iter)


@pytest.mark.parametrize("temperature", [3e-39, 1e-40])
def test_nt_xent_tiny_temperature_is_refused_or_finite(temperature):
    # a finite temperature > 0 passes the check, but below float32's range the logits
    # overflow and the loss is inf or NaN
    projections = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    try:
        loss = nt_xent_loss(projections, temperature)
    except KdmlError:
        return
    assert torch.isfinite(loss)


def test_simclr_params_refuse_a_temperature_the_loss_cannot_use():
    # method.tau=1e-40 passed validation; training then stopped at step 1 with "the 'nt_xent'
    # term became NaN ... Lower the learning rates or the regularizer weight"
    with pytest.raises(KdmlError, match="tau"):
        SimCLRParams(tau=1e-40).validate()
