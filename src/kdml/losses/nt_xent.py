r"""NT-Xent (Chen et al., SimCLR, ICML 2020), the contrastive loss of MSimCLR and SimCLR (Atlas,
Sec. 3.1), for a batch of two views per image.

With :math:`2N` projections laid out as [view 1 of images 1..N; view 2 of images 1..N],
:math:`s_{ij}` the cosine similarity of projections :math:`i` and :math:`j`, temperature
:math:`\tau` and :math:`p(i)` the other view of :math:`i`'s image:

.. math::
    \ell = \frac{1}{2N} \sum_{i=1}^{2N} -\log
        \frac{e^{s_{i p(i)} / \tau}}{\sum_{k \neq i} e^{s_{ik} / \tau}}

PML ships the same loss as ``NTXentLoss`` (with labels that make the two views the only
positive pair), and the tests check that this one equals it. It is written here because PML's
finds its pairs with ``torch.where`` on the label matrix: a host-device synchronisation per
step, which stalls a GPU step that the host must keep fed (docs/benchmarks.md, "On a GPU").
The pairs of this layout are known in advance, so here it is one softmax cross-entropy.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from kdml.checks import (
    Real,
    as_number,
    check_float_inputs,
    check_setting_device,
    is_finite_number,
)
from kdml.errors import KdmlError
from kdml.precision import full_precision

# The smallest temperature taken: float32's smallest normal number (1.2e-38). Below it the
# float32 logits cosine / tau overflow, or tau is a subnormal that flushing makes 0, and the
# loss is inf or NaN; no NT-Xent temperature in use comes near it.
MIN_TEMPERATURE = float(torch.finfo(torch.float32).tiny)


@full_precision
def nt_xent_loss(projections: Tensor, temperature: Real | Tensor | np.ndarray) -> Tensor:
    r"""Mean NT-Xent loss of two views per image, computed in float32 or wider whatever the
    input dtype, with no host-device synchronisation.

    Args:
        projections: :math:`(2N, D)` floating point projections, [view 1; view 2] in one
            tensor, ``torch.cat([view1, view2])`` (not necessarily normalised: the similarity
            is the cosine).
        temperature: :math:`\tau` (the Atlas paper: 1 for MNIST and Fashion-MNIST, 0.5 for
            CIFAR-10): a number > 0 (a 0-d NumPy array is read as its number), or a tensor
            of one element (e.g. a learned one), which is not read (a host sync).

    Returns:
        A scalar tensor.

    Example::

        >>> views = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.1], [0.1, 1.0]])
        >>> round(nt_xent_loss(views, 0.5).item(), 4)
        0.2899
    """
    # shapes and dtypes only: the two views go in stacked, as one tensor
    stack = "the two views stacked as one [2N, D] tensor, torch.cat([view1, view2])"
    if not isinstance(projections, Tensor):
        raise KdmlError(f"nt_xent_loss takes {stack}, got {type(projections).__name__}")
    if isinstance(temperature, Tensor) and temperature.numel() != 1:
        raise KdmlError(f"nt_xent_loss takes {stack}, and a temperature; got a temperature "
                        f"tensor of shape {tuple(temperature.shape)}")
    if isinstance(temperature, Tensor):
        check_setting_device("nt_xent_loss", "temperature", temperature, projections,
                             "projections")
    if projections.ndim != 2 or len(projections) % 2 or not len(projections):
        raise KdmlError(f"nt_xent_loss needs [2N, D] projections (two views per image, N >= "
                        f"1), got {tuple(projections.shape)}")
    check_float_inputs("nt_xent_loss", [projections], "projections")
    # a 0-d NumPy array as its Python float (no device, so no host sync), as other settings
    if isinstance(temperature, np.ndarray):
        temperature = as_number(temperature, "nt_xent_loss: temperature")  # type: ignore[assignment]
    # A number is checked (0 gives NaN, a negative one rewards the wrong pairs); a tensor, e.g.
    # a learned temperature, is not: reading its value would be a host sync every step.
    if not isinstance(temperature, Tensor) and not (
            is_finite_number(temperature, above=0) and temperature >= MIN_TEMPERATURE):
        raise KdmlError(f"nt_xent_loss needs a temperature that is a finite number > 0, at "
                        f"least {MIN_TEMPERATURE:.1e} (float32's smallest normal), got "
                        f"{temperature!r}")
    # one number: a [1, 1, 1] tensor made the logits 3-D; a NumPy number as its Python float
    temperature = (temperature.reshape(()) if isinstance(temperature, Tensor)
                   else float(temperature))
    unit = F.normalize(projections, dim=1)
    logits = (unit @ unit.T) / temperature
    itself = torch.eye(len(unit), dtype=torch.bool, device=unit.device)
    logits = logits.masked_fill(itself, float("-inf"))  # k != i in the denominator
    half = len(unit) // 2
    other_view = torch.arange(len(unit), device=unit.device).roll(half)
    return F.cross_entropy(logits, other_view)
