r"""Single-shot person re-identification: the CMC curve over random probe/gallery splits.

The protocol of VIPeR / i-LIDS / CAVIAR / 3DPeS as used by DTML (Hu, Lu & Tan, CVPR 2015): in
each split every identity has one gallery image and one probe image; each probe ranks the whole
gallery, and the cumulative matching characteristic :math:`\mathrm{CMC}(r)` is the share of
probes whose true match is within the first :math:`r` gallery entries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from kdml.errors import KdmlError


def _as_array(x: Any, dtype: Any | None = None) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _pairwise_distances(probe: np.ndarray, gallery: np.ndarray, metric: str) -> np.ndarray:
    """Exact (P, G) distances; cosine distance is 1 - cosine (zero vectors: distance 1)."""
    from scipy.spatial.distance import cdist

    if metric == "euclidean":
        return cdist(probe, gallery, "euclidean")
    return 1.0 - _unit_rows(probe) @ _unit_rows(gallery).T


def _unit_rows(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def match_ranks(probe: Any, probe_ids: Any, gallery: Any, gallery_ids: Any,
                metric: str = "euclidean") -> np.ndarray:
    r"""1-based rank of each probe's true match in the gallery ordered by distance.

    Ties count against the probe: the rank is :math:`1 +` the number of *other* gallery entries
    at a distance :math:`\le` the true match's. Each probe identity must appear exactly once in
    the gallery (single shot).

    Args:
        probe, gallery: :math:`(P, D)` and :math:`(G, D)` embeddings.
        probe_ids, gallery_ids: :math:`(P,)` and :math:`(G,)` identity labels.
        metric: ``"euclidean"`` or ``"cosine"``. Default: ``"euclidean"``.

    Returns:
        int :math:`(P,)` ranks in :math:`1..G`.
    """
    probe_x, gallery_x = _as_array(probe, np.float64), _as_array(gallery, np.float64)
    probe_y, gallery_y = _as_array(probe_ids), _as_array(gallery_ids)
    if probe_x.ndim != 2 or gallery_x.ndim != 2 or probe_x.shape[1] != gallery_x.shape[1]:
        raise KdmlError(f"probe and gallery must be (P, D) and (G, D), got {probe_x.shape} and "
                        f"{gallery_x.shape}")
    if probe_y.shape != (len(probe_x),) or gallery_y.shape != (len(gallery_x),):
        raise KdmlError("identity labels must be 1-D and match the embeddings")
    if metric not in ("euclidean", "cosine"):
        raise KdmlError(f"metric must be euclidean or cosine, got {metric!r}")
    is_match = probe_y[:, None] == gallery_y[None, :]
    if (is_match.sum(axis=1) != 1).any():
        raise KdmlError("every probe identity must appear exactly once in the gallery")
    distances = _pairwise_distances(probe_x, gallery_x, metric)
    true_distance = distances[is_match][:, None]
    return 1 + ((distances <= true_distance) & ~is_match).sum(axis=1)


def cmc_curve(ranks: np.ndarray, gallery_size: int) -> np.ndarray:
    """:math:`\\mathrm{CMC}(r)` for :math:`r = 1..G`: the share of ranks :math:`\\le r`."""
    return (np.asarray(ranks)[:, None] <= np.arange(1, gallery_size + 1)[None, :]).mean(axis=0)


def _draw_split(images_by_identity: list[np.ndarray], cameras: np.ndarray | None,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One gallery and one (different) probe image index per identity."""
    gallery, probe = [], []
    for images in images_by_identity:
        if cameras is None:
            chosen = rng.choice(images, size=2, replace=False)
            gallery.append(chosen[0])
            probe.append(chosen[1])
            continue
        # gallery: any image that has a partner in another camera; probe: from another camera
        with_partner = [i for i in images if (cameras[images] != cameras[i]).any()]
        gallery_index = rng.choice(with_partner)
        others = images[cameras[images] != cameras[gallery_index]]
        gallery.append(gallery_index)
        probe.append(rng.choice(others))
    return np.array(gallery), np.array(probe)


