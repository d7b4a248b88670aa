r"""The additive-margin softmax (AM-Softmax; Wang et al., 2018), JRD's classification loss
(Chu et al., ICML 2020, Eq. 12).

.. math::
    L_{AMS} = -\frac{1}{M} \sum_{i=1}^{M} \log
        \frac{e^{s (\cos\theta_{i y_i} - m)}}
             {e^{s (\cos\theta_{i y_i} - m)} + \sum_{c \neq y_i} e^{s \cos\theta_{i c}}}

with :math:`\cos\theta_{ic}` the cosine between sample :math:`i`'s embedding and the proxy of
class :math:`c`, scale :math:`s` and margin :math:`m`.

PML ships the same loss as ``CosFaceLoss``, and the tests check that this one equals it. It is
written here because PML's version picks the target cosines with a boolean mask and indexes a
GPU tensor with a CPU ``arange``: two host-device synchronisations per step, which stall a
GPU step that the host must keep fed (docs/benchmarks.md, "On a GPU"). This one takes the
cosines the JRD head already computes, so it also skips a second normalisation and matmul.
"""

from __future__ import annotations

from typing import SupportsFloat, TypeAlias, cast

import numpy as np
import torch.nn.functional as F
from torch import Tensor

from kdml.checks import (
    Real,
    as_number,
    check_class_range,
    check_float_inputs,
    check_integer_labels,
    check_label_device,
    check_setting_device,
    check_tensors,
    is_finite_number,
)
from kdml.errors import KdmlError
from kdml.precision import full_precision

#: A scale or margin: a number (Python or NumPy, or a 0-d NumPy array holding one), or a tensor
#: of one element (e.g. a learned one).
Setting: TypeAlias = Real | Tensor | np.ndarray


def _check_setting(name: str, value: Setting, low: float, strict: bool,
                   cosines: Tensor) -> float | Tensor:
    """``value``, a ``scale`` or ``margin``, refused where it is not a finite number above
    ``low`` (at least ``low`` unless ``strict``); a 0-d NumPy array is read as its number, as
    nt_xent_loss and the kernels read one (it had been refused as "not a finite number > 0,
    got array(20.)"). A tensor, e.g. a learned scale, is not read (a host sync), but must hold
    one number on the ``cosines``' device (or be a 0-dim CPU tensor, which torch takes with
    any device's)."""
    if isinstance(value, np.ndarray):  # no device, so reading it is no host sync
        value = as_number(value, f"am_softmax_loss: {name}")  # type: ignore[assignment]
    if isinstance(value, Tensor):
        if value.numel() != 1:  # one of shape [C] had silently weighted each class
            raise KdmlError(f"am_softmax_loss needs a {name} that is one number (a tensor of "
                            f"one element, if learned), got shape {tuple(value.shape)}")
        check_setting_device("am_softmax_loss", name, value, cosines, "cosines")
        return value
    if not (is_finite_number(value, above=low) if strict
            else is_finite_number(value, at_least=low)):
        raise KdmlError(f"am_softmax_loss needs a {name} that is a finite number "
                        f"{'>' if strict else '>='} {low:g}, got {value!r}")
    return float(cast(SupportsFloat, value))  # a real number: checked above


@full_precision
def am_softmax_loss(cosines: Tensor, labels: Tensor, scale: Setting, margin: Setting) -> Tensor:
    r"""Mean AM-Softmax loss of Eq. 12 from the cosines to the class proxies.

    Computed in float32 or wider whatever the input dtype, with no host-device
    synchronisation: labels outside :math:`[0, C)` are refused in one line on the CPU, and on a
    GPU stop the run with the same message by a device-side assert
    (:func:`~kdml.checks.check_class_range`).

    A function of the cosines, not a pytorch-metric-learning loss of embeddings: PML's
    equivalent is ``CosFaceLoss``, which holds the proxies itself. A number ``scale`` or
    ``margin`` (a 0-d NumPy array is read as its number) is checked; a tensor one (e.g.
    learned) is not, as reading its value would be a host sync every step.

    Args:
        cosines: :math:`(M, C)` cosines :math:`\cos\theta_{ic}`, e.g.
            :class:`~kdml.models.heads.JRDHead`'s class-level representation.
        labels: :math:`(M,)` integer class indices in :math:`[0, C)`, on the cosines' device.
        scale: :math:`s > 0`, finite (20 in the JRD paper); an infinite one gives NaN.
        margin: :math:`m \ge 0`, finite: the additive margin of Eq. 12 (0.1 for CUB and
            SOP, 0.05 for Cars in the JRD paper; 0 is the normalised softmax).

    Returns:
        A scalar tensor.

    Example::

        >>> import torch
        >>> cosines = torch.tensor([[0.5, 0.3], [0.1, 0.4]])
        >>> round(am_softmax_loss(cosines, torch.tensor([0, 1]), 20.0, 0.1).item(), 4)
        0.0725
    """
    # shapes and dtypes; the label range is read on the CPU only (on a GPU: an async assert)
    check_tensors("am_softmax_loss", labels, [cosines], "cosines")
    if cosines.ndim != 2 or labels.shape != (cosines.shape[0],):
        raise KdmlError(f"am_softmax_loss needs cosines [M, C] and labels [M], got "
                        f"{tuple(cosines.shape)} and {tuple(labels.shape)}")
    if cosines.shape[0] == 0:  # the mean over no sample is NaN
        raise KdmlError("am_softmax_loss got an empty batch")
    if cosines.shape[1] == 0:  # the range check would say "number the classes 0 to -1"
        raise KdmlError("am_softmax_loss got cosines of no class ([M, 0]): give one column "
                        "per class")
    check_float_inputs("am_softmax_loss", [cosines], "cosines")
    check_integer_labels("am_softmax_loss", labels)  # bool ones are the classes 0 and 1
    check_label_device("am_softmax_loss", labels, [cosines], "cosines", "cosines")
    scale = _check_setting("scale", scale, 0.0, strict=True, cosines=cosines)
    margin = _check_setting("margin", margin, 0.0, strict=False, cosines=cosines)
    check_class_range("am_softmax_loss", labels, cosines.shape[1],
                      "one per column of the cosines")
    labels = labels.long()  # one_hot and cross_entropy take int64 only
    # a one-element tensor as the number it holds: one of shape [1, 1, 1] had made the logits
    # 3-D, and cross_entropy then read the batch as one sample ("Expected input batch_size")
    scale, margin = (value.reshape(()) if isinstance(value, Tensor) else value
                     for value in (scale, margin))
    target_margin = margin * F.one_hot(labels, cosines.shape[1]).to(cosines.dtype)
    return F.cross_entropy(scale * (cosines - target_margin), labels)
