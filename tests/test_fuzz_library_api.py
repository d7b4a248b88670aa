"""kdml used as a library beside pytorch-metric-learning, as a fuzzing session found it
mishandled: queries that are rows of the reference's own memory, ``exclude_self`` with a
reference that is not the queries, a ManifoldMMD prior sample outside [0, 1]^d, a recipe's
parameters given as a dict, and AM-Softmax cosines without a class."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from kdml.errors import KdmlError
from kdml.evaluation import knn_search, retrieval_metrics
from kdml.losses import am_softmax_loss
from kdml.regularizers import ManifoldMMD


def _random_set(num=200, dim=16, classes=10):
    rng = np.random.default_rng(0)
    return rng.standard_normal((num, dim)), rng.integers(0, classes, num)


@pytest.mark.parametrize("kind", ["array", "tensor"])
def test_queries_that_are_rows_of_the_reference_are_refused(kind):
    """``retrieval_metrics(x[:100], y[:100], reference=x, reference_labels=y)``: every query
    is in the reference (the same memory), retrieves itself first and scored Recall@1 = 1.0 on
    random data (0.12 leave-one-out), with no error or warning; the whole query set as a view
    of itself was refused already. Even rows against odd rows share no row: scored."""
    embeddings, labels = _random_set()
    if kind == "tensor":
        embeddings, labels = torch.from_numpy(embeddings), torch.from_numpy(labels)
    for queries, query_labels in ((embeddings[:100], labels[:100]),
                                  (embeddings[::2], labels[::2]),
                                  (embeddings[150:], labels[150:])):
        with pytest.raises(KdmlError) as refused:
            retrieval_metrics(queries, query_labels, reference=embeddings,
                              reference_labels=labels, ks=(1,), nmi=False)
        assert str(refused.value) == (
            "some queries are rows of reference (the same memory), where each would retrieve "
            "itself; leave reference and reference_labels out to search the whole set "
            "leave-one-out, or give a reference without the queries")
    scores = retrieval_metrics(embeddings[::2], labels[::2], reference=embeddings[1::2],
                               reference_labels=labels[1::2], ks=(1,), nmi=False)
    assert scores["recall@1"] < 0.5


def test_exclude_self_with_a_reference_that_is_not_the_queries_is_refused():
    """``exclude_self`` needs the reference to be the queries; only the row counts were
    checked, so a different reference of as many rows lost each query's true nearest
    neighbour (row i) silently."""
    rng = np.random.default_rng(0)
    queries = rng.standard_normal((5, 3))
    reference = queries + 0.01 * rng.standard_normal((5, 3))  # row i nearest to query i
    with pytest.raises(KdmlError, match="exclude_self needs the reference to be the queries, "
                                        "but it holds other values"):
        list(knn_search(queries, reference, k=1, exclude_self=True))
    # the queries themselves (an equal copy, too) are what exclude_self means
    for same in (queries, queries.copy()):
        found = np.concatenate([c.indices for c in knn_search(queries, same, k=1,
                                                              exclude_self=True)]).ravel()
        assert (found != np.arange(5)).all()


@pytest.mark.parametrize("prior", [
    lambda: torch.randn(8, 4),  # a normal sample, not a uniform one on [0, 1]^d
    lambda: torch.ones(8, 4, dtype=torch.long),  # integers
], ids=["outside [0, 1]", "integer"])
def test_a_manifold_mmd_prior_sample_outside_the_unit_cube_is_refused(prior):
    """The prior sample must be uniform on [0, 1]^d; values outside were clamped to
    [eps, 1 - eps] silently and gave an MMD to a different distribution."""
    coords = torch.randn(8, 4)
    with pytest.raises(KdmlError, match="prior_sample must be a"):
        ManifoldMMD(4, 1)(coords, prior_sample=prior())
    # a uniform sample, its edges included, is taken
    assert torch.isfinite(ManifoldMMD(4, 1)(coords, prior_sample=torch.rand(8, 4).clamp(
        0.0, 1.0).index_fill(0, torch.tensor([0]), 1.0)))


def test_jrd_parameters_as_a_dict_are_refused_in_one_line():
    """``JRDMethod.from_params(..., params={"alpha": 0.5})`` raised "AttributeError: 'dict'
    object has no attribute 'validate'"."""
    from kdml.training.recipes.jrd import JRDMethod

    backbone = nn.Sequential(nn.Flatten(), nn.Linear(16, 8))
    backbone.feature_size = 8
    with pytest.raises(KdmlError) as refused:
        JRDMethod.from_params(backbone, 4, 3, params={"alpha": 0.5})
    assert str(refused.value) == (
        "JRDMethod.from_params: params must be a JRDParams instance, got a dict; build one "
        "with its settings as keywords, e.g. JRDParams(**settings)")
    from kdml.training.recipes.jrd import JRDParams

    with pytest.raises(KdmlError, match="got the class JRDParams itself"):
        JRDMethod.from_params(backbone, 4, 3, params=JRDParams)


def test_am_softmax_cosines_without_a_class_are_refused_in_one_line():
    """Cosines of shape [M, 0] gave "labels must be class indices in [0, 0) ... number the
    classes 0 to -1"."""
    with pytest.raises(KdmlError) as refused:
        am_softmax_loss(torch.rand(2, 0), torch.tensor([0, 1]), 20.0, 0.1)
    assert str(refused.value) == ("am_softmax_loss got cosines of no class ([M, 0]): give one "
                                  "column per class")


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
def test_am_softmax_takes_unsigned_labels_as_the_regularizers_do(dtype):
    """``torch.from_numpy`` of a uint32 label array: the regularizers and pair losses take it,
    but the class-range check read ``labels.min()``, which torch does not implement for these
    dtypes ("NotImplementedError: "min_all" not implemented for 'UInt32'"), in AM-Softmax and
    so in JRDMethod."""
    cosines = torch.tensor([[0.5, 0.3], [0.1, 0.4]])
    expected = am_softmax_loss(cosines, torch.tensor([0, 1]), 20.0, 0.1)
    got = am_softmax_loss(cosines, torch.tensor([0, 1]).to(dtype), 20.0, 0.1)
    assert torch.equal(got, expected)


@pytest.mark.parametrize(("x_dtype", "y_dtype"), [
    (torch.float16, torch.float16), (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float64)], ids=["float16", "bfloat16", "float32 and float64"])
def test_l1_distances_take_the_dtypes_squared_distances_take(x_dtype, y_dtype):
    """``kdml.kernels.l1_distances`` is public beside ``squared_distances``, which computes in
    float32 or wider and promotes a float32 / float64 pair; it passed them to torch.cdist,
    which raised "NotImplementedError: "cdist" not implemented for 'Half'" and "RuntimeError:
    expected scalar type Float but found Double"."""
    from kdml.kernels import l1_distances, squared_distances

    x, y = torch.randn(4, 3), torch.randn(5, 3)
    assert squared_distances(x.to(x_dtype), y.to(y_dtype)).shape == (4, 5)
    got = l1_distances(x.to(x_dtype), y.to(y_dtype))
    expected = torch.cdist(x.to(x_dtype).double(), y.to(y_dtype).double(), p=1.0)
    torch.testing.assert_close(got.double(), expected, rtol=1e-6, atol=1e-6)
