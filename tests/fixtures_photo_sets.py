"""Tiny photo datasets in the real on-disk formats, for tests: CUB, Cars196, SOP and In-Shop.

Plain functions (not pytest fixtures): each writes its dataset's metadata files, with their
real names, columns and header lines, and small JPEG images (random sizes and aspect ratios,
a few grayscale) into ``root``, and returns ``root``. Import them from a test with
``from fixtures_photo_sets import make_cub``.

Every class (item, product) has its own base colour, and each image is that colour with noise
and a patch of another colour, so an embedding can learn to tell the classes apart. The same
arguments write the same files (NumPy RNG seeded with ``seed``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import scipy.io
from PIL import Image

CUB_CLASSES = ("Black_footed_Albatross", "Laysan_Albatross", "Sooty_Albatross",
               "Groove_billed_Ani", "Crested_Auklet", "Least_Auklet")
CAR_MODELS = ("AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012",
              "Acura TL Type-S 2008", "Acura TSX Sedan 2012", "Acura Integra Type R 2001")
SOP_SUPER_CLASSES = ("bicycle", "cabinet", "chair", "coffee_maker", "fan", "kettle", "lamp",
                     "mug", "sofa", "stapler", "table", "toaster")
INSHOP_CATEGORIES = (("WOMEN", "Blouses_Shirts"), ("MEN", "Denim"), ("WOMEN", "Dresses"),
                     ("MEN", "Jackets_Vests"), ("WOMEN", "Skirts"))
INSHOP_VIEWS = ("front", "side", "back", "full", "additional")


def write_photo(path: Path, colour: np.ndarray, rng: np.random.Generator,
                size: tuple[int, int], gray: bool = False) -> None:
    """Write a small JPEG near ``colour`` whose sides vary around ``size`` (width, height)."""
    width, height = (max(8, round(side * rng.uniform(0.7, 1.4))) for side in size)
    pixels = colour + rng.normal(0, 12, (height, width, 3))
    top, left = rng.integers(0, height // 2), rng.integers(0, width // 2)
    pixels[top: top + height // 3, left: left + width // 3] = rng.uniform(0, 255, 3)
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    path.parent.mkdir(parents=True, exist_ok=True)
    (image.convert("L") if gray else image).save(path, "JPEG", quality=90)


def _colours(rng: np.random.Generator, count: int) -> np.ndarray:
    return rng.uniform(30, 225, (count, 3))


def _is_gray(index: int) -> bool:
    return index % 5 == 4  # one image in five


def make_cub(root: Path, classes: int = 4, per_class: int = 3, size: tuple[int, int] = (40, 30),
             seed: int = 0) -> Path:
    """CUB-200-2011: images.txt, image_class_labels.txt, classes.txt, train_test_split.txt and
    images/<NNN.Name>/<Name>_<n>_<m>.jpg; class ids 1..classes, ``per_class`` images each."""
    rng = np.random.default_rng(seed)
    root = Path(root)
    colours = _colours(rng, classes)
    images, labels, splits, names = [], [], [], []
    for class_id in range(1, classes + 1):
        name = CUB_CLASSES[class_id - 1] if class_id <= len(CUB_CLASSES) else f"Bird_{class_id}"
        folder = f"{class_id:03d}.{name}"
        names.append(f"{class_id} {folder}")
        for k in range(per_class):
            image_id = len(images) + 1
            relative = f"{folder}/{name.title()}_{rng.integers(1, 9999):04d}_{k + 1}.jpg"
            write_photo(root / "images" / relative, colours[class_id - 1], rng, size,
                        gray=_is_gray(image_id))
            images.append(f"{image_id} {relative}")
            labels.append(f"{image_id} {class_id}")
            splits.append(f"{image_id} {k % 2}")
    for file, lines in (("images.txt", images), ("image_class_labels.txt", labels),
                        ("train_test_split.txt", splits), ("classes.txt", names)):
        (root / file).write_text("\n".join(lines) + "\n")
    return root


def make_cars196(root: Path, classes: int = 4, per_class: int = 3,
                 size: tuple[int, int] = (48, 30), seed: int = 0) -> Path:
    """Cars196: cars_annos.mat (``annotations``, a 1 x N struct array with the real fields, and
    ``class_names``) and car_ims/000001.jpg...; class ids 1..classes, ``per_class`` images each.

    The images are listed in shuffled class order, and the ``test`` flags mix both values in
    every class, so a reader that used the flag rather than the class ids would be caught.
    """
    rng = np.random.default_rng(seed)
    root = Path(root)
    colours = _colours(rng, classes)
    order = rng.permutation(np.repeat(np.arange(1, classes + 1), per_class))
    fields = ("relative_im_path", "bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "test")
    annotations = np.zeros((1, len(order)), dtype=[(field, object) for field in fields])
    seen = np.zeros(classes + 1, dtype=int)
    for index, class_id in enumerate(order):
        relative = f"car_ims/{index + 1:06d}.jpg"
        write_photo(root / relative, colours[class_id - 1], rng, size, gray=_is_gray(index))
        box = (2, 3, size[0] - 2, size[1] - 3)
        record = annotations[0, index]
        record["relative_im_path"] = np.array([relative])
        for field, value in zip(fields[1:5], box, strict=True):
            record[field] = np.array([[value]], dtype=np.uint16)
        record["class"] = np.array([[class_id]], dtype=np.uint8)
        record["test"] = np.array([[seen[class_id] % 2]], dtype=np.uint8)
        seen[class_id] += 1
    class_names = np.empty((1, classes), dtype=object)
    for index in range(classes):
        class_names[0, index] = CAR_MODELS[index % len(CAR_MODELS)]
    scipy.io.savemat(root / "cars_annos.mat",
                     {"annotations": annotations, "class_names": class_names})
    return root


def write_matlab_v73(path: Path) -> None:
    """Write the start of a MATLAB v7.3 file, which is HDF5 (as ``save(..., '-v7.3')`` writes
    it): the 128-byte MATLAB header (version 0x0200, endian mark ``IM``) in a 512-byte user
    block, then HDF5's signature. scipy.io.loadmat reads the version and stops there."""
    text = (b"MATLAB 7.3 MAT-file, Platform: GLNXA64, Created on: Mon Jan  1 00:00:00 2024 "
            b"HDF5 schema 1.00 .")
    header = text.ljust(116, b" ") + bytes(8) + b"\x00\x02IM"
    path.write_bytes(header.ljust(512, b"\0") + b"\x89HDF\r\n\x1a\n" + bytes(56))


