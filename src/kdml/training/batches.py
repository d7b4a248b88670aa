"""The training split's batches, epoch by epoch: sampled from (seed, epoch), decoded in the
loader's workers, shared over torchrun's processes."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator

import torch
from torch.utils.data import DataLoader

from kdml.config import RunConfig
from kdml.data.dataset import Batch
from kdml.data.loaders import batch_loader, readable_batches, resolve_num_workers
from kdml.data.samplers import (
    ClassBalancedBatches,
    EpochBatches,
    RankShare,
    ShuffledBatches,
    TargetBatches,
)
from kdml.data.splits import DataSplits
from kdml.distributed import World
from kdml.errors import KdmlError, counted
from kdml.training.checks import resumed_batch_remedy

logger = logging.getLogger("kdml.data")  # beside the loader's "skipping unreadable image" lines


class TrainingBatches:
    """The training split's batches, epoch by epoch, with a target batch for each when the
    method uses a target domain. Sampling is seeded from (seed, epoch) and decoding happens in
    the loader's workers. ``drawn=False`` (a method fitted in closed form, which reads every
    training sample once instead) draws plain batches, whatever ``data.samples_per_class``.
    ``resumed``: a run resumed from a checkpoint, whose data.batch_size --resume keeps, so a
    batch the processes cannot share is mended by their number instead."""

    def __init__(self, config: RunConfig, splits: DataSplits, uses_target: bool,
                 device: torch.device, world: World | None = None, drawn: bool = True,
                 resumed: bool = False) -> None:
        data, seed, world = config.data, config.train.seed, world or World()
        train = splits.train
        global_batches: ShuffledBatches | ClassBalancedBatches
        if data.batch_size and data.samples_per_class and drawn:
            global_batches = ClassBalancedBatches(train.labels, data.samples_per_class,
                                                  data.batch_size, seed)
        else:
            global_batches = ShuffledBatches(len(train), data.batch_size, seed)
        self.batch_size = global_batches.batch_size  # the global batch
        # the whole split as one batch (data.batch_size 0, or beyond the split's size); a
        # method fitted in closed form reads the split otherwise, in no such batches
        if drawn and world.is_distributed and self.batch_size % world.size:
            if data.batch_size == 0 or resumed:  # a resumed run keeps its data.batch_size
                remedy = (resumed_batch_remedy(self.batch_size, world.size) if resumed else
                          f"set data.batch_size to a multiple of {world.size}")
                raise KdmlError(f"data.batch_size={data.batch_size} makes the whole training "
                                f"split ({self.batch_size:,} samples) one global batch, which "
                                f"does not split evenly over the {world.size} processes; "
                                f"{remedy}")
            raise KdmlError(f"data.batch_size={data.batch_size} is more than the training "
                            f"split's {self.batch_size:,} samples, so every step takes all of "
                            f"them, and they do not split evenly over the {world.size} "
                            f"processes; lower data.batch_size to a multiple of {world.size} "
                            f"of at most {self.batch_size:,}")
        # Under torchrun every rank draws the same global batches and loads its share.
        self.sampler: EpochBatches = (RankShare(global_batches, world.rank, world.size)
                                      if world.is_distributed else global_batches)
        self.dataset, self.on_bad_image = train, data.on_bad_image
        self.skipped_logged: set[str] = set()  # unreadable files said once for all epochs
        # data.on_bad_image=skip: the training positions found unreadable so far, by class, to
        # say once of a class all of whose images are (the test side refuses such a part;
        # training goes on with the other classes, which only the per-file lines had shown)
        self.unreadable_by_class: dict[int, set[int]] = {}
        self.class_sizes: dict[int, int] | None = None
        # samples drawn and trained on in the epoch so far: their difference is what
        # data.on_bad_image=skip left out (unreadable images, and a batch left with one)
        self.drawn = self.trained = 0
        self.max_steps = config.train.steps_per_epoch
        pin = device.type == "cuda"
        self.loader = batch_loader(train, self.sampler, resolve_num_workers(data.num_workers,
                                                                            train),
                                   pin_memory=pin, persistent=True)
        self.target_sampler: EpochBatches | None = None
        self.target_loader: DataLoader | None = None
        if uses_target:
            if splits.target is None:
                raise KdmlError("this recipe needs a target domain: set data.dataset to a "
                                "domain pair such as mnist5k->digits")
            num_target = len(splits.target)
            if world.is_distributed and min(num_target, self.batch_size) % world.size:
                # a target smaller than the global batch is taken whole at every step
                remedy = (resumed_batch_remedy(num_target, world.size, self.batch_size)
                          if resumed else f"lower data.batch_size to a multiple of "
                          f"{world.size} of at most {num_target:,}")
                if num_target < world.size:  # no such multiple: fewer processes, or more data
                    remedy = (f"train it in at most {counted(num_target, 'process', 'processes')}"
                              " (torchrun's --nproc_per_node times --nnodes), or give the "
                              "target domain more samples")
                raise KdmlError(f"the target domain of {splits.target.name} has "
                                f"{counted(num_target, 'sample')}, fewer than the global "
                                f"batch of {self.batch_size}, so every step takes all of them, "
                                f"and they do not split evenly over the {world.size} "
                                f"processes; {remedy}")
            target_sampler: EpochBatches = TargetBatches(
                num_target, [self.batch_size] * len(self.sampler), seed)
            if world.is_distributed:
                target_sampler = RankShare(target_sampler, world.rank, world.size)
            self.target_sampler = target_sampler
            self.target_loader = batch_loader(
                splits.target, target_sampler,
                resolve_num_workers(data.num_workers, splits.target), pin_memory=pin)

    @property
    def left_out(self) -> int:
        """The training samples of the epoch so far that data.on_bad_image=skip left out: the
        unreadable images drawn (an image drawn twice counts twice) and the readable one of a
        batch left with a single sample. A batch that skips images trains on fewer."""
        return self.drawn - self.trained

    def _drawn(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        for batch in batches:  # counted on the host: the loader's tensors, no device sync
            self.drawn += len(batch.labels)
            yield batch

    def _note_unreadable(self, batch: Batch) -> None:
        """Record the batch's unreadable training images (``batch`` as loaded, its files just
        logged as skipped), and warn, once, of each class that they leave without a single
        readable image: the run trains without that class."""
        if self.class_sizes is None:
            classes, sizes = self.dataset.labels.unique(return_counts=True)
            self.class_sizes = dict(zip(classes.tolist(), sizes.tolist(), strict=True))
        lost = []
        for index, label in zip(batch.indices[batch.unreadable].tolist(),
                                batch.labels[batch.unreadable].tolist(), strict=True):
            found = self.unreadable_by_class.setdefault(label, set())
            if index not in found:
                found.add(index)
                if len(found) == self.class_sizes[label]:
                    lost.append(label)
        for label in lost:
            name = self.dataset.class_name(label)
            gone = sum(len(found) == self.class_sizes[other]
                       for other, found in self.unreadable_by_class.items())
            logger.warning("every one of the %s of training class %s is unreadable "
                           "(data.on_bad_image=skip): the run trains without it, on the "
                           "other %s", counted(self.class_sizes[label], "image"),
                           repr(name) if name is not None else label,
                           counted(len(self.class_sizes) - gone, "class", "classes"))

    def _trained(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        for batch in batches:
            self.trained += len(batch.labels)
            yield batch

    def __len__(self) -> int:
        return min(len(self.sampler), self.max_steps or len(self.sampler))

    def epoch(self, epoch: int) -> Iterator[tuple[Batch, Batch | None]]:
        self.sampler.set_epoch(epoch)
        self.drawn = self.trained = 0
        source = self._trained(readable_batches(self._drawn(self.loader), self.dataset,
                                                self.on_bad_image, self.skipped_logged,
                                                min_size=2, on_skip=self._note_unreadable))
        if self.target_loader is None or self.target_sampler is None:
            pairs: Iterator[tuple[Batch, Batch | None]] = ((batch, None) for batch in source)
        else:
            self.target_sampler.set_epoch(epoch)
            # not strict: skipped unreadable images can leave the source a batch short
            pairs = zip(source, self.target_loader, strict=False)
        yield from itertools.islice(pairs, len(self))
