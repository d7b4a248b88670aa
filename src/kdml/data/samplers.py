"""Batch samplers seeded from (seed, epoch): plain shuffled batches, class-balanced m-per-class
batches, and the target-domain batches of the DTML recipes.

Each sampler yields lists of dataset indices and draws from its own ``torch.Generator``,
re-seeded by :meth:`set_epoch` from ``(seed, epoch)``. An epoch's batches therefore depend on
nothing but the seed and the epoch: not on earlier epochs, an interruption, the number of
loader workers, or the global generators. (PML's ``MPerClassSampler`` draws from a
module-level NumPy generator, which would have to be re-seeded globally each epoch; hence the
class-balanced sampler here.)
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

from kdml.checks import check_label_vector, is_count, is_positive_int
from kdml.data.splits import class_members
from kdml.errors import KdmlError
from kdml.seeding import derive_seed

# Stream keys of the samplers, so the source and target batches of an epoch are independent.
SOURCE_STREAM, TARGET_STREAM = 10, 11


class EpochBatches(Sampler[list[int]]):
    """Batches of sample indices that change with the epoch (``set_epoch``) and know how many
    they are (``len``), as the trainer's loaders need."""

    def set_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError


class _SeededBatches(EpochBatches):
    def __init__(self, seed: int, stream: int) -> None:
        self.seed, self.stream = seed, stream
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass the batches of ``epoch``."""
        self.epoch = epoch

    def generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(derive_seed(self.seed, self.epoch, self.stream))


class ShuffledBatches(_SeededBatches):
    """A random permutation cut into batches of ``batch_size``; the last partial batch is
    dropped (so every step sees the same batch size). ``batch_size = 0`` or at least ``N``
    gives one batch of all samples, in a random order.

    Example::

        >>> sampler = ShuffledBatches(num_samples=10, batch_size=4, seed=0)
        >>> sampler.set_epoch(1)
        >>> [len(batch) for batch in sampler]
        [4, 4]
    """

    def __init__(self, num_samples: int, batch_size: int, seed: int,
                 stream: int = SOURCE_STREAM) -> None:
        super().__init__(seed, stream)
        if num_samples == 0:
            raise KdmlError("cannot draw batches from an empty training split")
        if not is_positive_int(num_samples):  # 2.5 had failed in torch.randperm, unexplained
            raise KdmlError(f"ShuffledBatches: num_samples must be a whole number of samples, "
                            f"got {num_samples!r}")
        if not is_count(batch_size):  # False is 0 to Python, no batch size
            raise KdmlError(f"ShuffledBatches: batch_size must be a whole number of samples "
                            f"(0 for all of them), got {batch_size!r}")
        self.num_samples = num_samples
        self.batch_size = min(batch_size or num_samples, num_samples)

    def __len__(self) -> int:
        return self.num_samples // self.batch_size

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.num_samples, generator=self.generator()).tolist()
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            yield order[start:start + self.batch_size]


class ClassBalancedBatches(_SeededBatches):
    """Batches of ``batch_size / m`` distinct classes with ``m`` samples each.

    The sampling of PML's ``MPerClassSampler`` (and of Proxy-Anchor's and Roth et al.'s
    samplers): each batch draws its classes without replacement, then ``m`` samples of each
    class without replacement, or with replacement when the class has fewer than ``m``. An
    epoch has ``N // batch_size`` batches.

    Args:
        labels: ``[N]`` integer labels.
        samples_per_class: ``m``.
        batch_size: a multiple of ``m`` with ``batch_size / m`` at most the number of classes.
        seed: the run's seed.
    """

    def __init__(self, labels: torch.Tensor, samples_per_class: int, batch_size: int,
                 seed: int, stream: int = SOURCE_STREAM) -> None:
        super().__init__(seed, stream)
        check_label_vector("ClassBalancedBatches", labels)
        for name, value in (("samples_per_class", samples_per_class),
                            ("batch_size", batch_size)):
            if not is_positive_int(value):
                raise KdmlError(f"ClassBalancedBatches: {name} must be a positive integer, "
                                f"got {value!r}")
        check_batching(labels, samples_per_class, batch_size)
        self.samples_per_class, self.batch_size = samples_per_class, batch_size
        self.members = class_members(labels)
        self.num_batches = len(labels) // batch_size

    def __len__(self) -> int:
        return self.num_batches

    def __iter__(self) -> Iterator[list[int]]:
        generator = self.generator()
        m, classes_per_batch = self.samples_per_class, self.batch_size // self.samples_per_class
        for _ in range(self.num_batches):
            batch: list[int] = []
            for label in torch.randperm(len(self.members), generator=generator)[
                    :classes_per_batch].tolist():
                members = self.members[label]
                if len(members) >= m:
                    chosen = torch.randperm(len(members), generator=generator)[:m]
                else:
                    chosen = torch.randint(len(members), (m,), generator=generator)
                batch += members[chosen].tolist()
            yield batch


class TargetBatches(_SeededBatches):
    """For each source batch, a random subset of the target domain of the same size (drawn
    without replacement within the batch; the whole target when it is smaller).

    Args:
        num_target: the target domain's size.
        batch_sizes: the source batches' sizes, in order.
        seed: the run's seed.
    """

    def __init__(self, num_target: int, batch_sizes: list[int], seed: int) -> None:
        super().__init__(seed, TARGET_STREAM)
        if is_count(num_target) and num_target == 0:
            raise KdmlError("the target domain is empty")
        # 2.5 had failed in torch.randperm, unexplained; a batch size of -1 had drawn all but
        # one target sample (randperm(n)[:-1])
        if not is_positive_int(num_target):
            raise KdmlError(f"TargetBatches: num_target must be a whole number of samples, got "
                            f"{num_target!r}")
        if not isinstance(batch_sizes, list | tuple) or not all(
                is_positive_int(size) for size in batch_sizes):
            raise KdmlError(f"TargetBatches: batch_sizes must be a list of positive integers, "
                            f"got {batch_sizes!r}")
        self.num_target, self.batch_sizes = num_target, list(batch_sizes)

    def __len__(self) -> int:
        return len(self.batch_sizes)

    def __iter__(self) -> Iterator[list[int]]:
        generator = self.generator()
        for size in self.batch_sizes:
            yield torch.randperm(self.num_target, generator=generator)[:size].tolist()


def check_batching(labels: torch.Tensor, samples_per_class: int, batch_size: int) -> None:
    """Refuse batch settings that the training split cannot fill (one-line errors)."""
    if batch_size > len(labels):
        raise KdmlError(f"data.batch_size={batch_size} is larger than the training split "
                        f"({len(labels)} samples); lower it")
    if not samples_per_class:
        return
    num_classes = int(labels.unique().numel())
    if batch_size % samples_per_class:
        raise KdmlError(f"data.batch_size={batch_size} must be a multiple of "
                        f"data.samples_per_class={samples_per_class}; set one of them so")
    if batch_size // samples_per_class > num_classes:
        raise KdmlError(
            f"data.batch_size={batch_size} with data.samples_per_class={samples_per_class} "
            f"needs {batch_size // samples_per_class} classes but the training split has "
            f"{num_classes}; lower data.batch_size or raise data.samples_per_class"
        )


class RankShare(EpochBatches):
    """This rank's share of each global batch of ``batches``: the ``rank``-th of ``world``
    equal, contiguous slices, so the ranks' shares concatenated in rank order are the global
    batch. Every rank draws the same global batches (the same seeded sampler), so no
    communication is needed.

    Example::

        >>> global_batches = ShuffledBatches(num_samples=12, batch_size=6, seed=0)
        >>> [len(b) for b in RankShare(global_batches, rank=1, world=3)]
        [2, 2]
    """

    def __init__(self, batches: EpochBatches, rank: int, world: int) -> None:
        # a world of 0 had raised ZeroDivisionError at the first batch, a rank outside it
        # yielded empty shares, silently
        if not is_positive_int(world):
            raise KdmlError(f"RankShare: world must be a positive integer (the number of "
                            f"processes), got {world!r}")
        if not is_count(rank) or rank >= world:
            raise KdmlError(f"RankShare: rank must be an integer from 0 to world - 1 = "
                            f"{world - 1}, got {rank!r}")
        self.batches, self.rank, self.world = batches, rank, world

    def set_epoch(self, epoch: int) -> None:
        self.batches.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches:
            if len(batch) % self.world:
                raise KdmlError(f"a global batch of {len(batch)} does not split into "
                                f"{self.world} equal shares; make data.batch_size a multiple "
                                "of the number of processes")
            share = len(batch) // self.world
            yield batch[self.rank * share:(self.rank + 1) * share]
