r"""Source/target domain pairs for transfer metric learning (DTML, Hu, Lu & Tan, CVPR 2015).

A :class:`DomainPair` holds a labelled source set and a target set. The target's labels are
for evaluation only: a trainer must not use them (``-1`` marks a target sample whose label is
unknown).

Built-in pairs (offline):

- ``mnist5k->digits``: source = the 5,000 MNIST digits converted to the UCI optdigits format
  (:func:`mnist_to_optdigits`), target = scikit-learn's ``load_digits()`` (UCI optdigits);
- ``digits->mnist5k``: the reverse.

Both sides are 64-d block counts in 0..16, divided by 16 (the same scaling for both domains)
so the features lie in [0, 1].

Pre-extracted features (such as the paper's LBP features) load from an ``.npz`` file with
:func:`load_feature_domains`; :func:`fit_source_pca` reduces them as the paper does.
"""

from __future__ import annotations

import functools
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from kdml.checks import is_positive_int
from kdml.data import offline
from kdml.data.dataset import ArrayDataset
from kdml.data.registry import PATH_FORMATS
from kdml.errors import KdmlError, UnreadableCheckpoint, counted, did_you_mean, why_missing

# Binarisation threshold of the 32x32 bitmap, on intensities in [0, 1]. The mean amount of ink
# is the reason for 0.35: converted MNIST then has ~309 on-pixels per digit against ~313 in
# optdigits (0.5 gives ~266: thinner strokes). 1-NN transfer accuracy is flat between 0.25 and
# 0.5 (79-80% for mnist5k->digits), so the choice is not critical.
BINARIZE_THRESHOLD = 0.35
BITMAP_SIZE = 32  # optdigits' normalised bitmap
BLOCK_SIZE = 4  # 4x4 blocks -> an 8x8 grid of counts in 0..16
FEATURE_SCALE = 16.0  # counts / 16 -> [0, 1], for both domains


@dataclass
class DomainPair:
    """A labelled source domain and a target domain sharing one feature space.

    Args:
        source: labelled source samples, ``x`` [Ns, D], labels >= 0.
        target: target samples, ``x`` [Nt, D]; ``y`` are evaluation labels only (-1 = unknown).
        name: e.g. ``"mnist5k->digits"``.
        description: one line.
    """

    source: ArrayDataset
    target: ArrayDataset
    name: str
    description: str
    # The PCA both sides were projected by (fit_source_pca), which raw inputs go through too.
    pca: SourcePCA | None = None

    @property
    def feature_size(self) -> int:
        return int(self.source.x.shape[1])


# ----------------------------------------------------------------------------- MNIST -> optdigits


def _to_unit_images(images: Any) -> torch.Tensor:
    """[N, H, W] (or [N, 1, H, W], or [N, 784]), uint8 0..255 or float 0..1 -> float [N, H, W]."""
    tensor = images if isinstance(images, torch.Tensor) else torch.as_tensor(np.asarray(images))
    if tensor.dtype == torch.uint8:
        tensor = tensor.float() / 255.0
    elif tensor.is_floating_point():
        tensor = tensor.float()
        # NaN fails both comparisons: its strokes would have counted as no ink
        if tensor.numel() and not bool(((tensor >= 0) & (tensor <= 1)).all()):
            found = ("NaN" if bool(tensor.isnan().any()) else
                     f"values from {float(tensor.min()):.4g} to {float(tensor.max()):.4g}")
            raise KdmlError(f"float images must be in [0, 1] (uint8 images may be 0..255); "
                            f"these hold {found}")
    else:
        raise KdmlError(f"images must be uint8 or float, got {tensor.dtype}")
    if tensor.ndim == 4 and tensor.shape[1] == 1:
        tensor = tensor[:, 0]
    if tensor.ndim == 2 and tensor.shape[1] == 28 * 28:
        tensor = tensor.reshape(-1, 28, 28)
    if tensor.ndim != 3:
        raise KdmlError(f"expected images [N, H, W], got shape {tuple(tensor.shape)}")
    return tensor


