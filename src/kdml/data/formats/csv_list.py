"""A CSV list of the user's images (``--dataset csv:FILE``), one row per image after a header::

    path,label,split[,is_query,is_gallery]
    birds/0001.jpg,sparrow,train
    birds/0107.jpg,finch,test,1,0

``path`` is relative to the CSV file's folder (or absolute, or in a home folder: ``~/a.jpg``,
``~user/a.jpg``); ``label`` is an integer or a string, the sorted distinct labels
(integers in numeric order, also written ``1.0`` as a float column is: ``1`` and ``1.0`` are
one class) becoming 0..C-1 and their text the classes' names; ``split`` is ``train`` or
``test``. Column names, ``split`` values and flag values are read without regard to case
(``Path``, ``TEST``, ``True``); labels are not (``Cat`` and ``cat`` are two classes; one
spelled in two Unicode forms, ``café`` composed on one row and decomposed on another, is
refused), and paths are as the file system spells them. Spaces around a name or value are
ignored; the columns may come in any order and extra columns are ignored.

Split: the ``split`` column's ``train`` and ``test`` rows. With ``is_query`` and ``is_gallery``
columns (0/1 or true/false, empty meaning 0) the test rows are divided instead into a query
part and a gallery part, as for In-Shop: each test row is in exactly one (a row in both would
find itself, as the gallery search does not leave a query's own image out; a row in neither
would be left out); train rows' flags are ignored. Each image is listed once (a duplicate would
be its twin's perfect match, or have two labels).
"""

from __future__ import annotations

import csv
import os
import re
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kdml.data.formats.common import (
    DatasetParts,
    Layout,
    indices_where,
    listed_at,
    real_path,
    resolved,
    unicode_hint,
)
from kdml.data.images import ImageFiles
from kdml.errors import KdmlError, home_expanded

EXPECTED = "a header 'path,label,split[,is_query,is_gallery]' then one row per image"
REQUIRED = ("path", "label", "split")
FLAGS = ("is_query", "is_gallery")
# a label that is a whole number: an integer, also as a float column writes it (1.0, pandas);
# 1.5 or 1.10 stay names (a section "1.10" is not "1.1")
WHOLE_NUMBER = re.compile(r"(-?[0-9]+)(\.0*)?")
FLAG_VALUES = {"0": False, "1": True, "false": False, "true": True, "": False}


def read_table(layout: Layout, csv_file: Path) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """The lower-cased header and the non-blank rows, each with its line number."""
    if csv_file.is_dir():
        raise layout.error(f"it is a folder, not a CSV file; for a folder of class sub-folders "
                           f"use --dataset folder:{csv_file}")
    if not csv_file.is_file():
        raise layout.error(f"no such file{unicode_hint(csv_file, 'file')}")
    with csv_file.open(newline="", encoding="utf-8-sig") as stream:
        reader = csv.reader(stream, strict=True)
        try:
            table = [(reader.line_num, row) for row in reader if any(f.strip() for f in row)]
        except UnicodeDecodeError:
            raise layout.error("the file is not UTF-8 text") from None
        except csv.Error as error:
            raise layout.error(f"line {reader.line_num} is malformed CSV: {error}") from None
    if not table:
        raise layout.error("the file is empty")
    header = [name.strip().lower() for name in table[0][1]]
    for column in REQUIRED:
        if column not in header:
            raise layout.error(f"line {table[0][0]}: the header has no {column!r} column "
                               f"(found {header})")
    for column in (*REQUIRED, *FLAGS):  # which one was meant is not for kdml to guess
        if header.count(column) > 1:
            spelled = [name.strip() for name in table[0][1] if name.strip().lower() == column]
            raise layout.error(f"line {table[0][0]}: the header names the {column!r} column "
                               f"{len(spelled)} times ({', '.join(spelled)}: names are read "
                               "without regard to case); keep one")
    if sum(flag in header for flag in FLAGS) == 1:
        raise layout.error(f"line {table[0][0]}: is_query and is_gallery come together")
    for line, row in table[1:]:
        if len(row) != len(header):
            raise layout.error(f"line {line}: expected {len(header)} fields as in the header, "
                               f"got {len(row)}")
    if len(table) == 1:
        raise layout.error("the file lists no images after its header")
    return header, table[1:]


