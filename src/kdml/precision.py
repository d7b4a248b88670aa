"""Mixed precision: the maths runs in float32 or wider whatever the input dtype.

Kernels, regularizers and distances sum exponentials of pairwise distances over a batch; in
float16 or bfloat16 those sums lose the small terms that carry the signal (JRS on float16
inputs gave 0.370 for a float64 value of 0.0508). :func:`full_precision` wraps their entry
points: floating tensors below float32 are cast up, and autocast is switched off inside, so
their matmuls are not cast back down. Gradients flow back to the caller's dtype as usual.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any, TypeVar

import torch

F = TypeVar("F", bound=Callable[..., Any])

LOW_PRECISION = (torch.float16, torch.bfloat16)
AUTOCAST_DEVICES = ("cpu", "cuda")


def upcast(value: Any, made: dict[int, torch.Tensor] | None = None) -> Any:
    """``value`` with float16/bfloat16 tensors (also inside lists and tuples) as float32.

    ``made`` maps the ids of tensors already cast in this call to their casts, so that a tensor
    passed twice is one tensor after the cast too: ``kernel(x, x)`` is the one-sample case,
    which the kernels tell apart by identity.
    """
    made = {} if made is None else made
    if isinstance(value, torch.Tensor):
        if value.dtype not in LOW_PRECISION:
            return value
        if id(value) not in made:
            made[id(value)] = value.float()
        return made[id(value)]
    if isinstance(value, list | tuple) and any(isinstance(v, torch.Tensor) for v in value):
        cast = [upcast(v, made) for v in value]
        # a NamedTuple (JRDHead's JRDRepresentations) is made from its fields by _make
        make = getattr(type(value), "_make", type(value))
        return make(cast)
    return value


def full_precision(function: F) -> F:
    """Decorator: run ``function`` on float32-or-wider tensors with autocast off.

    Example::

        >>> @full_precision
        ... def total(x):
        ...     return x.sum()
        >>> total(torch.ones(3, dtype=torch.bfloat16)).dtype
        torch.float32
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        made: dict[int, torch.Tensor] = {}
        args = tuple(upcast(arg, made) for arg in args)
        kwargs = {name: upcast(value, made) for name, value in kwargs.items()}
        with ExitStack() as stack:
            for device in AUTOCAST_DEVICES:
                if torch.is_autocast_enabled(device):
                    stack.enter_context(torch.autocast(device, enabled=False))
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str) -> AbstractContextManager:
    """The autocast context of ``train.precision`` (``fp32``: none) on ``device``."""
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device.type, dtype=AUTOCAST_DTYPES[precision])


def cpu_has_kernels_for(precision: str) -> bool | None:
    """Whether torch reports oneDNN kernels for ``precision`` (``bf16``, ``fp16``) on this
    CPU (AVX-512 or AMX on x86, their counterparts on ARM); ``None`` where this torch does not
    say (the probes are private to torch)."""
    probe = {"bf16": "_is_mkldnn_bf16_supported", "fp16": "_is_mkldnn_fp16_supported"}
    try:
        return bool(getattr(torch.ops.mkldnn, probe[precision])())
    except (AttributeError, RuntimeError):
        return None


def embedding_precision(precision: str, device: torch.device) -> str:
    """The autocast under which a run's model embeds data outside its training steps (its
    scoring while it trains, and ``kdml eval``, ``embed`` & co.) on ``device``:
    ``train.precision`` (``precision``) on a GPU, float32 on a CPU. Most CPUs have no fast
    bfloat16 or float16 kernels: embedding in them took 12 to 15 times float32's time (the
    small CNN, BN-Inception) on the CPU of docs/benchmarks.md, and float32 loses nothing of
    the float32 weights that autocast trains. One rule for both, so that ``kdml eval`` on the
    device a run trained on gives the scores its training gave."""
    return "fp32" if device.type == "cpu" else precision


def gradient_scaler(device: torch.device, precision: str) -> torch.amp.GradScaler:
    """A loss scaler for float16 (its gradients underflow without one); disabled otherwise."""
    return torch.amp.GradScaler(device.type, enabled=precision == "fp16")
