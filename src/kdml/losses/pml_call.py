"""kdml's losses called as pytorch-metric-learning calls its losses."""

from __future__ import annotations

from torch import Tensor

from kdml.checks import check_pml_extras
from kdml.errors import KdmlError


def check_pml_call(owner: str, reason: str, labels: Tensor | None, indices_tuple: object,
                   ref_emb: object, ref_labels: object) -> Tensor:
    """The ``labels`` of a pytorch-metric-learning style call ``loss(embeddings, labels,
    indices_tuple=None, ref_emb=None, ref_labels=None)`` (what ``MultipleLosses`` makes),
    refusing in one line naming ``owner`` missing labels and the PML arguments kdml's losses do
    not use: a miner's ``indices_tuple`` and the reference batch ``ref_emb`` / ``ref_labels``
    (of ``CrossBatchMemory``). ``reason`` says why, e.g. "uses every pair of the batch"."""
    check_pml_extras(owner, reason, "call it as loss(embeddings, labels)", indices_tuple,
                     ref_emb, ref_labels)
    if labels is None:
        raise KdmlError(f"{owner} needs the batch's labels; call it as loss(embeddings, labels)")
    return labels