def flag(layout: Layout, value: str, column: str, line: int) -> bool:
    """An is_query / is_gallery value as a bool."""
    try:
        return FLAG_VALUES[value.strip().lower()]
    except KeyError:
        raise layout.error(f"line {line}: {column} must be 0, 1, true or false, got "
                           f"{value!r}") from None


def label_ids(names: list[str]) -> tuple[list[int], dict[int, str]]:
    """``names`` mapped to 0..C-1 in sorted order (numeric order when all are whole numbers),
    and each id's label as the file writes it (its first spelling, for numbers such as 07 or
    1.0).

    Whole numbers are compared as integers also where written with a zero fraction: a table's
    float column, which pandas writes ``1.0``, ``2.0``, ``10.0`` (an integer column holding an
    empty cell becomes one), had sorted as text, ``10.0`` before ``2.0``, so its class-disjoint
    split took other classes than the same labels written as integers; and ``1`` and ``1.0``
    had been two classes."""
    keys: list[Any] = list(names)  # all ints or all strs: they sort
    numbers = [WHOLE_NUMBER.fullmatch(name) for name in names]
    if all(numbers):
        keys = [int(number.group(1)) for number in numbers if number]
    index = {key: position for position, key in enumerate(sorted(set(keys)))}
    spelling: dict[int, str] = {}
    for key, name in zip(keys, names, strict=True):
        spelling.setdefault(index[key], name)
    return [index[key] for key in keys], spelling


def _refuse_unicode_twins(layout: Layout, names: list[str], lines: list[int]) -> None:
    """Refuse a label spelled in two Unicode forms (``café`` composed, NFC, on one row and
    decomposed, NFD, e + U+0301, as macOS spells file and folder names, on another): they print
    alike but had been two classes, so that each image of one counted as a miss for the
    other's queries."""
    first: dict[str, tuple[str, int]] = {}
    for name, line in zip(names, lines, strict=True):
        spelled, at = first.setdefault(unicodedata.normalize("NFC", name), (name, line))
        if spelled != name:
            raise layout.error(f"lines {at} and {line} spell the label {name!r} in two Unicode "
                               "forms (composed, NFC, and decomposed, NFD: é as one character "
                               "or as e + U+0301), which print alike but would be two classes; "
                               "write it alike on every row (Python: unicodedata.normalize("
                               "'NFC', label))")


def _why_missing(path: str, parent: Path) -> str:
    """Why the image a CSV row lists as ``path`` may be missing where another file is there
    (``": ..."``), else ``""``: the two ways a list made elsewhere goes wrong, which the
    absolute path in "missing image" does not show. A list written on Windows separates
    folders with ``\\``, which a POSIX system reads as part of a name; a list written with
    paths relative to the folder the user works in, not to the CSV's."""
    if os.sep == "/" and "\\" in path and (parent / path.replace("\\", "/")).is_file():
        return (": its path separates folders with '\\', as Windows writes paths, which this "
                "system reads as part of a name; write the list's paths with '/'")
    # relative to the current folder (not the CSV's, where it is missing)
    if not os.path.isabs(path) and not path.startswith("~") and Path(path).is_file():
        return (f": paths are read relative to the CSV's folder, {parent}, and {path} is a "
                "file relative to the current folder; write them relative to the CSV's folder, "
                "or absolute")
    return ""


def _home_expanded(layout: Layout, path: str, line: int) -> str:
    """A listed ``path`` with a leading ``~`` or ``~user`` expanded, as kdml expands it in
    every path it is given (``--dataset csv:~/list.csv``, ``data.root``): joined to the CSV's
    folder as written, ``~/a.jpg`` had been a folder named ``~`` beside the CSV. A ``~user``
    that names no home folder is refused in one line (a file of the CSV's folder whose name
    starts with ``~`` is listed as ``./~name``)."""
    if not path.startswith("~"):
        return path
    try:
        return str(home_expanded(path))
    except KdmlError as error:
        raise layout.error(f"line {line}: {error}, or ./{path} for a file of the CSV's "
                           "folder") from None


