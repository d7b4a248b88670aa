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

from kdml.checks import check_seed, is_positive_int
from kdml.errors import KdmlError
from kdml.evaluation.knn import (
    as_float_matrix,
    host_array,
    l2_normalize,
    search_scale,
)


def _as_array(x: Any, dtype: Any | None = None) -> np.ndarray:
    return np.asarray(host_array(x), dtype=dtype)


def _embeddings(x: Any, name: str) -> np.ndarray:
    """Validated float64 ``(N, D)`` embeddings (integer or binary codes are taken as floats): a
    NaN distance never counts as closer, so a NaN embedding would rank its true match first."""
    array = _as_array(x)
    if array.dtype.kind in "biu":
        array = array.astype(np.float64)
    return as_float_matrix(array, name).astype(np.float64, copy=False)


def _pairwise_distances(probe: np.ndarray, gallery: np.ndarray, metric: str) -> np.ndarray:
    """Exact (P, G) distances; cosine distance is 1 - cosine (zero vectors: distance 1)."""
    from scipy.spatial.distance import cdist

    if metric == "euclidean":
        return cdist(probe, gallery, "euclidean")
    return 1.0 - l2_normalize(probe, inplace=False) @ l2_normalize(gallery, inplace=False).T


# Distances this close are equal: float64 arithmetic leaves distances that are equal in exact
# arithmetic up to ~1e-16 apart (x and 2x, normalised). Relative to the true match's distance
# for the Euclidean metric (cdist's error is relative to each distance), absolute for the
# cosine distance 1 - cos (its error is relative to 1).
TIE_TOLERANCE = 1e-12


def match_ranks(probe: Any, probe_ids: Any, gallery: Any, gallery_ids: Any,
                metric: str = "euclidean") -> np.ndarray:
    r"""1-based rank of each probe's true match in the gallery ordered by distance.

    Ties count against the probe: the rank is :math:`1 +` the number of *other* gallery entries
    at a distance :math:`\le` the true match's, where distances within :data:`TIE_TOLERANCE`
    of each other count as equal (relative to the true match's distance for the Euclidean
    metric, absolute for the cosine distance), so distances equal in exact arithmetic, such as
    the cosine distances to a vector and to its double, tie. Each probe
    identity must appear exactly once in the gallery (single shot).

    Args:
        probe, gallery: :math:`(P, D)` and :math:`(G, D)` embeddings.
        probe_ids, gallery_ids: :math:`(P,)` and :math:`(G,)` identity labels.
        metric: ``"euclidean"`` or ``"cosine"``. Default: ``"euclidean"``.

    Returns:
        int :math:`(P,)` ranks in :math:`1..G`.
    """
    probe_x, gallery_x = _embeddings(probe, "probe"), _embeddings(gallery, "gallery")
    probe_y, gallery_y = _as_array(probe_ids), _as_array(gallery_ids)
    if probe_x.shape[1] != gallery_x.shape[1]:
        raise KdmlError(f"probe and gallery must be (P, D) and (G, D), got {probe_x.shape} and "
                        f"{gallery_x.shape}")
    if probe_y.shape != (len(probe_x),) or gallery_y.shape != (len(gallery_x),):
        raise KdmlError("identity labels must be 1-D and match the embeddings")
    if metric not in ("euclidean", "cosine"):
        raise KdmlError(f"metric must be euclidean or cosine, got {metric!r}")
    is_match = probe_y[:, None] == gallery_y[None, :]
    if (is_match.sum(axis=1) != 1).any():
        raise KdmlError("every probe identity must appear exactly once in the gallery")
    # by one power of two (exact): distances of 1e160-sized vectors overflow float64 (cosine
    # distances scale row by row, in l2_normalize: a shared power of two would make a row of
    # 1e-200 beside one of 1e200 a zero vector)
    units = search_scale(probe_x, gallery_x) if metric == "euclidean" else 1.0
    distances = _pairwise_distances(probe_x / units, gallery_x / units, metric)
    true_distance = distances[is_match][:, None]
    # per probe: one far gallery entry must not widen every probe's ties
    scale = np.maximum(true_distance, np.finfo(float).tiny) if metric == "euclidean" else 1.0
    tolerance = TIE_TOLERANCE * scale
    return 1 + ((distances <= true_distance + tolerance) & ~is_match).sum(axis=1)


def cmc_curve(ranks: np.ndarray, gallery_size: int) -> np.ndarray:
    """:math:`\\mathrm{CMC}(r)` for :math:`r = 1..G`: the share of ranks :math:`\\le r`."""
    return (np.asarray(ranks)[:, None] <= np.arange(1, gallery_size + 1)[None, :]).mean(axis=0)


