"""MNIST (LeCun et al., 1998) and Fashion-MNIST (Xiao et al., 2017): 70,000 grey 28x28 images
of 10 classes, in IDX files.

The four files, each as distributed (``.gz``) or decompressed::

    train-images-idx3-ubyte   60,000 images     train-labels-idx1-ubyte   60,000 labels
    t10k-images-idx3-ubyte    10,000 images     t10k-labels-idx1-ubyte    10,000 labels

each also found with a dot before the ``idx`` part (``train-images.idx3-ubyte``), as some
copies (Kaggle's) name them; where both names exist, they must hold the same data.

An IDX file is a big-endian header, the magic number ``0x00000803`` (uint8, 3 dimensions:
images) or ``0x00000801`` (uint8, 1 dimension: labels) then one uint32 per dimension, followed
by the uint8 values in row-major order.

Split: the files' own, the 60,000 train images then the 10,000 t10k images.
"""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path

import numpy as np
import torch

from kdml.data.dataset import ArrayDataset
from kdml.data.formats.common import DatasetParts, Layout

EXPECTED = ("the IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, "
            "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte (each may end in .gz, and "
            "have a dot before idx: train-images.idx3-ubyte)")
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
CLASSES = 10  # both datasets' labels are 0-9
GZIP_MAGIC = b"\x1f\x8b"
IDX_MAGIC_START = b"\x00\x00"  # the first two bytes of every IDX file
MEANING = {IMAGES_MAGIC: "uint8 images, 3 dimensions", LABELS_MAGIC: "uint8 labels, 1 dimension"}
# Label -> class, from the dataset's README (github.com/zalandoresearch/fashion-mnist); MNIST's
# classes are the digits their labels already are.
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")


def file_names(name: str) -> tuple[str, ...]:
    """The names the IDX file ``name`` (``train-images-idx3-ubyte``) is looked for under, in
    order: as named, gzipped, then with a dot before ``idx`` (``train-images.idx3-ubyte``, as
    in some Kaggle copies), decompressed or gzipped."""
    dotted = name.replace("-idx", ".idx")
    return name, f"{name}.gz", dotted, f"{dotted}.gz"


def find_file(layout: Layout, name: str) -> Path:
    """The first of :func:`file_names` that is a file in the root."""
    names = file_names(name)
    for candidate in names:
        if (layout.root / candidate).is_file():
            return layout.root / candidate
    raise layout.error(f"{layout.lacks(*names)} (searched for {', '.join(names)})")


def gzip_trailer(path: Path) -> tuple[int, int] | None:
    """The CRC-32 and the uncompressed size mod 2**32 that the gzip file ``path`` records in its
    last 8 bytes, or ``None`` where it is too short to be a gzip file."""
    with path.open("rb") as file:
        if file.seek(0, 2) < 18:  # a 10-byte header, an empty deflate block, the trailer
            return None
        file.seek(-8, 2)
        trailer = file.read(8)
    return int.from_bytes(trailer[:4], "little"), int.from_bytes(trailer[4:], "little")


def check_gzip_twin(layout: Layout, path: Path, raw: bytes) -> None:
    """Refuse when ``path``, a decompressed IDX file read as ``raw``, has a ``.gz`` beside it
    that holds other bytes. torchvision leaves both (it extracts each download next to it), so
    the pair alone is no error; the gzip's trailer (CRC-32 and size) tells without
    decompressing it whether the two agree."""
    twin = path.with_name(f"{path.name}.gz")
    if not twin.is_file():
        return
    try:
        trailer = gzip_trailer(twin)
    except OSError as error:
        raise layout.error(f"cannot read {twin.name}, found beside {path.name}: {error}; "
                           "remove the one that is not wanted") from None
    if trailer != (zlib.crc32(raw), len(raw) % 2**32):
        raise layout.error(f"{path.name} and {twin.name} both exist but hold different data; "
                           "remove the one that is not wanted")


