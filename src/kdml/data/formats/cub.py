"""CUB-200-2011 (Wah et al., 2011): 11,788 photos of 200 bird species.

The extracted archive (``CUB_200_2011/``)::

    images.txt               <image_id> <class_folder>/<file>.jpg, e.g.
                             1 001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg
    image_class_labels.txt   <image_id> <class_id>, class ids 1-200
    images/<class_folder>/<file>.jpg

The classes are named by their image folders (``Black footed Albatross``).

Split of deep metric learning (Oh Song et al. 2016; JRD Sec. 5.1): the first half of the class
ids (1-100, 5,864 images) train, the second half (101-200, 5,924 images) test. The dataset's own
``train_test_split.txt`` (a split of every class's images, for classification) is not used.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kdml.data.formats.common import (
    DatasetParts,
    Layout,
    first_repeat,
    indices_where,
    listed_at,
    repeated_path,
)
from kdml.data.images import ImageFiles

EXPECTED = ("CUB-200-2011's extracted layout: images.txt, image_class_labels.txt and "
            "images/<class>/<file>.jpg")


def load_cub(root: Path) -> DatasetParts:
    """Read CUB-200-2011 from its extracted folder ``root``."""
    layout = Layout("cub", root, EXPECTED)
    images = layout.read_rows(
        "images.txt", 2,
        example="1 001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg")
    classes = layout.read_rows("image_class_labels.txt", 2, example="1 1")
    path_of = {layout.integer(f[0], "images.txt", n): f[1] for n, f in images}
    line_of = {int(f[0]): n for n, f in images}  # each image id's line of images.txt
    class_of = {layout.integer(f[0], "image_class_labels.txt", n):
                layout.integer(f[1], "image_class_labels.txt", n) for n, f in classes}
    if len(path_of) != len(images):  # the last line's image would win
        image_id, first, line = first_repeat([(int(f[0]), n) for n, f in images])
        raise layout.error(f"images.txt lists an image id twice: lines {first} and {line} "
                           f"both list id {image_id}; give each image its own id")
    if len(class_of) != len(classes):  # the last line's label would win
        image_id, first, line = first_repeat([(int(f[0]), n) for n, f in classes])
        raise layout.error(f"image_class_labels.txt lines {first} and {line} both label image "
                           f"id {image_id}; give each image one line")
    repeat = repeated_path((f[1], n) for n, f in images)
    if repeat:
        path, first, line = repeat
        raise layout.error(f"images.txt lines {first} and {line} list the image {path} under "
                           "two ids; list each image once")
    unlabelled = sorted(set(path_of) - set(class_of))
    if unlabelled:
        raise layout.error(f"image id {unlabelled[0]} of images.txt has no line in "
                           "image_class_labels.txt")
    unlisted = sorted(set(class_of) - set(path_of))
    if unlisted:
        raise layout.error(f"image id {unlisted[0]} of image_class_labels.txt has no line in "
                           "images.txt")
    ids = sorted(path_of)
    paths = [str(root / "images" / path_of[image_id]) for image_id in ids]
    lines = [("images.txt", line_of[image_id]) for image_id in ids]
    layout.check_images(paths, lines=lines)
    labels = torch.tensor([class_of[image_id] for image_id in ids])
    class_names: dict[int, str] = {}
    for image_id in ids:  # each class's folder, e.g. 001.Black_footed_Albatross
        folder = path_of[image_id].split("/")[0]
        class_names.setdefault(class_of[image_id], folder_class_name(folder))
    class_ids = labels.unique(sorted=True)
    is_train = torch.isin(labels, class_ids[: len(class_ids) // 2])
    dataset = ImageFiles("cub", "CUB-200-2011 birds, 200 classes; classes 1-100 train",
                         np.asarray(paths), labels, default_backbone="cnn",
                         class_names=class_names, listed_at=listed_at(lines))
    return DatasetParts(dataset, {"train": indices_where(is_train),
                                  "test": indices_where(~is_train)})


def folder_class_name(folder: str) -> str:
    """A CUB class folder's species name.

    >>> folder_class_name("001.Black_footed_Albatross")
    'Black footed Albatross'
    """
    number, dot, name = folder.partition(".")
    return (name if dot and number.isdigit() else folder).replace("_", " ")