def bitmap_to_optdigits(image: torch.Tensor, threshold: float = BINARIZE_THRESHOLD) -> torch.Tensor:
    """One grey image [H, W] in [0, 1] -> its 64 optdigits block counts (float, 0..16).

    The steps of :func:`mnist_to_optdigits`; an image without on-pixels gives zeros.
    """
    on = image >= threshold
    rows, cols = torch.nonzero(on.any(dim=1)).flatten(), torch.nonzero(on.any(dim=0)).flatten()
    if len(rows) == 0:
        return image.new_zeros(64)
    crop = image[rows[0]: rows[-1] + 1, cols[0]: cols[-1] + 1]
    height, width = crop.shape
    side = max(height, width)
    top, left = (side - height) // 2, (side - width) // 2  # odd leftover goes bottom/right
    square = F.pad(crop, (left, side - width - left, top, side - height - top))
    # Bilinear with antialias: a triangle filter when enlarging (MNIST boxes are <= 28 < 32),
    # a proper low-pass when shrinking larger inputs.
    bitmap = F.interpolate(square[None, None], size=(BITMAP_SIZE, BITMAP_SIZE), mode="bilinear",
                           antialias=True, align_corners=False)[0, 0]
    blocks = (bitmap >= threshold).float()
    grid = BITMAP_SIZE // BLOCK_SIZE
    return blocks.reshape(grid, BLOCK_SIZE, grid, BLOCK_SIZE).sum(dim=(1, 3)).flatten()


def mnist_to_optdigits(images: Any, threshold: float = BINARIZE_THRESHOLD) -> torch.Tensor:
    r"""Bring MNIST digits to the UCI optdigits format, the way optdigits was made.

    Optdigits (Alpaydin & Kaynak, 1998) size-normalised each handwritten digit to a 32x32
    bitmap, cut it into 4x4 blocks and counted the on-pixels per block, giving an 8x8 grid of
    counts in 0..16. Here, per image:

    1. crop to the bounding box of the pixels :math:`\ge` ``threshold``;
    2. pad the shorter side with zeros to a square, centred (aspect ratio kept);
    3. resize to 32x32 (bilinear, antialiased);
    4. binarize: on where the intensity is :math:`\ge` ``threshold`` (0.35 by default, which
       matches optdigits' average amount of ink);
    5. count the on-pixels of each 4x4 block, row-major.

    Area-resizing the whole 28x28 frame to 8x8 instead keeps MNIST's margins and its
    20x20-box normalisation, so the digits do not line up with optdigits'.

    Args:
        images: :math:`(N, 28, 28)` (also :math:`(N, 1, H, W)` or :math:`(N, 784)`), uint8
            0..255 or float in [0, 1].
        threshold: intensity threshold in (0, 1) for the bounding box and the bitmap.

    Returns:
        float32 :math:`(N, 64)` block counts, integers in 0..16.

    Example::

        >>> image = torch.zeros(28, 28)
        >>> image[3:11, 15:23] = 1.0  # an 8x8 square -> fills the whole 32x32 bitmap
        >>> mnist_to_optdigits(image[None]).unique().tolist()
        [16.0]
    """
    if not 0 < threshold < 1:
        raise KdmlError(f"threshold must be in (0, 1), got {threshold}")
    unit_images = _to_unit_images(images)
    if len(unit_images) == 0:
        return torch.zeros(0, 64)
    return torch.stack([bitmap_to_optdigits(image, threshold) for image in unit_images])


# ----------------------------------------------------------------------------- built-in pairs


@functools.lru_cache(maxsize=1)
def _mnist5k_counts() -> tuple[torch.Tensor, torch.Tensor]:
    """The converted MNIST 5k, cached: loading and converting takes a few seconds."""
    images, labels = offline.load_mnist5k()
    return mnist_to_optdigits(images[:, 0]), labels


def _mnist5k_as_optdigits() -> ArrayDataset:
    counts, labels = _mnist5k_counts()
    return ArrayDataset("mnist5k-optdigits", "MNIST 5k in the optdigits format, 64-d in [0, 1]",
                        counts / FEATURE_SCALE, labels.clone())


def _digits_vectors() -> ArrayDataset:
    counts, labels = offline.read_optdigits()
    return ArrayDataset("digits", "UCI optdigits (scikit-learn), 64-d in [0, 1]",
                        torch.from_numpy(counts.astype(np.float32) / FEATURE_SCALE),
                        torch.from_numpy(labels.astype(np.int64)))


@dataclass(frozen=True)
class DomainPairEntry:
    name: str
    description: str
    loader: Callable[[], tuple[ArrayDataset, ArrayDataset]]


DOMAIN_PAIRS: dict[str, DomainPairEntry] = {
    entry.name: entry
    for entry in (
        DomainPairEntry("mnist5k->digits",
                        "MNIST 5k (converted to optdigits' 8x8 counts) -> UCI optdigits; 64-d",
                        lambda: (_mnist5k_as_optdigits(), _digits_vectors())),
        DomainPairEntry("digits->mnist5k",
                        "UCI optdigits -> MNIST 5k (converted to optdigits' 8x8 counts); 64-d",
                        lambda: (_digits_vectors(), _mnist5k_as_optdigits())),
    )
}