def read_bytes(layout: Layout, path: Path) -> bytes:
    """The IDX bytes of ``path``, decompressed where it ends in ``.gz``."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise layout.error(f"cannot read {path.name}: {error}") from None
    check_compression_matches_name(layout, path, data)
    if path.suffix != ".gz":
        return data
    try:
        return gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as error:
        raise layout.error(f"{path.name} is not a readable gzip file: {error}; the download "
                           "is damaged or incomplete: download it again") from None


def check_compression_matches_name(layout: Layout, path: Path, data: bytes) -> None:
    """Refuse a file whose name says otherwise than its bytes whether it is gzipped: a
    browser (Safari) decompresses a ``.gz`` download and keeps its name, and a copy can lose
    the suffix. The data are good, so "not a readable gzip file" or a magic number read
    from the gzip header would send the user to download them again."""
    gzipped = data[:2] == GZIP_MAGIC
    if path.suffix == ".gz" and not gzipped and data[:2] == IDX_MAGIC_START:
        raise layout.error(f"{path.name} is not gzip-compressed but an IDX file already "
                           f"decompressed; rename it {path.stem}")
    if path.suffix != ".gz" and gzipped:
        raise layout.error(f"{path.name} is gzip-compressed, but its name does not end in "
                           f".gz; rename it {path.name}.gz")


def check_other_spelling(layout: Layout, name: str, path: Path, raw: bytes) -> None:
    """Refuse when ``path`` (read as ``raw``) has a copy under the other spelling of its name
    (``train-images.idx3-ubyte`` beside ``train-images-idx3-ubyte``, as a Kaggle copy
    unpacked into the folder leaves) that holds other bytes: only the first name was read,
    so the other copy's labels or images were passed over without a word. Read only where
    both spellings exist."""
    dotted = name.replace("-idx", ".idx")
    spellings = (name, f"{name}.gz") if path.name.startswith(dotted) else (dotted,
                                                                          f"{dotted}.gz")
    for other in (layout.root / spelling for spelling in spellings):
        if other.is_file() and read_bytes(layout, other) != raw:
            raise layout.error(f"{path.name} and {other.name} both exist but hold different "
                               "data; remove the one that is not wanted")


def read_idx(layout: Layout, name: str, magic: int) -> np.ndarray:
    """The uint8 array of the IDX file ``name`` (``magic`` says how many dimensions); a
    decompressed file is read in preference to its ``.gz``, which must hold the same bytes,
    as must a copy under the other spelling (a dot before ``idx``)."""
    path = find_file(layout, name)
    raw = read_bytes(layout, path)
    if path.suffix != ".gz":
        check_gzip_twin(layout, path, raw)
    check_other_spelling(layout, name, path, raw)
    ndim = magic & 0xFF
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise layout.error(f"{path.name} is too short for an IDX header ({len(raw)} bytes)")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        # the other kind's magic: the images and labels files swapped (or misnamed)
        held = (f": it holds {MEANING[found]}; give each file its own name"
                if found in MEANING else "")
        raise layout.error(f"{path.name} has magic number 0x{found:08x}, expected "
                           f"0x{magic:08x} ({MEANING[magic]}){held}")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    size = math.prod(dims)
    if len(raw) - header != size:
        raise layout.error(f"{path.name}: header says {'x'.join(map(str, dims))} = {size} "
                           f"values but the file holds {len(raw) - header}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def read_part(layout: Layout, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    """Images ``[n, rows, cols]`` and labels ``[n]`` of ``train`` or ``t10k``."""
    images = read_idx(layout, f"{prefix}-images-idx3-ubyte", IMAGES_MAGIC)
    labels = read_idx(layout, f"{prefix}-labels-idx1-ubyte", LABELS_MAGIC)
    if len(images) != len(labels):
        raise layout.error(f"{prefix}-images-idx3-ubyte holds {len(images)} images but "
                           f"{prefix}-labels-idx1-ubyte holds {len(labels)} labels")
    if labels.size and labels.max() >= CLASSES:
        name = find_file(layout, f"{prefix}-labels-idx1-ubyte").name
        position = int(labels.argmax())
        raise layout.error(f"{name}: label number {position + 1} is {labels[position]}, but "
                           f"labels must lie in 0..{CLASSES - 1}; use the dataset's own label "
                           "file")
    return images, labels


def load_idx(root: Path, name: str, description: str,
             class_names: dict[int, str] | None = None) -> DatasetParts:
    """The train then t10k images of the IDX files in ``root``, as uint8 ``[N, 1, H, W]``."""
    layout = Layout(name, root, EXPECTED)
    train_images, train_labels = read_part(layout, "train")
    test_images, test_labels = read_part(layout, "t10k")
    if train_images.shape[1:] != test_images.shape[1:]:
        raise layout.error(f"train images are {train_images.shape[1:]} but t10k images are "
                           f"{test_images.shape[1:]}")
    x = np.concatenate([train_images, test_images])[:, None]  # a fresh, writable copy
    labels = np.concatenate([train_labels, test_labels]).astype(np.int64)
    dataset = ArrayDataset(name, description, torch.from_numpy(x), torch.from_numpy(labels),
                           default_backbone="cnn", class_names=class_names,
                           folder=str(root.absolute()))
    return DatasetParts(dataset, {"train": torch.arange(len(train_labels)),
                                  "test": torch.arange(len(train_labels), len(labels))})


def load_mnist(root: Path) -> DatasetParts:
    """Read MNIST's four IDX files from ``root``."""
    return load_idx(root, "mnist", "MNIST handwritten digits, 1x28x28, 10 classes; files' split")


def load_fashion_mnist(root: Path) -> DatasetParts:
    """Read Fashion-MNIST's four IDX files from ``root``."""
    return load_idx(root, "fashion-mnist",
                    "Fashion-MNIST clothing images, 1x28x28, 10 classes; files' split",
                    dict(enumerate(FASHION_MNIST_CLASSES)))
