"""A folder of the user's own images, one sub-folder per class (``--dataset folder:DIR``)::

    DIR/<class>/<image>.jpg          e.g. photos/cat/001.jpg, photos/dog/park/017.png

As torchvision's ``ImageFolder``: the classes are the sorted sub-folder names, labelled
0..C-1 and named by their folders; a class's images are the files found at any depth inside its
folder whose extension (in any case) is one of :data:`~kdml.data.images.IMAGE_EXTENSIONS`;
other files, and images directly in ``DIR``, are left out, with one warning that counts them
by extension (a ``.heic`` or ``.jfif`` photo is not dropped without a word). Unlike
``ImageFolder``, hidden folders and files (names starting with ``.``, such as
``.ipynb_checkpoints`` or macOS's ``._photo.jpg``) are ignored too, and a folder or image
reached twice through links, or an image that is a link to no file, is refused, and so is a
``DIR`` split into ``train/`` and ``test/`` (or ``val/``, ...) folders of class folders, which
would be read as the classes "test" and "train", and so are two class folders whose names
differ only in their Unicode form (``café`` composed and decomposed), which print alike.

Split: none of its own; ``data.split`` decides.
"""

from __future__ import annotations

import itertools
import logging
import os
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from kdml.data.formats.common import DatasetParts, Layout, resolved, unicode_hint
from kdml.data.images import IMAGE_EXTENSIONS, ImageFiles

EXPECTED = "one sub-folder per class holding its images, e.g. DIR/<class>/<image>.jpg"
logger = logging.getLogger("kdml.data")


def class_images(folder: Path, layout: Layout, read: dict[str, str],
                 listed: dict[str, str], passed_over: Counter[str] | None = None) -> list[str]:
    """The image files at any depth inside ``folder``, sorted, hidden entries skipped (the
    order of ``os.walk``: a folder's files, then its sub-folders one by one).

    ``read`` maps the real path of each folder already read to its path, and ``listed`` the
    real path of each image already listed to its path. A linked folder read twice (in two
    classes, or in a loop) or a linked image that is already listed is refused: it would be
    its twin's perfect match, or the same image under two labels. os.scandir, not os.walk,
    because its entries say which files are links without a system call per file.
    ``passed_over`` counts the other files by extension (e.g. ``.heic``, ``.txt``)."""
    found = []
    pending = [str(folder)]
    while pending:
        parent = pending.pop()
        real = os.path.realpath(parent)
        if real in read:
            raise layout.error(f"{relative(parent, layout)}/ and {relative(read[real], layout)}/ "
                               "are the same folder through a link, so its images would be "
                               "listed twice; remove the link")
        read[real] = parent
        try:
            with os.scandir(parent) as scanned:
                entries = sorted((entry for entry in scanned if not entry.name.startswith(".")),
                                 key=lambda entry: name_order(entry.name))
        except OSError as error:  # os.walk would skip the folder, and its images, silently
            raise layout.error(f"{relative(parent, layout)}/ cannot be read ({error.strerror}); "
                               "make it readable or move it out") from None
        folders = {entry.path for entry in entries if _is_folder(entry)}
        for entry in entries:
            if entry.path in folders:
                continue
            if not entry.name.lower().endswith(IMAGE_EXTENSIONS):
                if passed_over is not None:
                    passed_over[os.path.splitext(entry.name)[1].lower() or entry.name] += 1
                continue
            target = (os.path.realpath(entry.path) if entry.is_symlink()
                      else os.path.join(real, entry.name))
            if target in listed:
                raise layout.error(f"{relative(entry.path, layout)} and "
                                   f"{relative(listed[target], layout)} are the same image "
                                   "through a link, so it would be listed twice; remove the link")
            listed[target] = entry.path
            found.append(entry.path)
        pending.extend(entry.path for entry in reversed(entries) if entry.path in folders)
    return found


# Sub-folder names that split a dataset rather than name a class (DIR/train/<class>/, as many
# downloads come); lower-cased.
SPLIT_FOLDERS = frozenset({"train", "training", "test", "testing", "val", "valid", "validation",
                           "query", "gallery"})


def _refuse_split_folders(folder: Path, classes: list[str], layout: Layout) -> None:
    """Refuse DIR/train/<class>/ beside DIR/test/<class>/ (and val/...): read as the classes
    "test" and "train", it had trained on them, or stopped on a test part of one class, without
    saying why."""
    training = [name for name in classes if name.lower() in ("train", "training")]
    if len(classes) < 2 or not training or not {name.lower() for name in classes} <= SPLIT_FOLDERS:
        return
    inner = _sub_folders(folder / training[0])
    if inner:
        raise layout.error(f"its sub-folders {'/, '.join(classes)}/ look like a split, each "
                           f"holding class folders ({_first_names(inner)}), but kdml reads each "
                           "sub-folder as a class: give one of them (e.g. "
                           f"folder:{folder / training[0]}), which data.split splits, or list the "
                           "images with their split in a CSV (csv:FILE, rows path,label,split)")


def _sub_folders(folder: Path) -> list[str]:
    """The names of ``folder``'s sub-folders, sorted, hidden ones left out."""
    return sorted((entry.name for entry in os.scandir(folder)
                   if entry.is_dir() and not entry.name.startswith(".")), key=name_order)


def name_order(name: str) -> tuple[str, str]:
    """The sort key of a file or folder name: its NFC form first. macOS (HFS+) stores names
    decomposed (e + U+0301 for é), which sorts before "f" where the composed U+00E9 sorts
    after "z": sorted as spelled, a copy unpacked on a Mac had other classes on each side of
    the class-disjoint cut, and data.json's NFC-normalised paths in another order. The name
    as spelled breaks ties (two names of one NFC form, both on a Linux disk)."""
    return unicodedata.normalize("NFC", name), name


