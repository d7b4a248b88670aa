"""kdml's losses called as pytorch-metric-learning calls its losses."""

from __future__ import annotations

from torch import Tensor

from kdml.errors import KdmlError


def check_pml_call(owner: str, reason: str, labels: Tensor | None, indices_tuple: object,
                   ref_emb: object, ref_labels: object) -> Tensor:
    """The ``labels`` of a pytorch-metric-learning style call ``loss(embeddings, labels,
    indices_tuple=None, ref_emb=None, ref_labels=None)`` (what ``MultipleLosses`` makes),
    refusing in one line naming ``owner`` missing labels and the PML arguments kdml's losses do
    not use: a miner's ``indices_tuple`` and the reference batch ``ref_emb`` / ``ref_labels``
    (of ``CrossBatchMemory``). ``reason`` says why, e.g. "uses every pair of the batch"."""
    given = [name for name, value in (("indices_tuple", indices_tuple), ("ref_emb", ref_emb),
                                      ("ref_labels", ref_labels)) if value is not None]
    if given:
        raise KdmlError(f"{owner} {reason}, so it takes no {' or '.join(given)} (no miner, "
                        "reference batch or CrossBatchMemory); call it as "
                        "loss(embeddings, labels)")
    if labels is None:
        raise KdmlError(f"{owner} needs the batch's labels; call it as loss(embeddings, labels)")
    return labels
