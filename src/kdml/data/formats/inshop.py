"""In-Shop Clothes Retrieval (Liu et al., 2016, "DeepFashion: powering robust clothes
recognition and retrieval with rich annotations"): 52,712 photos of 7,982 clothing items.

The extracted benchmark::

    list_eval_partition.txt   (or Eval/list_eval_partition.txt, as in the original archive)
                              line 1: the number of images, e.g. 52712
                              line 2: the header ``image_name item_id evaluation_status``
                              then lines like
                              img/WOMEN/Blouses_Shirts/id_00000001/02_1_front.jpg id_00000001 train
    img/<MEN|WOMEN>/<category>/<item_id>/<file>.jpg

Split: the file's own: ``train`` (3,997 items, 25,882 images), and the other 3,985 items'
images as ``query`` (14,218) and ``gallery`` (12,612). Labels are the item ids, sorted and
numbered 0..C-1. Each image is listed once: a query also listed as a gallery image would find
itself, since the gallery search does not leave a query's own image out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from kdml.data.formats.common import (
    DatasetParts,
    Layout,
    indices_where,
    listed_at,
    repeated_path,
)
from kdml.data.images import ImageFiles
from kdml.errors import KdmlError

EXPECTED = ("In-Shop's layout: list_eval_partition.txt (or Eval/list_eval_partition.txt) and "
            "img/<MEN|WOMEN>/<category>/<item_id>/<file>.jpg")
HEADER = "image_name item_id evaluation_status"
EXAMPLE = "img/WOMEN/Blouses_Shirts/id_00000001/02_1_front.jpg id_00000001 train"
STATUSES = ("train", "query", "gallery")


def load_inshop(root: Path) -> DatasetParts:
    """Read In-Shop Clothes Retrieval from its folder ``root``."""
    layout = Layout("inshop", root, EXPECTED)
    names = ("list_eval_partition.txt", "Eval/list_eval_partition.txt")
    relative = next((name for name in names if (root / name).is_file()), None)
    if relative is None:
        said = layout.lacks(*names)
        raise layout.error(f"{said} (or {names[1]})" if said.startswith("missing") else said)
    rows = layout.read_rows(relative, 3, header_lines=2, example=EXAMPLE)
    count, header = layout.header(relative, 2)
    stated = layout.integer(count, relative, 1)
    # The header first: a line 2 that is not it (blank, or the first image's, where the header
    # is missing) moves every row, and the count would be called wrong instead.
    if header.split() != HEADER.split():
        raise layout.error(f"{relative} line 2 is not the header {HEADER!r}: "
                           f"{header[:80]!r}")
    if stated != len(rows):
        raise layout.error(f"{relative} line 1 says {count} images but {len(rows)} are listed")
    for number, (_, _, status) in rows:
        if status not in STATUSES:
            raise layout.error(f"{relative} line {number}: unknown evaluation_status "
                               f"{status!r} (expected train, query or gallery)")
    listed = {status for _, (_, _, status) in rows}
    for status in STATUSES:  # the benchmark needs all three: an empty one is a damaged list
        if status not in listed:
            raise layout.error(f"{relative} has no {status} rows (no line's evaluation_status "
                               f"is {status}); use the dataset's own list")
    repeat = repeated_path((path, number) for number, (path, _, _) in rows)
    if repeat:
        raise repeated_image(layout, relative, rows, repeat)
    paths = [str(root / path) for _, (path, _, _) in rows]
    check_image_folder(layout, relative, rows[0][1][0])
    lines = [(relative, number) for number, _ in rows]
    layout.check_images(paths, lines=lines)
    number_of = {item: label for label, item in enumerate(sorted({f[1] for _, f in rows}))}
    labels = torch.tensor([number_of[item] for _, (_, item, _) in rows])
    statuses = [status for _, (_, _, status) in rows]
    parts = {part: indices_where([status == part for status in statuses]) for part in STATUSES}
    dataset = ImageFiles("inshop", "In-Shop Clothes Retrieval, 7,982 items; query vs gallery",
                         np.asarray(paths), labels, default_backbone="cnn",
                         listed_at=listed_at(lines))
    return DatasetParts(dataset, parts, eval_ks=(1, 10, 20, 30, 40, 50))


def check_image_folder(layout: Layout, relative: str, first_path: str) -> None:
    """Where the list names ``img/...`` and the root has no ``img/``, say where the images are
    instead, as every image would be reported missing: in ``Img/img/`` (``Img/img.zip``
    unpacked where it lies), still in ``Img/img.zip``, only in ``img_highres/`` (the
    high-resolution copies, ``Img/img_highres.zip``), or in the folder above a root that is
    ``Eval/`` (the list's own folder given as the root)."""
    root = layout.root
    if not first_path.startswith("img/") or (root / "img").exists():
        return
    if (root / "Img" / "img").is_dir():
        raise layout.error(f"the images are in Img/img/ (Img/img.zip unpacked where it lies), "
                           f"but {relative} lists them as img/...: move {root / 'Img' / 'img'} "
                           f"to {root / 'img'}")
    if relative == "list_eval_partition.txt" and (root.parent / first_path).is_file():
        raise layout.error(f"{relative} is here but its images, img/, are in the folder above: "
                           f"pass --data-root {root.parent}")
    highres = next((folder for folder in ("img_highres", "Img/img_highres")
                    if (root / folder).is_dir()), None)
    zipped = (root / "Img" / "img.zip").is_file()
    if highres is not None or zipped:
        there = (f"only the high-resolution copies, {highres}/, are here" if highres is not None
                 else "Img/img.zip is here, not extracted")
        rename = (f", or rename {highres}/ to img/ to use the high-resolution copies"
                  if highres is not None else "")
        raise layout.error(f"{relative} lists the images as img/..., but {there}: extract "
                           f"Img/img.zip in {root}, where it unpacks to img/{rename}")


def repeated_image(layout: Layout, relative: str, rows: list[tuple[int, list[str]]],
                   repeat: tuple[str, int, int]) -> KdmlError:
    """The error for the first image listed twice: each copy would be its twin's perfect match
    (a query also in the gallery finds itself: the gallery search does not leave a query's own
    image out), or the one image would have two item ids."""
    path, first, line = repeat
    fields = dict(rows)
    (_, item, status), (_, other_item, other_status) = fields[first], fields[line]
    how = "twice"
    if {status, other_status} == {"query", "gallery"}:
        how += (", as a query and a gallery image, so the query would find itself (a perfect "
                "Recall@1)")
    elif item != other_item:
        how += f" with item ids {item} and {other_item}"
    return layout.error(f"{relative} lines {first} and {line} list the image {path} {how}; "
                        "list each image once")