def _first_names(names: list[str]) -> str:
    """``"a, b, c, ..."``: the first three of ``names``, for a one-line error."""
    return f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}"


def _is_folder(entry: os.DirEntry[str]) -> bool:
    """As os.walk decides: a link that cannot be followed (a loop) is not a folder."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def relative(path: str, layout: Layout) -> str:
    return os.path.relpath(path, layout.root)


def load_folder(folder: Path) -> DatasetParts:
    """Read the images of ``folder``, labelled by the sorted names of its sub-folders."""
    folder = resolved(folder, f"folder:{Path(folder).name}", "folder")
    layout = Layout(f"folder:{folder.name}", folder, EXPECTED)
    if folder.is_file():
        raise layout.error(f"it is a file, not a folder; {_file_hint(folder)}")
    if not folder.is_dir():
        raise layout.error(f"no such folder{unicode_hint(folder, 'folder')}")
    with os.scandir(folder) as scanned:
        entries = list(scanned)  # read once: the classes, and the images beside them
    classes = sorted((entry.name for entry in entries
                      if entry.is_dir() and not entry.name.startswith(".")), key=name_order)
    # images beside the class folders, which no class holds; hidden files (macOS's
    # ._photo.jpg) are ignored here too, as in the class folders
    top = sum(entry.is_file() and not entry.name.startswith(".")
              and entry.name.lower().endswith(IMAGE_EXTENSIONS) for entry in entries)
    if not classes:
        if top:  # one level too low: the images of one class, or unsorted ones
            raise layout.error(f"it holds {top} image{'' if top == 1 else 's'} but no "
                               "class sub-folders; a class is a sub-folder: give the folder "
                               "above, whose sub-folders are the classes, or move the images "
                               "into one sub-folder per class")
        raise layout.error("no class sub-folders")
    if len(classes) == 1:  # one level too high: DIR/images/<class>/ is a common layout
        inner = _sub_folders(folder / classes[0])
        if len(inner) > 1:
            raise layout.error(f"it holds one folder, {classes[0]}/, whose {len(inner)} "
                               f"sub-folders ({_first_names(inner)}) look like the classes: "
                               f"give {folder / classes[0]} as the folder")
    _refuse_split_folders(folder, classes, layout)
    # name_order puts a name's NFC and NFD spellings side by side; on Linux they are two
    # folders (a Mac's zip unpacked beside a copy made here), which print alike
    for before, after in itertools.pairwise(classes):
        if name_order(before)[0] == name_order(after)[0]:
            raise layout.error(f"class folders {shown_name(before)}/ and {shown_name(after)}/ "
                               "spell one name in two Unicode forms (composed, NFC, and "
                               "decomposed, NFD, as macOS writes names: é as one character or "
                               "as e + U+0301), which print alike but would be two classes; "
                               "move the images of one into the other")
    paths: list[str] = []
    labels: list[int] = []
    read = {os.path.realpath(folder): str(folder)}  # a link back to DIR is a loop
    listed: dict[str, str] = {}
    passed_over: Counter[str] = Counter()
    for label, name in enumerate(classes):
        others: Counter[str] = Counter()
        images = class_images(folder / name, layout, read, listed, others)
        if not images:  # its other files said: photos of a kind kdml does not read (.heic)
            counted = [f"{count} {kind}" for kind, count in others.most_common()]
            held = (f"; it holds {_first_names(counted)}: convert its images to one of those"
                    if others else "")
            raise layout.error(f"class folder {name}/ holds no images (extensions: "
                               f"{' '.join(IMAGE_EXTENSIONS)}){held}; add its images or remove "
                               "it")
        passed_over.update(others)
        paths.extend(images)
        labels.extend([label] * len(images))
    layout.check_images(paths)  # a link that leads to no file would fail only after training
    if passed_over or top:  # said, not silently dropped (a .heic or .jfif photo, say)
        kinds = ", ".join(f"{count} {kind}" for kind, count in passed_over.most_common())
        logger.warning("%s: %s left out: %s%s", layout.dataset, "files" if passed_over else
                       "images", f"{kinds} in the class folders (not among the image "
                       f"extensions {' '.join(IMAGE_EXTENSIONS)})" if passed_over else "",
                       f"{'; ' if passed_over else ''}{top} directly in {folder}, in no class "
                       "folder" if top else "")
    dataset = ImageFiles(layout.dataset, f"images in {folder}, {len(classes)} classes "
                         "(one sub-folder each)", np.asarray(paths), torch.tensor(labels),
                         class_names={label: shown_name(name) for label, name in
                                      enumerate(classes)})
    return DatasetParts(dataset)


def _file_hint(path: Path) -> str:
    """What to do about ``folder:FILE``, by what the file's extension says it is."""
    suffix = path.suffix.lower()
    if suffix in (".csv", ".npz"):
        what = "a CSV list of images" if suffix == ".csv" else "a feature file"
        return f"for {what} use --dataset {suffix[1:]}:{path}"
    if suffix in (".zip", ".tar", ".gz", ".tgz", ".7z"):
        return "extract it and give the folder it unpacks to"
    return "give the folder that holds the class sub-folders"


def shown_name(name: str) -> str:
    """A class folder's name as the class is shown: the name itself where it is UTF-8, else
    with each byte that is not (Latin-1 from an old zip, which Python reads as a surrogate)
    written ``\\xNN``: ``f\\xf6x``, which captions, fonts and strict terminals can all show."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")