def make_sop(root: Path, classes: int = 4, per_class: int = 2, size: tuple[int, int] = (36, 36),
             seed: int = 0) -> Path:
    """Stanford Online Products: Ebay_train.txt (class ids 1..classes//2) and Ebay_test.txt (the
    rest), header ``image_id class_id super_class_id path``, image ids running on across both
    files, images <super>_final/<product>_<k>.JPG in several super-class folders."""
    if classes < 2 or per_class < 2:
        raise ValueError("make_sop needs at least 2 classes and 2 images per class")
    rng = np.random.default_rng(seed)
    root = Path(root)
    colours = _colours(rng, classes)
    supers = min(max(2, classes - 1), len(SOP_SUPER_CLASSES))
    lines: dict[str, list[str]] = {"Ebay_train.txt": [], "Ebay_test.txt": []}
    image_id = 0
    for class_id in range(1, classes + 1):
        super_id = (class_id - 1) % supers + 1
        product = rng.integers(10**11, 10**12)
        file = "Ebay_train.txt" if class_id <= classes // 2 else "Ebay_test.txt"
        for k in range(per_class):
            image_id += 1
            relative = f"{SOP_SUPER_CLASSES[super_id - 1]}_final/{product}_{k}.JPG"
            write_photo(root / relative, colours[class_id - 1], rng, size,
                        gray=_is_gray(image_id))
            lines[file].append(f"{image_id} {class_id} {super_id} {relative}")
    for file, rows in lines.items():
        (root / file).write_text("\n".join(["image_id class_id super_class_id path", *rows])
                                 + "\n")
    return root


def make_inshop(root: Path, items: int = 6, per_item: int = 3, size: tuple[int, int] = (30, 44),
                seed: int = 0, eval_folder: bool = False) -> Path:
    """In-Shop Clothes Retrieval: list_eval_partition.txt (under Eval/ if ``eval_folder``) with
    its count and header lines, and img/<MEN|WOMEN>/<category>/<item_id>/<NN>_<k>_<view>.jpg.

    Items alternate between train and test (so ``items`` // 2 test items); a test item's images
    alternate between query and gallery, starting with query. Item ids have gaps
    (id_00000001, id_00000004, ...) and the lines are sorted by path, as in the real list.
    """
    if items < 2 or per_item < 2:
        raise ValueError("make_inshop needs at least 2 items and 2 images per item")
    rng = np.random.default_rng(seed)
    root = Path(root)
    colours = _colours(rng, items)
    rows = []
    for index in range(items):
        item = f"id_{3 * index + 1:08d}"
        gender, category = INSHOP_CATEGORIES[index % len(INSHOP_CATEGORIES)]
        pose = rng.integers(1, 10)
        for k in range(per_item):
            relative = (f"img/{gender}/{category}/{item}/"
                        f"{pose:02d}_{k + 1}_{INSHOP_VIEWS[k % len(INSHOP_VIEWS)]}.jpg")
            write_photo(root / relative, colours[index], rng, size, gray=_is_gray(len(rows)))
            status = "train" if index % 2 == 0 else ("query" if k % 2 == 0 else "gallery")
            rows.append(f"{relative:<64}{item:<15}{status}")
    listing = root / "Eval" / "list_eval_partition.txt" if eval_folder else (
        root / "list_eval_partition.txt")
    listing.parent.mkdir(parents=True, exist_ok=True)
    rows.sort()  # by path, as in the real list: MEN/ before WOMEN/, item ids out of order
    listing.write_text("\n".join([str(len(rows)), "image_name item_id evaluation_status", *rows])
                       + "\n")
    return root
