"""Bit-repeatable runs on a GPU (``train.deterministic=true``).

On the CPU kdml's runs repeat bit for bit already (same seed, same thread count). On a GPU,
cuDNN autotuning and atomic-add kernels make results vary from run to run; this mode turns
both off, at some cost in speed.
"""

from __future__ import annotations

import os

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
