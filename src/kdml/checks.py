"""Input checks shared by the public API: counts and settings (Python and NumPy numbers pass,
bools do not), the labels of a batch (torch tensors of integers, on the batch's device, in the
range of the classes), the tensors of a call (torch tensors, floating point, on one device) and
pytorch-metric-learning's call."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, TypeAlias, TypeGuard, TypeVar

import numpy as np
import torch
from torch import Tensor

from kdml.errors import KdmlError

#: A setting given as a number (a scale, a bandwidth, a weight): a Python or NumPy number, or a
#: 0-d tensor or array holding one, which :func:`as_number` reads once, where it is given.
Number: TypeAlias = float | np.floating[Any] | np.integer[Any] | Tensor | np.ndarray
#: A count given as a number (:func:`is_positive_int`): a Python or NumPy integer.
Count: TypeAlias = int | np.integer[Any]
#: A setting checked with :func:`is_finite_number` as it is given: a Python or NumPy real
#: number (``np.float32(0.5)``, which a type checker does not take for a ``float``).
Real: TypeAlias = float | np.floating[Any] | np.integer[Any]

#: A float tensor or array, returned as the same kind (:func:`beyond_int64`).
FloatValues = TypeVar("FloatValues", Tensor, np.ndarray)


def is_positive_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    """Whether ``value`` is a count of at least 1: a Python or NumPy integer (a loop over
    ``np.arange`` gives the latter), not a bool and not a float such as ``2.0``."""
    return bool(not isinstance(value, bool) and isinstance(value, int | np.integer)
                and value >= 1)


def is_count(value: object) -> TypeGuard[int | np.integer[Any]]:
    """Whether ``value`` is a whole number of at least 0 (a seed, or a count kdml recorded in
    a JSON file): a Python or NumPy integer, not a bool and not a float such as ``2.0``."""
    return bool(not isinstance(value, bool) and isinstance(value, int | np.integer)
                and value >= 0)


def check_seed(value: object, name: str = "seed") -> None:
    """A seed of NumPy's generators: a Python or NumPy integer of at least 0, not a bool
    (NumPy's own error for -1 or 1.5 names neither the argument nor what it takes)."""
    if not is_count(value):
        raise KdmlError(f"{name} must be an integer of at least 0, got {value!r}")


def is_finite_number(value: object, above: float | None = None,
                     at_least: float | None = None) -> bool:
    """Whether ``value`` is a finite real number (a Python or NumPy one, not a bool), greater
    than ``above`` and at least ``at_least`` where they are given: a setting such as a
    scale, a margin or a weight, checked once where it is given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    number = float(value)
    return (math.isfinite(number) and (above is None or number > above)
            and (at_least is None or number >= at_least))


def as_number(value: object, name: str) -> object:
    """A 0-d tensor or array of real numbers as its Python float (read once, where a setting
    is given); any other value unchanged, for the caller's check to refuse or take: a 0-d
    bool (``np.array(True)``, which had become 1.0 though bools do not pass as settings),
    complex, string or object one included (float() of them had raised a raw TypeError, or
    read ``np.array("3")`` as 3.0). A tensor that requires grad (an ``nn.Parameter``) is
    refused in one line naming the setting ``name``: read once, it would never be learned,
    which torch said only in a warning."""
    if isinstance(value, Tensor) and value.requires_grad:
        raise KdmlError(f"{name} is a tensor that requires grad, but kdml reads it once, as a "
                        "number, so it would not be learned; pass a number (or the tensor "
                        "detached)")
    if isinstance(value, Tensor | np.ndarray) and value.ndim == 0 and _holds_reals(value):
        return float(value)
    return value


def _holds_reals(value: Tensor | np.ndarray) -> bool:
    """Whether the dtype of ``value`` is a real number's: integer or floating point, not bool,
    complex, string or object."""
    if isinstance(value, Tensor):
        return value.dtype != torch.bool and not value.is_complex()
    return bool(np.issubdtype(value.dtype, np.integer) or np.issubdtype(value.dtype, np.floating))


def check_tensors(owner: str, labels: object, tensors: Sequence[object],
                  what: str = "embeddings") -> None:
    """Refuse, in one line naming ``owner``, labels or ``what`` (e.g. ``"embeddings"``) that
    are not torch tensors: a PML loop's labels are often NumPy arrays or lists."""
    kinds = _not_tensors([labels, *tensors])
    if kinds:
        raise KdmlError(f"{owner} takes torch tensors (the batch's labels and {what}), "
                        f"got {kinds}; convert with torch.as_tensor")


def _not_tensors(values: Sequence[object]) -> str:
    """The sorted type names of the ``values`` that are not torch tensors, or ``""``."""
    return ", ".join(sorted({type(value).__name__ for value in values
                             if not isinstance(value, Tensor)}))


def check_tensor_inputs(owner: str, tensors: Sequence[object], what: str) -> None:
    """Refuse, in one line naming ``owner``, ``what`` (e.g. ``"source and target
    embeddings"``) that are not torch tensors: a NumPy array or a list fails deep inside the
    maths ("'numpy.ndarray' object has no attribute ..."). :func:`check_tensors` is the same
    for a call that also takes the batch's labels."""
    kinds = _not_tensors(tensors)
    if kinds:
        raise KdmlError(f"{owner} takes torch tensors ({what}), got {kinds}; convert with "
                        f"torch.as_tensor")


def check_same_device(owner: str, tensors: Sequence[Tensor], what: str) -> None:
    """Refuse, in one line naming ``owner`` and the devices, ``what`` (e.g. ``"embeddings"``)
    on different devices: torch's own "Tensor on device cpu is not on the expected device
    meta!" comes from deep inside the maths. Devices only, no host sync."""
    devices = list(dict.fromkeys(tensor.device for tensor in tensors))
    if len(devices) > 1:
        raise KdmlError(f"{owner}: the {what} are on different devices "
                        f"({', '.join(map(str, devices))}); put them on one device")


def check_setting_device(owner: str, name: str, value: Tensor, inputs: Tensor,
                         inputs_name: str) -> None:
    """Refuse, in one line naming ``owner``, a one-number tensor setting ``name`` (a learned
    scale, a temperature) on another device than ``inputs`` (called ``inputs_name``): torch's
    "Tensor on device meta is not on the expected device cpu!" came from deep inside the loss.
    A 0-dim CPU tensor is taken: torch combines one with any device's. Devices only, no host
    sync."""
    if value.device != inputs.device and not (value.device.type == "cpu" and value.ndim == 0):
        raise KdmlError(f"{owner} got a {name} on {value.device} and {inputs_name} on "
                        f"{inputs.device}; move the {name} to {inputs.device}")


def check_has_values(name: str, tensor: Tensor) -> None:
    """Refuse, in one line naming ``name`` (e.g. ``"labels"``), a tensor on the meta device,
    which holds shapes but no values, where the values are read (the metrics): torch's own
    "Cannot copy out of meta tensor; no data!" or "Tensor.item() cannot be called on meta
    tensors" came from deep inside the search. The losses take meta tensors: they only
    compute on them."""
    if tensor.device.type == "meta":
        raise KdmlError(f"{name} is a tensor on the meta device, which holds no values to "
                        "score; pass it computed on the CPU or a GPU")


def check_integer_labels(owner: str, labels: Tensor) -> None:
    """Refuse, in one line naming ``owner``, float or complex labels (class labels are
    integers; a float label such as 0.5 would silently make a class of its own)."""
    if labels.is_floating_point() or labels.is_complex():
        raise KdmlError(f"{owner}: labels must be integers, got dtype {labels.dtype}")


def check_label_vector(owner: str, labels: object) -> None:
    """Refuse, in one line naming ``owner``, labels that are not a ``[N]`` integer tensor: a
    list or NumPy array (Python's AttributeError on ``.unique``), float labels, or 2-D ones
    (which gave 2-D index tensors)."""
    if not isinstance(labels, Tensor):
        raise KdmlError(f"{owner} takes the labels as a [N] integer torch tensor, got "
                        f"{type(labels).__name__}; convert with torch.as_tensor")
    check_integer_labels(owner, labels)
    if labels.ndim != 1:
        raise KdmlError(f"{owner}: labels must be [N], one per sample, got shape "
                        f"{tuple(labels.shape)}")


def whole_number_labels(owner: str, labels: object) -> Tensor:
    """``labels`` as a long tensor: integers, or floats that are whole numbers (a table's
    float column of 0.0, 1.0, ...). A fractional or non-finite float is refused in one line
    naming ``owner``: ``.long()`` had cut 0.7, 1.2 and 1.9 to 0, 1, 1 (two labels one class)."""
    try:
        # a list through NumPy: torch makes Python floats float32, whose 16777217.0 is
        # 16777216.0 (two labels one class); NumPy keeps them float64
        tensor = torch.as_tensor(labels if isinstance(labels, Tensor | np.ndarray)
                                 else np.asarray(labels))
    except (TypeError, ValueError, RuntimeError):
        raise KdmlError(f"{owner}: labels must be integer class labels, got "
                        f"{type(labels).__name__}") from None
    if tensor.is_complex():
        raise KdmlError(f"{owner}: labels must be integers, got dtype {tensor.dtype}")
    if tensor.is_floating_point():
        whole = torch.isfinite(tensor) & (tensor == tensor.round())
        if not bool(whole.all()):
            value = tensor[~whole].flatten()[0].item()
            raise KdmlError(f"{owner}: labels must be whole numbers (class indices), got "
                            f"{value!r}; map the classes to integers first")
        # a whole float beyond int64 (1e20, 2**63) had become -2**63 in .long(): 1e20 and 2e20
        # one class; within it, .long() is exact
        _refuse_beyond_int64(owner, beyond_int64(tensor))
    elif tensor.dtype == torch.uint64:  # torch compares no uint64: NumPy does, and wraps none
        values = tensor.numpy().ravel()
        _refuse_beyond_int64(owner, values[values > np.iinfo(np.int64).max])
    return tensor.long()


def beyond_int64(floats: FloatValues) -> FloatValues:
    """The values of ``floats`` (a float tensor or array) that int64 cannot hold, which a cast
    makes -2**63 alike (1e20 and 2e20 one class); within its range the cast of a whole float
    is exact."""
    return floats[(floats < -2.0 ** 63) | (floats >= 2.0 ** 63)]


def _refuse_beyond_int64(owner: str, beyond: Tensor | np.ndarray) -> None:
    """Refuse, naming the first, the labels ``beyond`` int64's range (none: nothing)."""
    if len(beyond.reshape(-1)):
        value = beyond.reshape(-1)[0].item()
        raise KdmlError(f"{owner}: labels must be class indices within int64's range "
                        f"(|label| < 2**63), got {value!r}; map the classes to 0..C-1 first "
                        "(e.g. with numpy.unique(..., return_inverse=True))")


def check_label_device(owner: str, labels: Tensor, tensors: Sequence[Tensor],
                       what: str = "embeddings", like: str = "embeddings") -> None:
    """Refuse, in one line naming ``owner`` and both devices, labels on another device than
    ``what`` (which must share one device): torch's own error comes from deep inside the
    maths. ``like`` names the tensor whose device the message tells the caller to move the
    labels to."""
    check_same_device(owner, tensors, what)
    if tensors and labels.device != tensors[0].device:
        raise KdmlError(f"{owner}: the labels are on {labels.device} but the {what} on "
                        f"{tensors[0].device}; move the labels with labels.to({like}.device)")


def check_labels(owner: str, labels: Tensor, tensors: Sequence[Tensor],
                 what: str = "embeddings", like: str = "embeddings") -> None:
    """The label checks every kdml loss and regularizer taking ``(x, labels)`` shares, in one
    line naming ``owner``: :math:`(M,)` ``labels`` and the :math:`(M, D)` ``tensors`` (the
    ``what``, e.g. embeddings) are torch tensors (:func:`check_tensors`), the labels integers
    (:func:`check_integer_labels`) on the tensors' device (:func:`check_label_device`). Types,
    dtypes and devices only, no host sync; each caller checks the shapes."""
    check_tensors(owner, labels, tensors, what)
    check_integer_labels(owner, labels)
    check_label_device(owner, labels, tensors, what, like)


def check_real_memberships(owner: str, q: Tensor) -> None:
    """Refuse, in one line naming ``owner``, complex chart memberships ``q``: they are
    probabilities (bool or integer one-hot ones are taken as 0 and 1), and a complex ``q``
    had made ManifoldMMD's value complex, ChartMembershipLoss drop the imaginary part with
    only torch's warning, and compressed_code and manifold_distance raise torch's own error.
    Dtypes only."""
    if q.is_complex():
        raise KdmlError(f"{owner} expects real memberships q (probabilities, or a bool or "
                        f"integer one-hot), got dtype {q.dtype}")


def check_float_inputs(owner: str, tensors: Sequence[Tensor], what: str = "embeddings") -> None:
    """Refuse, in one line naming ``owner``, ``what`` (e.g. ``"embeddings"``) that are not
    floating point: torch's own error ("mean(): could not infer output dtype", "cdist only
    supports floating-point dtypes") comes from deep inside the maths. Dtypes only."""
    dtypes = [tensor.dtype for tensor in tensors if not tensor.is_floating_point()]
    if dtypes:
        raise KdmlError(f"{owner} expects floating point {what}, got {dtypes[0]}; convert "
                        f"with .float()")


def check_feature_matrix(owner: str, features: Tensor, width: int,
                         what: str = "features") -> None:
    """Refuse, in one line naming ``owner``, ``what`` (a layer's input) that is no float tensor
    ``[B, width]``: torch's own "mat1 and mat2 shapes cannot be multiplied" (or an integer
    dtype's or an attribute error) comes from inside the layer otherwise. A float of another
    precision than the layer's weights (float64 into a float32 head) is torch's to refuse, as
    for any ``nn.Linear``: autocast takes such inputs on purpose."""
    check_tensor_inputs(owner, [features], what)
    if features.ndim != 2 or features.shape[1] != width:
        raise KdmlError(f"{owner} expects {what} [B, {width}], got {tuple(features.shape)}")
    check_float_inputs(owner, [features], what)


ASSERT_MESSAGE_LIMIT = 250  # UTF-8 bytes of a torch._assert_async message (CUDA's limit: 254)


def check_params(owner: str, params: object, expected: type | tuple[type, ...]) -> None:
    """Refuse ``params`` that are no instance of the recipe's params class(es) ``expected``
    (a dict of settings, or the class itself: ``AttributeError: 'dict' object has no
    attribute 'validate'``), then validate them."""
    if not isinstance(params, expected):
        classes = expected if isinstance(expected, tuple) else (expected,)
        got = (f"the class {params.__name__} itself" if isinstance(params, type)
               else f"a {type(params).__name__}")
        raise KdmlError(f"{owner}: params must be a {' or '.join(c.__name__ for c in classes)} "
                        f"instance, got {got}; build one with its settings as keywords, e.g. "
                        f"{classes[0].__name__}(**settings)")
    params.validate()  # type: ignore[attr-defined]  # every recipe's params class has it


def check_class_range(owner: str, labels: Tensor, num_classes: int, classes: str) -> None:
    """Refuse, in one line naming ``owner``, integer ``labels`` outside ``[0, num_classes)``,
    the classes ``classes`` names (e.g. "one per column of the cosines"): torch's own error is
    "Class values must be smaller than num_classes." on the CPU and a device-side assert on a
    GPU, from deep inside the loss.

    The values are read only where that is free: labels on the CPU, outside
    ``torch.compile``. Elsewhere reading them would make a GPU step wait for the device (or
    break a compiled graph), so the same check goes to ``torch._assert_async``, which stops the
    run with this message when the device reaches it (a device-side assert on a GPU; nothing
    on the meta device, which holds no values)."""
    if labels.numel() == 0:
        return
    if labels.dtype in (torch.uint16, torch.uint32, torch.uint64):  # torch has no min/max of
        labels = labels.long()  # these ("min_all" not implemented): uint64 beyond int64 wraps
    advice = f"number the classes 0 to {num_classes - 1}"
    if labels.device.type == "cpu" and not torch.compiler.is_compiling():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= num_classes:
            raise KdmlError(f"{owner}: labels must be class indices in [0, {num_classes}), "
                            f"{classes}, got {low if low < 0 else high}; {advice}")
        return
    torch._assert_async(((labels >= 0) & (labels < num_classes)).all(),
                        assert_message(f"{owner}: labels must be class indices in "
                                       f"[0, {num_classes}), {classes}; {advice}"))


def assert_message(message: str) -> str:
    """``message`` cut to :data:`ASSERT_MESSAGE_LIMIT` UTF-8 bytes for ``torch._assert_async``:
    CUDA refuses a longer one on every call, with good labels too."""
    encoded = message.encode()
    if len(encoded) <= ASSERT_MESSAGE_LIMIT:
        return message
    return encoded[:ASSERT_MESSAGE_LIMIT - 3].decode(errors="ignore") + "..."


def check_pml_extras(owner: str, reason: str, call: str, indices_tuple: object,
                     ref_emb: object, ref_labels: object) -> None:
    """Refuse, in one line naming ``owner``, the arguments of pytorch-metric-learning's call
    ``loss(embeddings, labels, indices_tuple=None, ref_emb=None, ref_labels=None)`` that kdml's
    losses and regularizers do not use: a miner's ``indices_tuple`` and the reference batch
    ``ref_emb`` / ``ref_labels`` (of ``CrossBatchMemory``). ``reason`` says why, e.g. "uses
    every pair of the batch"; ``call`` how to call ``owner`` instead."""
    given = [name for name, value in (("indices_tuple", indices_tuple), ("ref_emb", ref_emb),
                                      ("ref_labels", ref_labels)) if value is not None]
    if given:
        raise KdmlError(f"{owner} {reason}, so it takes no {' or '.join(given)} (no miner, "
                        f"reference batch or CrossBatchMemory); {call}")
