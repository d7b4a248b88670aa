"""Explicit random streams derived from (seed, epoch, step, rank).

Nothing in a training step draws from torch's or NumPy's global generators: samplers,
augmentations and prior samples each take a generator seeded from the run's seed and their
position in the run, so an epoch is the same whether or not the run was interrupted before it,
and whatever the number of data-loading workers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NamedTuple, TypeVar

import numpy as np
import torch

from kdml.checks import check_seed
from kdml.errors import KdmlError

T = TypeVar("T")

# The largest seed torch's manual_seed takes (NumPy's SeedSequence takes any).
MAX_TORCH_SEED = 2**64 - 1

# Named streams of one step, so that e.g. changing the augmentation does not change the prior
# samples of the same step.
AUGMENT, METHOD = 0, 1


def torch_seed(seed: int, name: str = "seed") -> int:
    """``seed`` as torch's ``manual_seed`` takes it: a Python int from 0 to 2**64 - 1.

    torch refuses a NumPy integer ("an integer is required") and one past 2**64 - 1
    ("Overflow when unpacking long long"), naming neither, and takes -1 as a seed of its own.
    """
    check_seed(seed, name)
    if seed > MAX_TORCH_SEED:
        raise KdmlError(f"{name} must be at most 2**64 - 1 (torch's largest seed), got {seed!r}")
    return int(seed)


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for the stream ``(seed, *keys)``.

    NumPy's ``SeedSequence`` hashes the whole tuple, so neighbouring keys (epochs 1 and 2,
    steps 7 and 8) give unrelated streams, unlike ``seed + epoch``. Each is an integer of at
    least 0 (NumPy's own error for -1 names neither).
    """
    check_seed(seed, "derive_seed: the seed")
    for position, key in enumerate(keys, 1):
        check_seed(key, f"derive_seed: key {position}")
    words = np.random.SeedSequence(entropy=seed, spawn_key=keys).generate_state(1, np.uint64)
    return int(words[0]) >> 1


class BatchShare(NamedTuple):
    """Where a rank's share sits in the global batch: rows ``offset .. offset + local`` of a
    batch of ``size`` (see :func:`kdml.data.transforms.draw_parameters`)."""

    offset: int
    size: int


class StepRandom:
    """The random streams of one training step.

    Args:
        seed: the run's seed (``train.seed``), non-negative.
        epoch, step: the step's position in the run.
        rank: a key for draws that should differ between processes (the trainer passes 0:
            every rank draws the global batch's randomness and keeps its ``share``).
        share: this process's rows of the global batch (``None``: the whole batch).

    Example::

        >>> rng = StepRandom(seed=0, epoch=1, step=3)
        >>> a = torch.rand(2, generator=rng.generator("cpu", METHOD))
        >>> b = torch.rand(2, generator=StepRandom(0, 1, 3).generator("cpu", METHOD))
        >>> torch.equal(a, b)
        True
    """

    def __init__(self, seed: int, epoch: int, step: int, rank: int = 0,
                 share: BatchShare | None = None) -> None:
        self.keys = (seed, epoch, step, rank)
        self.share = share
        self._generators: dict[tuple[str, int], torch.Generator] = {}

    def seed(self, stream: int) -> int:
        seed, *position = self.keys
        return derive_seed(seed, *position, stream)

    def generator(self, device: torch.device | str = "cpu", stream: int = METHOD
                  ) -> torch.Generator:
        """A generator on ``device`` for ``stream``, created and seeded on first use."""
        device = torch.device(device)
        key = (str(device), stream)
        if key not in self._generators:
            self._generators[key] = torch.Generator(device).manual_seed(self.seed(stream))
        return self._generators[key]


def with_cpu_seed(seed: int, draw: Callable[[], T]) -> T:
    """Run ``draw`` with torch's CPU generator seeded to ``seed``, restoring its state after.

    For libraries that can only draw from the global generator (kornia's augmentation
    parameters): the draw is then a function of ``seed`` alone and leaves no trace in the
    global state.
    """
    seed = torch_seed(seed, "with_cpu_seed: the seed")  # before the state is forked
    with _forked_cpu_rng():
        torch.default_generator.manual_seed(seed)  # the CPU generator only, not CUDA's
        return draw()


@contextmanager
def _forked_cpu_rng() -> Iterator[None]:
    state = torch.random.get_rng_state()
    try:
        yield
    finally:
        torch.random.set_rng_state(state)


def seed_stream(generator: torch.Generator) -> int:
    """A fresh 63-bit seed drawn from a CPU ``generator`` (to seed :func:`with_cpu_seed`)."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))
