"""Subnormal floats flushed to zero on the CPU (``train.flush_denormal=true``).

A float32 below 1.2e-38 in magnitude is *subnormal* (denormal), and x86 CPUs compute with such
numbers many times slower than with normal ones. A run whose weights decay towards zero (a
network that no loss term trains, shrunk by weight decay) fills with them and its epochs slow
down three times or more (docs/benchmarks.md). Flushing treats them as zero: the run's numbers
change only where such values occur. It applies to the CPU's arithmetic only, not to a GPU's.

PyTorch sets this per process with :func:`torch.set_flush_denormal` and has no getter, so the
mode before is read by multiplying a subnormal number: it stays subnormal unless flushed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

# the smallest normal float32 is about 1.18e-38: this one is subnormal
SUBNORMAL = 1e-39


def flushes_denormals() -> bool:
    """Whether this process's CPU arithmetic treats subnormal floats as zero."""
    return bool((torch.tensor([SUBNORMAL]) * 1.0)[0] == 0)


@contextlib.contextmanager
def flushing_denormals(enabled: bool, echo: Callable[[str], None] = print) -> Iterator[None]:
    """Flush subnormal floats to zero while the block runs (``enabled``), then restore the
    process's mode before. A CPU that cannot flush them is said so through ``echo``, and the
    block runs with them (as slow, and as exact, as without the setting)."""
    if not enabled:
        yield
        return
    before = flushes_denormals()
    if not torch.set_flush_denormal(True):
        echo("train.flush_denormal=true: this CPU cannot flush subnormal floats to zero; "
             "training with them")
    try:
        yield
    finally:
        torch.set_flush_denormal(before)