def single_shot_cmc(embeddings: Any, identities: Any, cameras: Any | None = None,
                    num_splits: int = 10, ranks: Sequence[int] = (1, 5, 10, 20),
                    metric: str = "euclidean", seed: int = 0) -> dict[str, float]:
    r"""Mean single-shot CMC over ``num_splits`` random probe/gallery splits.

    In each split, for every eligible identity one gallery image and one different probe image
    are drawn uniformly (with ``cameras``: the probe from a different camera than the gallery
    image). Each probe ranks the :math:`G` gallery images (:func:`match_ranks`, ties counted
    against it), and

    .. math::
        \mathrm{CMC}(r) = \frac{1}{G}\sum_{p=1}^{G} [\mathrm{rank}_p \le r],

    averaged over the splits. Identities with a single image (with ``cameras``: images from a
    single camera) cannot form a probe/gallery pair and are left out. A requested rank larger
    than the gallery is clamped to :math:`G`, where the CMC is 1.

    Args:
        embeddings: :math:`(N, D)` test embeddings.
        identities: :math:`(N,)` identity labels.
        cameras: optional :math:`(N,)` camera ids.
        num_splits: random splits :math:`R`. Default: 10.
        ranks: the ranks to report. Default: ``(1, 5, 10, 20)``.
        metric: ``"euclidean"`` or ``"cosine"``. Default: ``"euclidean"``.
        seed: seed of the splits; the same inputs and seed give the same result.

    Returns:
        ``{"cmc@r": mean CMC(r) for r in ranks, "gallery_size": G}``.

    Example::

        >>> x = np.array([[0.0], [0.1], [5.0], [5.1], [9.0], [9.2]])
        >>> single_shot_cmc(x, [0, 0, 1, 1, 2, 2], num_splits=3, ranks=(1, 5))
        {'cmc@1': 1.0, 'cmc@5': 1.0, 'gallery_size': 3.0}
    """
    x, ids = _as_array(embeddings, np.float64), _as_array(identities)
    if x.ndim != 2 or ids.shape != (len(x),):
        raise KdmlError(f"embeddings must be (N, D) with (N,) identities, got {x.shape} and "
                        f"{ids.shape}")
    camera_array = None if cameras is None else _as_array(cameras)
    if camera_array is not None and camera_array.shape != ids.shape:
        raise KdmlError(f"cameras must have shape {ids.shape}, got {camera_array.shape}")
    if isinstance(num_splits, bool) or not isinstance(num_splits, int) or num_splits < 1:
        raise KdmlError(f"num_splits must be a positive integer, got {num_splits!r}")
    if not ranks or any(isinstance(r, bool) or not isinstance(r, int) or r < 1 for r in ranks):
        raise KdmlError(f"ranks must be positive integers, got {list(ranks)}")

    images_by_identity = []
    for identity in np.unique(ids):
        images = np.flatnonzero(ids == identity)
        usable = (len(images) >= 2 if camera_array is None
                  else len(np.unique(camera_array[images])) >= 2)
        if usable:
            images_by_identity.append(images)
    if not images_by_identity:
        need = "images from two cameras" if camera_array is not None else "two images"
        raise KdmlError(f"no identity has {need}; single-shot CMC needs probe/gallery pairs")
    gallery_size = len(images_by_identity)

    rng = np.random.default_rng(seed)
    curves = []
    for _ in range(num_splits):
        gallery, probe = _draw_split(images_by_identity, camera_array, rng)
        split_ranks = match_ranks(x[probe], ids[probe], x[gallery], ids[gallery], metric)
        curves.append(cmc_curve(split_ranks, gallery_size))
    mean_curve = np.mean(curves, axis=0)
    results = {f"cmc@{r}": float(mean_curve[min(r, gallery_size) - 1]) for r in ranks}
    results["gallery_size"] = float(gallery_size)
    return results
