"""Subnormal floats flushed to zero on the CPU (``train.flush_denormal=true``).

A float32 below 1.2e-38 in magnitude is *subnormal* (denormal), and x86 CPUs compute with such
numbers many times slower than with normal ones. A run whose weights decay towards zero (a
network that no loss term trains, shrunk by weight decay) fills with them and its epochs slow
down three times or more (docs/benchmarks.md). Flushing treats them as zero: the run's numbers
change only where such values occur. It applies to the CPU's arithmetic only, not to a GPU's.

PyTorch sets this with :func:`torch.set_flush_denormal` and has no getter, so the mode before
is read by multiplying a subnormal number: it stays subnormal unless flushed. The mode is the
calling thread's: torch's worker threads take it from the thread that starts them. So it is
whole in a ``kdml train`` process, which sets it before its first parallel computation, and
stays in those workers after the run; in a process whose workers already run (a grid's later
cells, ``kdml reproduce``, a library caller) it reaches the main thread's share of each
computation only, which the run then says.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

# the smallest normal float32 is about 1.18e-38: this one is subnormal
SUBNORMAL = 1e-39
SUBNORMAL_BITS = 0x000AE398  # float32 1e-39 as bits (exponent 0: subnormal)


# elements of the parallel product that reads the workers' mode: above torch's grain size
# (32,768) for every thread of a large CPU
PARALLEL_PROBE = 1 << 21


def flushes_denormals() -> bool:
    """Whether this thread's CPU arithmetic treats subnormal floats as zero."""
    return bool((torch.tensor([SUBNORMAL]) * 1.0)[0] == 0)


def unflushed_share() -> float:
    """The share of a parallel product's subnormal results left subnormal: 0 where every
    thread flushes them, 1 where none does, between where only some do."""
    # made and read as integers: a flushing thread would turn SUBNORMAL into 0 already when
    # converting it to float32, and take a subnormal for 0 when comparing it with 0
    subnormals = torch.full((PARALLEL_PROBE,), SUBNORMAL_BITS, dtype=torch.int32)
    product = subnormals.view(torch.float32) * 1.0
    return float((product.view(torch.int32) != 0).double().mean())


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
    elif (unflushed := unflushed_share()) > 0:
        echo(f"train.flush_denormal=true reaches this process's main thread only: torch's "
             f"worker threads, started before it, keep subnormal floats (a share "
             f"{unflushed:.2f} of a parallel product's); train the run in a process of its own "
             "(kdml train) for all of them")
    try:
        yield
    finally:
        torch.set_flush_denormal(before)