def load_csv(csv_file: Path) -> DatasetParts:
    """Read the images listed in ``csv_file`` with their labels and split."""
    csv_file = resolved(csv_file, f"csv:{Path(csv_file).name}", "file")
    layout = Layout(f"csv:{csv_file.name}", csv_file, EXPECTED)
    header, rows = read_table(layout, csv_file)
    column = {name: header.index(name) for name in (*REQUIRED, *FLAGS) if name in header}
    paths, names, is_train, is_query, is_gallery = [], [], [], [], []
    # image, links resolved -> the line, label, path and full path of its first row
    first_listed: dict[str, tuple[int, str, str, str]] = {}
    folders: dict[str, tuple[str, frozenset[str]]] = {}  # real_path's per folder
    parent = csv_file.parent
    for line, row in rows:
        path, name, split = (row[column[key]].strip() for key in REQUIRED)
        if not path or not name:
            raise layout.error(f"line {line}: empty {'path' if not path else 'label'}")
        if split.lower() not in ("train", "test"):
            raise layout.error(f"line {line}: split must be train or test, got {split!r}")
        layout.check_path(path, f"line {line}: ")
        # An image listed twice is its twin's perfect match (Recall@1 of 1), or has two labels;
        # so is one listed under two names, through a link.
        listed = str(parent / _home_expanded(layout, path, line))
        image = real_path(listed, folders)
        if image in first_listed:
            first, label, first_path, first_listed_as = first_listed[image]
            how = f"with labels {label!r} and {name!r}" if label != name else "twice"
            linked = os.path.normpath(first_listed_as) != os.path.normpath(listed)
            what = (f"{first_path} and {path}, one image through a link," if linked
                    else f"the image {path}")
            raise layout.error(f"lines {first} and {line} list {what} {how}; list each image "
                               f"once, under its one label")
        first_listed[image] = (line, name, path, listed)
        paths.append(listed)
        names.append(name)
        is_train.append(split.lower() == "train")
        if "is_query" in column and is_train[-1]:  # a train row's flags are not read
            is_query.append(False)
            is_gallery.append(False)
        elif "is_query" in column:
            is_query.append(flag(layout, row[column["is_query"]], "is_query", line))
            is_gallery.append(flag(layout, row[column["is_gallery"]], "is_gallery", line))
            # The metrics search a gallery without leaving a query's own image out (as
            # In-Shop's disjoint parts need): a query in the gallery would find itself.
            if is_query[-1] and is_gallery[-1]:
                raise layout.error(f"line {line}: {path} has is_query=1 and is_gallery=1, so it "
                                   "would find itself (a perfect Recall@1); make each test image "
                                   "a query or a gallery image, or drop both columns to search "
                                   "every test image among the others")
            if not (is_query[-1] or is_gallery[-1]):
                raise layout.error(f"line {line}: {path} has is_query=0 and is_gallery=0, so it "
                                   "would be left out of the test; mark it a query (is_query=1), "
                                   "a gallery image (is_gallery=1) or a train row (split=train)")
    lines = [line for line, _ in rows]
    written = dict(zip(paths, (row[column["path"]].strip() for _, row in rows), strict=True))
    layout.check_images(paths, lines=lines,
                        why=lambda path: _why_missing(written[path], parent))
    train = torch.tensor(is_train)
    if is_query:
        parts = {"train": indices_where(train),
                 "query": indices_where(~train & torch.tensor(is_query)),
                 "gallery": indices_where(~train & torch.tensor(is_gallery))}
    else:
        parts = {"train": indices_where(train), "test": indices_where(~train)}
    _refuse_unicode_twins(layout, names, lines)
    labels, class_names = label_ids(names)
    dataset = ImageFiles(layout.dataset, f"images listed in {csv_file}", np.asarray(paths),
                         torch.tensor(labels), class_names=class_names,
                         listed_at=listed_at(lines, file=csv_file.name))
    return DatasetParts(dataset, parts)
