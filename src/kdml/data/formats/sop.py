"""Stanford Online Products (Oh Song et al., 2016, "Deep metric learning via lifted structured
feature embedding"): 120,053 photos of 22,634 products sold on eBay.

The extracted archive (``Stanford_Online_Products/``)::

    Ebay_train.txt   header ``image_id class_id super_class_id path``, then lines like
                     1 1 1 bicycle_final/111085122871_0.JPG
    Ebay_test.txt    the same columns
    <super_class>_final/<file>.JPG   12 folders: bicycle_final/, cabinet_final/, ...

Split: the files' own, class-disjoint: Ebay_train.txt (11,318 classes, 59,551 images) train,
Ebay_test.txt (11,316 classes, 60,502 images) test. Labels are the class ids.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kdml.data.formats.common import DatasetParts, Layout, listed_at, repeated_path
from kdml.data.images import ImageFiles

EXPECTED = ("Stanford Online Products' extracted layout: Ebay_train.txt, Ebay_test.txt and "
            "<super_class>_final/<file>.JPG")
HEADER = "image_id class_id super_class_id path"
EXAMPLE = "1 1 1 bicycle_final/111085122871_0.JPG"


def load_sop(root: Path) -> DatasetParts:
    """Read Stanford Online Products from its extracted folder ``root``."""
    layout = Layout("sop", root, EXPECTED)
    paths: list[str] = []
    labels: list[int] = []
    listed: list[tuple[str, tuple[str, int]]] = []  # each path as written, with its line
    class_at: dict[tuple[str, int], int] = {}  # each line's class id
    parts = {}
    for part, relative in (("train", "Ebay_train.txt"), ("test", "Ebay_test.txt")):
        rows = layout.read_rows(relative, 4, header_lines=1, example=EXAMPLE)
        (header,) = layout.header(relative, 1)
        if header.split() != HEADER.split():
            raise layout.error(f"{relative} line 1 is not the header {HEADER!r}: "
                               f"{header[:80]!r}")
        start = len(paths)
        for number, (_, class_id, _, path) in rows:
            labels.append(layout.integer(class_id, relative, number))
            paths.append(str(root / path))
            listed.append((path, (relative, number)))
            class_at[relative, number] = labels[-1]
        parts[part] = torch.arange(start, len(paths))
    repeat = repeated_path(listed)
    if repeat:  # a test image twice is its twin's perfect match; across files, a leak
        path, (file, line), (other_file, other_line) = repeat
        where = (f"{file} lines {line} and {other_line}" if file == other_file
                 else f"{file} line {line} and {other_file} line {other_line}")
        classes = class_at[file, line], class_at[other_file, other_line]
        how = f" with class ids {classes[0]} and {classes[1]}" if classes[0] != classes[1] else ""
        raise layout.error(f"{where} list the image {path} twice{how}; list each image once")
    lines = [where for _, where in listed]
    layout.check_images(paths, lines=lines)
    dataset = ImageFiles("sop", "Stanford Online Products, 22,634 products; files' split",
                         np.asarray(paths), torch.tensor(labels), default_backbone="cnn",
                         listed_at=listed_at(lines))
    return DatasetParts(dataset, parts, eval_ks=(1, 10, 100, 1000))
