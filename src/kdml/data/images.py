"""Image files decoded on demand with Pillow, in the data-loading workers.

Each image is decoded to RGB, its short side resized to ``resize`` (bilinear, antialiased, as
torchvision's ``Resize``) and the long side centre-cropped to a ``resize x resize`` square, so
that a batch is one uint8 tensor. The random resized crop, the flip and the test-time centre
crop to ``data.image_size`` then run on whole batches on the training device
(:mod:`kdml.data.transforms`).

The square crop is a departure from torchvision's pipelines, which crop the training image from
the whole resized image: here the long side's margins beyond the centred square are never seen
(for CUB's typical 4:3 photos, 1/8 of the width on each side). At test time it changes nothing
but rounding: ``Resize(256)`` then ``CenterCrop(224)`` equals the square crop then the centre
crop, up to a pixel (torchvision truncates the resized long side, kdml rounds it; the crops'
offsets round differently for some widths).
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps, UnidentifiedImageError
from torch import Tensor

from kdml.checks import whole_number_labels
from kdml.data.dataset import Batch, DmlDataset
from kdml.errors import KdmlError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff", ".ppm",
                    ".pgm")
DEFAULT_RESIZE = 256

# What Pillow raises for a file that is not a decodable image: unknown format, truncated data,
# a decoder error, or a file that vanished.
DECODE_ERRORS = (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError)


# The modes Pillow opens 16-bit grey images in ("I" also holds 32-bit integers).
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def eight_bit(image: Image.Image) -> Image.Image:
    """``image`` with 8-bit values: 16-bit grey is scaled by 255 / 65535 and rounded.

    Pillow's own ``convert("L")`` or ``convert("RGB")`` clips 16-bit values at 255, which
    turns all but the darkest pixels white. Images of 32-bit floats, and 32-bit integers beyond
    16 bits, have no standard range, so they are refused (ValueError, a decode error).
    """
    if image.mode == "F":
        raise ValueError("32-bit float pixels have no standard range: save the image with 8 or "
                         "16 bits per channel")
    if image.mode not in SIXTEEN_BIT_MODES:
        return image
    values = np.asarray(image).astype(np.int64)
    if values.size and (values.min() < 0 or values.max() > 65535):
        raise ValueError("32-bit integer pixels beyond 0..65535 have no standard range: save "
                         "the image with 8 or 16 bits per channel")
    return Image.fromarray(((values * 255 + 32767) // 65535).astype(np.uint8), "L")


@contextmanager
def _without_pillow_advice() -> Iterator[None]:
    """Silence Pillow's warnings about how a readable image was saved, advice to whoever saved
    it that a kdml user cannot act on (it had printed Python's two-line warning once per image,
    in every loader worker, one glued to the end of a run's last line): among them
    ``DecompressionBombWarning``, for 89 to 179 megapixels, which are decoded all the same
    (beyond, ``DecompressionBombError`` refuses the image), "Palette images with Transparency
    expressed in bytes should be converted to RGBA", which the RGB conversion drops, as it
    drops any image's alpha, and a TIFF's or EXIF's damaged metadata ("Tag data larger than
    file", "Corrupt EXIF data"), which Pillow skips. An image whose pixels do not decode is
    an error, not a warning, and is still reported."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module=r"PIL(\.|$)")
        yield


def load_image(path: str | Path, size: int) -> Tensor:
    """Decode ``path`` to RGB, resize its short side to ``size`` and centre-crop a square.

    For JPEGs, Pillow's ``draft`` first lets the decoder downscale by a power of two in the DCT
    domain while both sides stay at least ``size`` (what ``Image.thumbnail`` does); the
    antialiased resize then brings the short side to ``size`` exactly. This decodes large
    photos several times faster and changes the result only by the resampling of that last
    step.

    Returns:
        uint8 ``[3, size, size]``.
    """
    with _without_pillow_advice(), Image.open(path) as opened:
        opened.draft("RGB", (size, size))
        image = eight_bit(opened).convert("RGB")
        width, height = image.size
        scale = size / min(width, height)
        new_size = (max(size, round(width * scale)), max(size, round(height * scale)))
        left, top = (new_size[0] - size) // 2, (new_size[1] - size) // 2
        # Resample only the square that the crop of the resized image would keep (``box`` maps
        # it back to source coordinates with each axis's own scale): the pixels of
        # resize-then-crop to within one grey level, about 10% faster (margins not resampled).
        x_scale, y_scale = width / new_size[0], height / new_size[1]
        box = (left * x_scale, top * y_scale, (left + size) * x_scale, (top + size) * y_scale)
        image = image.resize((size, size), Image.Resampling.BILINEAR, box=box)
        pixels = np.array(image, dtype=np.uint8)  # a writable copy, so no second one
    return torch.from_numpy(pixels).permute(2, 0, 1)


def load_image_as(path: str | Path, shape: tuple[int, ...]) -> Tensor:
    """Decode ``path`` like the samples of an in-memory image dataset of ``shape``.

    Args:
        path: any image Pillow reads.
        shape: ``(C, H, W)`` with C = 1 (decoded to grey) or 3 (RGB).

    Returns:
        uint8 ``[C, H, W]``: scaled to the target's aspect ratio, centre-cropped and resized
        (Pillow's ``ImageOps.fit``), so the batch transform scales it to [0, 1] like the data.
    """
    channels, height, width = shape
    with _without_pillow_advice(), Image.open(path) as opened:
        image = ImageOps.fit(eight_bit(opened).convert("L" if channels == 1 else "RGB"),
                             (width, height), Image.Resampling.BILINEAR)
        pixels = np.array(image, dtype=np.uint8).reshape(height, width, channels)
    return torch.from_numpy(pixels).permute(2, 0, 1).contiguous()


@dataclass(frozen=True)
class ListedAt:
    """Where each image of an :class:`ImageFiles` is listed, for its unreadable-image error and
    warning: the list file and the line (Cars196: annotation) number, as a missing listed image
    is reported (:func:`kdml.data.formats.common.place`), so that the row to fix is found in a
    list of 120,053. Two small arrays, not a string per image.

    Args:
        files: the list files' names, e.g. ``("Ebay_train.txt", "Ebay_test.txt")``.
        file_of: ``[N]`` each image's list file, an index into ``files``.
        numbers: ``[N]`` each image's 1-based line (or annotation) number in its file.
        unit: what is counted: ``"line"`` or ``"annotation"``.
    """

    files: tuple[str, ...]
    file_of: np.ndarray
    numbers: np.ndarray
    unit: str = "line"

    def of(self, index: int) -> str:
        """Image ``index``'s place, e.g. ``"images.txt line 5"``."""
        return f"{self.files[int(self.file_of[index])]} {self.unit} {int(self.numbers[index])}"

    def subset(self, indices: np.ndarray) -> ListedAt:
        return dataclasses.replace(self, file_of=self.file_of[indices],
                                   numbers=self.numbers[indices])


@dataclass
class ImageFiles(DmlDataset):
    """Image files and their labels.

    Args:
        name: e.g. ``"cub"`` or ``"folder:photos"``.
        description: one line.
        paths: absolute file paths ``[N]`` (a NumPy string array: worker processes read it
            without the copy-on-access of a Python list of strings).
        labels: integer labels ``[N]``.
        resize: side of the square uint8 images the loader yields (``data.resize``).
        default_backbone: the backbone ``"auto"`` resolves to.
        class_names: label -> class name, where the files name their classes.
        listed_at: where each file is listed (a list file and its line), for messages;
            ``None`` where the images are found in folders, not listed.
    """

    name: str
    description: str
    paths: np.ndarray
    labels: Tensor
    resize: int = DEFAULT_RESIZE
    default_backbone: str = "cnn"
    class_names: dict[int, str] | None = None
    listed_at: ListedAt | None = None

    def __post_init__(self) -> None:
        self.paths = np.asarray(self.paths, dtype=str)
        self.labels = whole_number_labels(self.name, self.labels)
        if self.paths.shape != (len(self.labels),):
            raise KdmlError(f"{self.name}: {len(self.paths)} paths but {len(self.labels)} labels")
        if self.listed_at is not None and self.listed_at.numbers.shape != self.paths.shape:
            raise KdmlError(f"{self.name}: {len(self.paths)} paths but "
                            f"{len(self.listed_at.numbers)} list places")

    def load(self, index: int) -> Tensor:
        return load_image(self.paths[index], self.resize)

    def source_of(self, index: int) -> str:
        return str(self.paths[index])

    def place_of(self, index: int) -> str:
        return self.listed_at.of(index) if self.listed_at is not None else ""

    def __getitems__(self, indices: Sequence[int]) -> Batch:
        index_tensor = torch.as_tensor(indices, dtype=torch.long)
        images = torch.zeros(len(index_tensor), 3, self.resize, self.resize, dtype=torch.uint8)
        unreadable = torch.zeros(len(index_tensor), dtype=torch.bool)
        for row, index in enumerate(index_tensor.tolist()):
            try:
                images[row] = self.load(index)
            except DECODE_ERRORS:  # reported by the trainer with the file's name
                unreadable[row] = True
        return Batch(images, self.labels[index_tensor], index_tensor, unreadable)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        return (3, self.resize, self.resize)

    @property
    def is_file_backed(self) -> bool:
        return True

    def subset(self, indices: Tensor, name: str | None = None) -> ImageFiles:
        index_array = np.asarray(indices, dtype=np.int64)
        listed_at = self.listed_at.subset(index_array) if self.listed_at is not None else None
        return dataclasses.replace(self, name=name or self.name, paths=self.paths[index_array],
                                   labels=self.labels[torch.as_tensor(index_array)],
                                   listed_at=listed_at)

    def resized(self, resize: int) -> ImageFiles:
        return dataclasses.replace(self, resize=resize)


def missing_files(paths: Sequence[str] | np.ndarray) -> list[str]:
    """The paths that are not files, in order: missing, or links that lead to no file (to
    nothing, or in a loop), which the image decoder would fail on only after training.

    Lists each folder once instead of asking the file system about every path (SOP's 120,053
    images live in 12 folders): a plain file is known from the listing, and only a link costs
    a call.
    """
    by_folder: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        by_folder[os.path.dirname(path)].append(str(path))
    missing: set[str] = set()
    for folder, members in by_folder.items():
        try:
            with os.scandir(folder) as entries:
                present = {entry.name for entry in entries if _is_file(entry)}
        except (OSError, ValueError):  # ValueError: a NUL byte in the folder's name
            present = set()
        missing.update(path for path in members if os.path.basename(path) not in present)
    return [str(path) for path in paths if str(path) in missing]


def _is_file(entry: os.DirEntry[str]) -> bool:
    """Whether a folder entry is a file, following links: a link in a loop is not one."""
    try:
        return entry.is_file()
    except OSError:
        return False
