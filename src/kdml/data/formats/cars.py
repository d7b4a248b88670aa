"""Cars196 (Krause et al., 2013, "3D object representations for fine-grained categorization"):
16,185 photos of 196 car models.

The extracted archive::

    cars_annos.mat   MATLAB file: ``annotations``, a 1 x N struct array with the fields
                     relative_im_path ('car_ims/000001.jpg'), bbox_x1, bbox_y1, bbox_x2,
                     bbox_y2, class (1-196) and test (0/1); ``class_names``, 1 x 196 cell
    car_ims/<file>.jpg

Split of deep metric learning (Oh Song et al. 2016): the first half of the class ids (1-98,
8,054 images) train, the second half (99-196, 8,131 images) test. The ``test`` flag (a split of
every class's images, for classification) and the bounding boxes are not used; ``class_names``,
where present, names the classes. The other release of the same photos, for classification
(``cars_train/``, ``cars_test/``, ``devkit/cars_meta.mat``), is not read: it is named as such
when found instead. ``cars_annos.mat`` is a MATLAB v5 file; one saved again as v7.3 (HDF5) is
refused with a line saying so (scipy cannot read it).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import scipy.io
import torch

from kdml.data.formats.common import (
    INT64,
    DatasetParts,
    Layout,
    indices_where,
    listed_at,
    repeated_path,
)
from kdml.data.images import ImageFiles

EXPECTED = "Cars196's extracted layout: cars_annos.mat and car_ims/<file>.jpg"
FILE = "cars_annos.mat"
ARCHIVE = "car_ims.tgz"  # the photos' archive, which extracts to car_ims/
FIELDS = ("relative_im_path", "class")
# Files of the other release of the same photos, for classification (cars_train/, cars_test/,
# car_devkit.tgz): another split and other annotation files, which kdml does not read.
RELEASE_FOLDERS = ("cars_train/", "cars_test/")  # that release's photos
DEVKIT_FILES = ("devkit/cars_meta.mat", "cars_meta.mat", "devkit/cars_train_annos.mat",
                "cars_train_annos.mat", "cars_test_annos_withlabels.mat",
                "devkit/cars_test_annos.mat", "cars_test_annos.mat")


def annotations_file(layout: Layout) -> Path:
    """``cars_annos.mat`` in the root, or a one-line error saying what to put there."""
    path = layout.root / FILE
    if path.is_file():
        return path
    devkit = next((name for name in DEVKIT_FILES if (layout.root / name).is_file()), None)
    devkit = devkit or next((name for name in RELEASE_FOLDERS if (layout.root / name).is_dir()),
                            None)  # its photos alone, without its annotation files
    if devkit is not None:
        raise layout.error(f"missing {FILE}: {devkit} is of the Stanford Cars classification "
                           "release (cars_train/, cars_test/, devkit/), whose files and split "
                           f"kdml does not read; get the same page's car_ims.tgz and {FILE}, "
                           "the Cars196 release of deep metric learning")
    if (layout.root / "car_ims").is_dir():
        raise layout.error(f"{layout.lacks(FILE)}: put Cars196's {FILE} beside car_ims/")
    raise layout.error(f"{layout.lacks(FILE)}: pass the folder that holds {FILE} and car_ims/")


def read_annotations(layout: Layout) -> dict:
    """The variables of ``cars_annos.mat``, or a one-line error (a MATLAB v7.3 file named as
    such: scipy reads v4 to v7 files only)."""
    path = annotations_file(layout)
    try:
        return scipy.io.loadmat(str(path))
    except NotImplementedError:  # scipy's answer to a v7.3 (HDF5) file
        raise layout.error(f"{FILE} is a MATLAB v7.3 (HDF5) file, which scipy cannot read; use "
                           "the original file (MATLAB v5), or save it again as v7 (MATLAB or "
                           "Octave: save(..., '-v7'))") from None
    except Exception as error:  # scipy raises many types for a damaged or non-MATLAB file
        reason = " ".join(str(error).split())[:80]
        raise layout.error(f"{FILE} is not a readable MATLAB file "
                           f"({type(error).__name__}: {reason})") from None


def load_cars196(root: Path) -> DatasetParts:
    """Read Cars196 from its extracted folder ``root``."""
    layout = Layout("cars196", root, EXPECTED)
    contents = read_annotations(layout)
    annotations = contents.get("annotations")
    if annotations is None:
        raise layout.error(f"{FILE} has no 'annotations' variable")
    names = annotations.dtype.names or ()
    for field in FIELDS:
        if field not in names:
            raise layout.error(f"{FILE}: 'annotations' has no field {field!r}")
    paths, labels = [], []
    for number, record in enumerate(annotations.ravel(), start=1):
        image, label = (np.asarray(record[field]).ravel() for field in FIELDS)
        if (image.size != 1 or label.size != 1 or not isinstance(image[0], str)
                or label.dtype.kind not in "iuf"):
            raise layout.error(f"{FILE}: annotation {number} has no single path and class id")
        class_id = label[0]
        if label.dtype.kind == "f" and not (np.isfinite(class_id) and class_id == int(class_id)):
            raise layout.error(f"{FILE}: annotation {number} has class id {class_id}, not a "
                               "whole number; give it its class's number (1-196)")
        if int(class_id) not in INT64:  # what the label tensor holds, as the text formats check
            raise layout.error(f"{FILE}: annotation {number} has class id {int(class_id)}, "
                               "beyond a 64-bit label; give it its class's number (1-196)")
        paths.append(str(root / image[0]))
        labels.append(int(class_id))
    if not paths:
        raise layout.error(f"{FILE} lists nothing")
    repeat = repeated_path((path, number) for number, path in enumerate(paths, start=1))
    if repeat:
        twin, first, second = repeat
        how = (f" with class ids {labels[first - 1]} and {labels[second - 1]}"
               if labels[first - 1] != labels[second - 1] else "")
        raise layout.error(f"{FILE}: annotations {first} and {second} both name the image "
                           f"{os.path.relpath(twin, root)}{how}; give each image one "
                           "annotation")
    lines = [(FILE, number) for number in range(1, len(paths) + 1)]
    layout.check_images(paths, lines=lines, unit="annotation",
                        why=lambda path: _unextracted(root, path))
    label_tensor = torch.tensor(labels)
    class_names = read_class_names(contents, layout)
    unnamed = sorted(set(labels) - set(class_names)) if class_names is not None else []
    if unnamed:  # the real file names all 196 classes; a short list is a damaged file
        raise layout.error(f"{FILE}: 'class_names' names {len(class_names or ())} classes but "
                           f"class id {unnamed[0]} has no name; give every class id its name")
    class_ids = label_tensor.unique(sorted=True)
    is_train = torch.isin(label_tensor, class_ids[: len(class_ids) // 2])
    dataset = ImageFiles("cars196", "Cars196 car photos, 196 classes; classes 1-98 train",
                         np.asarray(paths), label_tensor, default_backbone="cnn",
                         class_names=class_names, listed_at=listed_at(lines, "annotation"))
    return DatasetParts(dataset, {"train": indices_where(is_train),
                                  "test": indices_where(~is_train)}, eval_ks=(1, 2, 4, 8))


def _unextracted(root: Path, missing: str) -> str:
    """Why the image ``missing`` may be missing, where the photos' archive lies in ``root``
    beside ``cars_annos.mat`` (downloaded, not yet extracted, or extracted in part): what to
    do, or ``""``."""
    archive = root / ARCHIVE
    if Path(missing).parent != root / "car_ims":
        return ""
    if not archive.is_file():
        other = [folder for folder in RELEASE_FOLDERS if (root / folder).is_dir()]
        if (root / "car_ims").is_dir() or not other:
            return ""
        # A copy that holds both releases' files (some mirrors do): the same photos under
        # other names and numbers, so car_ims/'s cannot be found among them.
        return (f": {' and '.join(other)} {'is' if len(other) == 1 else 'are'} of the Stanford "
                "Cars classification release, whose photos are named and numbered otherwise; "
                f"get {ARCHIVE} and extract it in {root}")
    state = "perhaps extracted in part" if (root / "car_ims").is_dir() else "not extracted"
    return f": {ARCHIVE} is there, {state}; extract {ARCHIVE} in {root}"


def read_class_names(contents: dict, layout: Layout) -> dict[int, str] | None:
    """Class id (1-based) -> model name from ``class_names``, or None if the file has none."""
    names = contents.get("class_names")
    if names is None:
        return None
    cells = np.asarray(names, dtype=object).ravel()
    texts = [np.asarray(cell).ravel() for cell in cells]
    if not all(text.size == 1 and isinstance(text[0], str) for text in texts):
        raise layout.error(f"{FILE}: 'class_names' must be a cell array of strings")
    # A char matrix (a list of names saved with scipy, or MATLAB's char()) pads every row
    # with spaces to the longest name; a cell array, as in the real file, holds each as is.
    padded = np.asarray(names).dtype.kind == "U"
    return {number: str(text[0]).rstrip(" ") if padded else str(text[0])
            for number, text in enumerate(texts, start=1)}
