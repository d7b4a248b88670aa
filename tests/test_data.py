import numpy as np
import pytest
import torch

from kdml.data import class_balanced_batches, class_disjoint_split, load_dataset, seen_holdout_split
from kdml.errors import KdmlError


@pytest.mark.parametrize(("name", "shape", "count"), [
    ("digits", (1, 8, 8), 1797), ("mnist5k", (1, 28, 28), 5000), ("mnist1d", (40,), 5000),
])
def test_offline_datasets(name, shape, count):
    dataset = load_dataset(name)
    assert dataset.input_shape == shape
    assert len(dataset) == count
    assert dataset.num_classes == 10
    assert dataset.x.dtype == torch.float32 and dataset.y.dtype == torch.int64
    assert torch.isfinite(dataset.x).all()
    assert dataset.description


def test_unknown_dataset_lists_names():
    with pytest.raises(KdmlError, match="mnist5k"):
        load_dataset("cub")


def test_class_disjoint_split_uses_first_half_of_sorted_classes():
    labels = torch.tensor([7, 3, 5, 3, 9, 1, 7, 5])
    train, test = class_disjoint_split(labels)
    assert set(labels[train].tolist()) == {1, 3}
    assert set(labels[test].tolist()) == {5, 7, 9}
    assert sorted(train.tolist() + test.tolist()) == list(range(len(labels)))
    train, test = class_disjoint_split(labels, train_classes=4)
    assert set(labels[test].tolist()) == {9}


@pytest.mark.parametrize("value", [0, 1.5, 5, 0.0])
def test_class_disjoint_split_rejects_bad_counts(value):
    with pytest.raises(KdmlError):
        class_disjoint_split(torch.tensor([0, 1, 2, 3, 4]), value)


def test_seen_holdout_split_keeps_every_class_on_both_sides():
    labels = torch.arange(5).repeat_interleave(torch.tensor([2, 3, 10, 1, 4]))
    kept, held = seen_holdout_split(labels, 0.3, seed=1)
    assert sorted(kept.tolist() + held.tolist()) == list(range(len(labels)))
    assert set(labels[held].tolist()) == {0, 1, 2, 4}  # the lone sample of class 3 stays kept
    assert set(labels[kept].tolist()) == {0, 1, 2, 3, 4}
    assert (labels[held] == 2).sum() == 3
    again, _ = seen_holdout_split(labels, 0.3, seed=1)
    assert torch.equal(kept, again)


def test_class_balanced_batches():
    labels = torch.arange(6).repeat_interleave(10)
    np.random.seed(0)
    batches = list(class_balanced_batches(labels, samples_per_class=4, batch_size=12))
    assert len(batches) == 5
    for batch in batches:
        counts = torch.bincount(labels[torch.tensor(batch)], minlength=6)
        assert sorted(counts[counts > 0].tolist()) == [4, 4, 4]
    with pytest.raises(KdmlError, match="multiple"):
        class_balanced_batches(labels, 4, 10)
    with pytest.raises(KdmlError, match="classes"):
        class_balanced_batches(labels, 2, 20)