def _draw_split(images_by_identity: list[np.ndarray], probe_images: list[np.ndarray] | None,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """One gallery and one (different) probe image index per identity: drawn from the
    identity's gallery-camera and probe-camera images when ``probe_images`` is given, else two
    of its images."""
    gallery, probe = [], []
    for number, images in enumerate(images_by_identity):
        if probe_images is None:
            chosen = rng.choice(images, size=2, replace=False)
            gallery.append(chosen[0])
            probe.append(chosen[1])
        else:
            gallery.append(rng.choice(images))
            probe.append(rng.choice(probe_images[number]))
    return np.array(gallery), np.array(probe)


def single_shot_cmc(embeddings: Any, identities: Any, cameras: Any | None = None,
                    num_splits: int = 10, ranks: Sequence[int] = (1, 5, 10, 20),
                    metric: str = "euclidean", seed: int = 0) -> dict[str, float]:
    r"""Mean single-shot CMC over ``num_splits`` random probe/gallery splits.

    Without ``cameras``, every split draws for each identity one gallery image and one
    different probe image. With ``cameras`` (exactly two, as VIPeR's A and B), the roles are
    fixed, as in the VIPeR protocol: the probes come from camera A and the gallery from camera
    B, then the reverse, and the two CMCs are averaged; each direction of a split draws its own
    image per identity and camera (VIPeR has one, so both directions use the same pair). Each
    probe ranks the :math:`G` gallery images (:func:`match_ranks`, ties counted against it),
    and

    .. math::
        \mathrm{CMC}(r) = \frac{1}{G}\sum_{p=1}^{G} [\mathrm{rank}_p \le r],

    averaged over the splits (and the two directions). Identities with a single image (with
    ``cameras``: without an image in each camera) cannot form a probe/gallery pair and are left
    out; at least two identities must remain (a gallery of one, where the CMC is 1 at every
    rank, is refused), and NaN identities are refused. A requested rank larger than the
    gallery is clamped to :math:`G`, where the CMC is 1.

    Args:
        embeddings: :math:`(N, D)` test embeddings.
        identities: :math:`(N,)` identity labels.
        cameras: optional :math:`(N,)` camera ids, two distinct values (A = the smaller).
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
    x, ids = _embeddings(embeddings, "embeddings"), _as_array(identities)
    if ids.shape != (len(x),):
        raise KdmlError(f"embeddings must be (N, D) with (N,) identities, got {x.shape} and "
                        f"{ids.shape}")
    if ids.dtype.kind == "f" and not np.isfinite(ids).all():
        # a NaN equals no identity, not even its own: its images had been left out silently
        raise KdmlError("identities contain NaN or infinite values")
    camera_array = None if cameras is None else _as_array(cameras)
    if camera_array is not None and camera_array.shape != ids.shape:
        raise KdmlError(f"cameras must have shape {ids.shape}, got {camera_array.shape}")
    if camera_array is not None and len(np.unique(camera_array)) != 2:
        raise KdmlError(f"single-shot CMC with camera roles needs exactly two cameras, got "
                        f"{len(np.unique(camera_array))}; pass cameras=None for other sets")
    if not is_positive_int(num_splits):
        raise KdmlError(f"num_splits must be a positive integer, got {num_splits!r}")
    check_seed(seed)
    if (not isinstance(ranks, Sequence | np.ndarray) or np.ndim(ranks) != 1 or not len(ranks)
            or not all(is_positive_int(r) for r in ranks)):
        raise KdmlError(f"ranks must be a sequence of positive integers, e.g. (1, 5), got "
                        f"{ranks!r}")

    # (gallery images, probe images or None) per identity, for each direction
    directions: list[tuple[list[np.ndarray], list[np.ndarray] | None]] = []
    if camera_array is None:
        usable = [images for identity in np.unique(ids)
                  if len(images := np.flatnonzero(ids == identity)) >= 2]
        directions.append((usable, None))
    else:
        camera_a, camera_b = np.unique(camera_array)
        per_camera = [(np.flatnonzero((ids == identity) & (camera_array == camera_a)),
                       np.flatnonzero((ids == identity) & (camera_array == camera_b)))
                      for identity in np.unique(ids)]
        pairs = [(a, b) for a, b in per_camera if len(a) and len(b)]
        directions.append(([b for _, b in pairs], [a for a, _ in pairs]))  # probe A, gallery B
        directions.append(([a for a, _ in pairs], [b for _, b in pairs]))  # the reverse
    gallery_size = len(directions[0][0])
    need = "an image in each camera" if camera_array is not None else "two images"
    if not gallery_size:
        raise KdmlError(f"no identity has {need}; single-shot CMC needs probe/gallery pairs")
    if gallery_size == 1:  # its one probe ranks its match first: 1 at every rank, whatever x
        raise KdmlError(f"only one identity has {need}, a gallery of one, where the CMC is 1 at "
                        "every rank; single-shot CMC needs at least two probe/gallery pairs")

    rng = np.random.default_rng(seed)
    curves = []
    for _ in range(num_splits):
        for gallery_images, probe_images in directions:
            gallery, probe = _draw_split(gallery_images, probe_images, rng)
            split_ranks = match_ranks(x[probe], ids[probe], x[gallery], ids[gallery], metric)
            curves.append(cmc_curve(split_ranks, gallery_size))
    mean_curve = np.mean(curves, axis=0)
    results = {f"cmc@{r}": float(mean_curve[min(r, gallery_size) - 1]) for r in ranks}
    results["gallery_size"] = float(gallery_size)
    return results
