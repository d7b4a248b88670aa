"""Heads that turn pooled backbone features into embeddings."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from kdml.checks import Count, check_feature_matrix, is_positive_int
from kdml.errors import KdmlError
from kdml.precision import full_precision


def _check_sizes(owner: str, **sizes: Count) -> None:
    """Refuse, in one line naming ``owner``, sizes that are no integer >= 1: torch's own
    "Trying to create tensor with negative dimension" or "empty(): argument 'size' failed to
    unpack" comes from inside nn.Linear, and 0 or True built a head silently."""
    for name, value in sizes.items():
        if not is_positive_int(value):
            raise KdmlError(f"{owner}: {name} must be a positive integer, got {value!r}")


class EmbeddingHead(nn.Module):
    """Affine map followed by L2 normalisation: ``x = (W^T f + b) / ||W^T f + b||``.

    Shape:
        - Input: [B, in_features] pooled features.
        - Output: [B, embedding_size], unit norm.
    """

    def __init__(self, in_features: Count, embedding_size: Count) -> None:
        super().__init__()
        _check_sizes("EmbeddingHead", in_features=in_features, embedding_size=embedding_size)
        self.linear = nn.Linear(int(in_features), int(embedding_size))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        check_feature_matrix("EmbeddingHead", features, self.linear.in_features,
                             "pooled features")
        return F.normalize(self.linear(features), dim=1)


class JRDRepresentations(NamedTuple):
    """The three representations of Eq. 9 of Chu et al. 2020 for a batch of M samples."""

    pooled: torch.Tensor  # x^-: [M, D] backbone feature, not normalized
    embedding: torch.Tensor  # x: [M, d] L2-normalized affine embedding
    class_level: torch.Tensor  # x^+: [M, C] cosines to the normalized class proxies


class JRDHead(nn.Module):
    r"""The JRD head (Chu et al., ICML 2020, Sec. 4, Eq. 9).

    .. math::
        x = \frac{W^\top x^- + b}{\|W^\top x^- + b\|}, \qquad
        x^+ = \left[\frac{w'_1}{\|w'_1\|}, \dots, \frac{w'_C}{\|w'_C\|}\right]^\top x

    The proxies :math:`w'_c` are stored as ``proxies`` of shape [d, C], the layout of PML's
    ``CosFaceLoss.W``. The class-level representation :math:`x^+` is the matrix of cosines the
    AM-Softmax loss takes (:func:`kdml.losses.am_softmax_loss`), so the two share the proxies.

    Args:
        in_features: D, the backbone's pooled feature size.
        embedding_size: d (512 in the paper).
        num_classes: C, the number of training classes.

    Shape:
        - Input: [M, D] pooled features.
        - Output: :class:`JRDRepresentations` with [M, D], [M, d] and [M, C].

    Example::

        >>> head = JRDHead(128, 64, 10)
        >>> pooled, embedding, cosines = head(torch.randn(4, 128))
        >>> cosines.shape
        torch.Size([4, 10])
    """

    def __init__(self, in_features: Count, embedding_size: Count, num_classes: Count) -> None:
        super().__init__()
        _check_sizes("JRDHead", in_features=in_features, embedding_size=embedding_size,
                     num_classes=num_classes)
        self.embedding = EmbeddingHead(in_features, embedding_size)
        # N(0, 1), as PML's CosFaceLoss initialises its W (method.proxy_init=kaiming: the
        # authors' initialisation).
        self.proxies = nn.Parameter(torch.randn(int(embedding_size), int(num_classes)))

    def forward(self, pooled: torch.Tensor) -> JRDRepresentations:
        check_feature_matrix("JRDHead", pooled, self.embedding.linear.in_features,
                             "pooled features")
        embedding = self.embedding(pooled)
        return JRDRepresentations(pooled, embedding, _cosines(embedding, self.proxies))


@full_precision
def _cosines(embedding: torch.Tensor, proxies: torch.Tensor) -> torch.Tensor:
    """[M, C] cosines of unit embeddings [M, d] to the proxies [d, C], in float32 or wider even
    under autocast: AM-Softmax multiplies them by its scale (20), which would magnify a
    bfloat16 rounding of the cosines (about 4e-3) into the logits."""
    return embedding @ F.normalize(proxies, dim=0)
