"""Bit-repeatable runs on a GPU (``train.deterministic=true``).

On the CPU kdml's runs repeat bit for bit already (same seed, same thread count). On a GPU,
cuDNN autotuning and atomic-add kernels make results vary from run to run; this mode turns
both off, at some cost in speed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch

# cuBLAS needs a fixed workspace to be deterministic (CUDA >= 10.2); it must be set before the
# first cuBLAS call of the process.
CUBLAS_WORKSPACE = ":4096:8"


def make_deterministic() -> None:
    """Deterministic algorithms only (an error where none exists), fixed cuBLAS workspace,
    no cuDNN autotuning."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


@contextlib.contextmanager
def deterministic_mode(enabled: bool) -> Iterator[None]:
    """:func:`make_deterministic` while the block runs (``enabled``), then torch's flags as
    they were before, so that a caller's later work in the same process runs as it would have.
    The cuBLAS workspace setting stays: it only matters before the first cuBLAS call."""
    if not enabled:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    make_deterministic()
    try:
        yield
    finally:
        algorithms, warn_only, benchmark, cudnn_deterministic = before
        torch.use_deterministic_algorithms(algorithms, warn_only=warn_only)
        torch.backends.cudnn.benchmark = benchmark
        torch.backends.cudnn.deterministic = cudnn_deterministic