def load_domain_pair(name: str) -> DomainPair:
    """Load a registered domain pair; an unknown name lists the valid ones."""
    if name not in DOMAIN_PAIRS:
        # spaces around the arrow, a longer arrow or capitals had named no pair to mean
        near = did_you_mean(name, DOMAIN_PAIRS)
        raise KdmlError(f"unknown domain pair {name!r}{near}; choose one of: "
                        f"{', '.join(DOMAIN_PAIRS)}, "
                        "or npz:FILE for domains of one's own (a .npz of both domains' "
                        "features: X, y, domain)")
    entry = DOMAIN_PAIRS[name]
    source, target = entry.loader()
    return DomainPair(source, target, entry.name, entry.description)


# ----------------------------------------------------------------------------- .npz features

SOURCE_NAMES, TARGET_NAMES = ("source", "0"), ("target", "1")


def load_feature_domains(path: str | Path) -> DomainPair:
    """Load pre-extracted features of two domains from one ``.npz`` file.

    The file holds three arrays (``numpy.savez(path, X=..., y=..., domain=...)``):

    - ``X``: :math:`(N, D)` float features, finite;
    - ``y``: :math:`(N,)` integer labels, ``-1`` for an unlabelled sample. Every source sample
      must be labelled; target labels are used for evaluation only and may all be ``-1``;
    - ``domain``: :math:`(N,)` per-sample domain, either strings ``"source"`` / ``"target"`` or
      integers ``0`` (source) / ``1`` (target).

    Files are read with ``allow_pickle=False`` (no object arrays). Every problem raises a
    one-line :class:`~kdml.errors.KdmlError`.

    Returns:
        A :class:`DomainPair` named after the file's stem; samples keep their file order.
    """
    path = Path(path)
    if path.is_dir():  # a folder of images, most likely: folder: reads those
        raise KdmlError(f"feature file {path} is a folder; give the .npz file (npz:FILE), or "
                        f"for a folder of images, one sub-folder per class, --dataset "
                        f"folder:{path}")
    if not path.is_file():
        raise KdmlError(f"feature file {path} {why_missing(path, 'file')}")
    # Look at the file's kind first: np.load takes anything else for a pickle and advises
    # loading it unsafely, which is wrong here.
    with path.open("rb") as stream:
        is_npy = stream.read(6) == b"\x93NUMPY"
    if is_npy or not zipfile.is_zipfile(path):
        what = "a single .npy array, not an .npz archive" if is_npy else (
            "not an .npz archive (not a whole zip file)")
        raise KdmlError(f"{path} is {what}; save the features with "
                        "numpy.savez(path, X=..., y=..., domain=...)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: _member(archive, key, path) for key in archive.files}
    except KdmlError:  # a ValueError too: not to be caught just below
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise KdmlError(f"{path} is not a readable .npz file without object arrays "
                        f"({(str(error) or 'empty').splitlines()[0]})") from None
    missing = [key for key in ("X", "y", "domain") if key not in arrays]
    if missing:
        raise KdmlError(f"{path} lacks the array(s) {', '.join(missing)}; it needs X [N, D], "
                        "y [N] and domain [N]")
    # np.load hands back a member that is not an .npy file as raw bytes.
    raw = [key for key in ("X", "y", "domain") if not isinstance(arrays[key], np.ndarray)]
    if raw:
        raise KdmlError(f"{path}: {', '.join(raw)} not saved as numpy arrays; save the features "
                        "with numpy.savez(path, X=..., y=..., domain=...)")
    features, labels, domains = arrays["X"], arrays["y"], arrays["domain"]
    if features.ndim != 2 or features.dtype.kind not in "fiu" or 0 in features.shape:
        raise KdmlError(f"{path}: X must be a non-empty numeric [N, D] array, got shape "
                        f"{features.shape} and dtype {features.dtype}")
    num_samples = len(features)
    for key, array in (("y", labels), ("domain", domains)):
        if array.shape != (num_samples,):
            raise KdmlError(f"{path}: {key} must have shape ({num_samples},) to match X, "
                            f"got {array.shape}")
    if labels.dtype.kind not in "iu":
        raise KdmlError(f"{path}: y must be integers (-1 = unlabelled), got dtype "
                        f"{labels.dtype}; save it as y.astype(int) if its values are whole "
                        "numbers")
    if labels.dtype.kind == "u" and labels.size and labels.max() > np.iinfo(np.int64).max:
        # int64 is what training uses, and the cast would wrap an unsigned -1 back to -1
        raise KdmlError(f"{path}: y holds {labels.max()}, beyond int64's range; save -1 "
                        "(unlabelled) as a signed integer: y.astype(np.int64)")
    labels = labels.astype(np.int64)
    if not np.isfinite(features).all():
        raise KdmlError(f"{path}: X contains NaN or infinite values")
    with np.errstate(over="ignore"):  # an overflow is reported just below, in one line
        features = features.astype(np.float32)  # what training uses: check it after the cast
    if not np.isfinite(features).all():
        raise KdmlError(f"{path}: X holds values beyond float32's range (|x| > 3.4e38); "
                        "rescale the features")
    if (labels < -1).any():
        raise KdmlError(f"{path}: labels must be >= 0, or -1 for unlabelled")
    is_source = _parse_domains(domains, path)
    if not is_source.any() or is_source.all():
        raise KdmlError(f"{path}: needs samples of both domains, got {int(is_source.sum())} "
                        f"source and {int((~is_source).sum())} target")
    if (labels[is_source] < 0).any():
        unlabelled = int((labels[is_source] < 0).sum())
        raise KdmlError(f"{path}: {counted(unlabelled, 'source sample')} "
                        f"{'is' if unlabelled == 1 else 'are'} unlabelled (y < 0); every source "
                        "sample needs a label")
    x = torch.from_numpy(features)
    y = torch.from_numpy(labels)
    description = f"features from {path.name}"
    source = ArrayDataset(f"{path.stem}/source", description, x[is_source], y[is_source])
    target = ArrayDataset(f"{path.stem}/target", description, x[~is_source], y[~is_source])
    return DomainPair(source, target, path.stem, description)


# What to save an object array as: strings for domain, the numeric dtype the others need.
OBJECT_FIXES = {"domain": "domain.astype(str)", "y": "y.astype(int)", "X": "X.astype(np.float32)"}


def _member(archive: Any, key: str, path: Path) -> Any:
    """The array ``key`` of an open .npz; an object array (pandas' ``.values`` of a text
    column) is refused by name: np.load would unpickle it, which can run code."""
    try:
        return archive[key]
    except ValueError as error:
        if "allow_pickle" not in str(error):
            raise
        fix = OBJECT_FIXES.get(key, f"{key} with a numeric or string dtype")
        raise KdmlError(f"{path}: the array {key!r} holds Python objects (dtype object, as "
                        "pandas' .values gives), and kdml reads no object arrays (loading one "
                        f"can run code); save it as {fix}") from None


def _parse_domains(domains: np.ndarray, path: Path) -> np.ndarray:
    """The ``domain`` array -> a bool mask of the source samples."""
    if domains.dtype.kind not in "USiu":
        raise KdmlError(f"{path}: domain must hold strings source/target or integers 0/1, "
                        f"got dtype {domains.dtype}")
    names = np.char.lower(np.char.strip(domains.astype(str)))
    unknown = sorted(set(names.tolist()) - set(SOURCE_NAMES) - set(TARGET_NAMES))
    if unknown:
        raise KdmlError(f"{path}: unknown domain value(s) {unknown[:3]}; use source/target or "
                        "0/1")
    return np.isin(names, SOURCE_NAMES)


# ----------------------------------------------------------------------------- PCA


@dataclass(frozen=True, eq=False)  # arrays: compared by identity, as a fitted model is
class SourcePCA:
    """A PCA fitted on a domain pair's source samples (:func:`fit_source_pca`; scikit-learn's,
    centred on the source mean, no whitening), kept as its two arrays: ``mean`` ``[D]`` and
    ``components`` ``[dim, D]``, float64. A run keeps them in its checkpoints
    (:meth:`to_state`), so that its model takes raw inputs without its data."""

    mean: np.ndarray
    components: np.ndarray

    @property
    def feature_size(self) -> int:
        return int(self.components.shape[1])

    @property
    def dim(self) -> int:
        return int(self.components.shape[0])

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` ``[N, D]`` (or ``[N, ...]``, flattened) -> float32 ``[N, dim]``, in float64 on
        the way, as the training samples were projected."""
        # scikit-learn's PCA.transform, written out (it is this product, centred after the
        # projection) so that a PCA read back from a checkpoint, which is no fitted scikit-learn
        # object, projects bit for bit as the fitted one did
        features = x.flatten(1).double().numpy()
        reduced = features @ self.components.T - self.mean[None] @ self.components.T
        return torch.from_numpy(reduced.astype(np.float32))

    def to_state(self) -> dict[str, torch.Tensor]:
        """The arrays as tensors, for a checkpoint (:meth:`from_state` reads them back)."""
        return {"mean": torch.from_numpy(self.mean.copy()),
                "components": torch.from_numpy(self.components.copy())}

    @classmethod
    def from_state(cls, state: object, checkpoint: str) -> SourcePCA:
        """The PCA :meth:`to_state` wrote; anything else (a damaged checkpoint) is refused in
        one line naming the ``checkpoint`` it was read from."""
        arrays = state if isinstance(state, dict) else {}
        mean, components = arrays.get("mean"), arrays.get("components")
        if not (isinstance(mean, torch.Tensor) and isinstance(components, torch.Tensor)
                and mean.dtype == components.dtype == torch.float64 and mean.ndim == 1
                and components.ndim == 2 and components.shape[1] == len(mean) > 0
                and len(components) > 0 and bool(torch.isfinite(mean).all())
                and bool(torch.isfinite(components).all())):
            raise UnreadableCheckpoint(
                f"checkpoint {checkpoint} is damaged: its input PCA is not the finite float64 "
                "mean [D] and components [dim, D] kdml writes; delete it and train again")
        return cls(mean.numpy(), components.numpy())


def fit_source_pca(pair: DomainPair, dim: int) -> DomainPair:
    """Project both domains on the top ``dim`` principal components of the *source* samples.

    As in the paper (LBP features reduced to 500-d): the PCA (scikit-learn, centred on the
    source mean, no whitening) sees no target sample, so nothing about the target leaks into
    the features.

    Args:
        pair: the domains, ``x`` of shape [N, D] on both sides.
        dim: output size, between 1 and ``min(Ns, D)``.

    Returns:
        A new :class:`DomainPair` (labels unchanged) named ``"<name>+pca<dim>"``, with the
        fitted PCA as its ``pca`` (:class:`SourcePCA`).
    """
    from sklearn.decomposition import PCA

    source_x = pair.source.x.flatten(1).double().numpy()
    limit = min(source_x.shape)
    if not (is_positive_int(dim) and dim <= limit):
        raise KdmlError(f"PCA dim must be an integer from 1 to {limit} (min of source samples "
                        f"and features), got {dim!r}")
    fitted = PCA(n_components=dim, svd_solver="full").fit(source_x)
    # C order, as a checkpoint's tensors read back: the product's rounding follows the layout
    pca = SourcePCA(np.ascontiguousarray(fitted.mean_), np.ascontiguousarray(fitted.components_))
    return projected_pair(pair, pca, "fitted on the source")


def projected_pair(pair: DomainPair, pca: SourcePCA, fitted_on: str) -> DomainPair:
    """Both domains of ``pair`` projected by ``pca`` (``fitted_on``: which source, in the
    description), which it keeps as its ``pca``; features of another size are refused."""
    if pair.feature_size != pca.feature_size:
        raise KdmlError(f"{pair.name} has {pair.feature_size} features a sample, but the PCA "
                        f"({fitted_on}) takes {pca.feature_size}: give a domain pair of its "
                        "features")

    def project(dataset: ArrayDataset) -> ArrayDataset:
        return ArrayDataset(dataset.name, f"{dataset.description}, PCA {pca.dim} (source-fitted)",
                            pca.project(dataset.x), dataset.y, dataset.default_backbone)

    return DomainPair(project(pair.source), project(pair.target), f"{pair.name}+pca{pca.dim}",
                      f"{pair.description}; PCA to {pca.dim}-d {fitted_on}", pca)


def is_domain_dataset(name: str) -> bool:
    """True for a domain pair (``SOURCE->TARGET``) or a feature file (``npz:PATH``). A name
    with a path prefix (``folder:``, ``csv:``, ``npz:``) is that path, whatever characters
    it holds: ``folder:/data/im->gs`` is a folder, not a pair."""
    if name.startswith(tuple(PATH_FORMATS)):
        return name.startswith("npz:")
    return "->" in name


def load_domain_data(name: str) -> DomainPair:
    """A registered domain pair by name, or the two domains of a ``npz:PATH`` feature file."""
    if name.startswith("npz:"):
        if not name.removeprefix("npz:").strip():  # Path("") would be the current folder
            raise KdmlError("npz: needs a path: --dataset npz:FILE (a .npz of X, y, domain)")
        return load_feature_domains(name.removeprefix("npz:"))
    return load_domain_pair(name)
