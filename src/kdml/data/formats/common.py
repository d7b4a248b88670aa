"""What every on-disk format shares: the parts it returns and its one-line errors.

A format reads its standard extracted layout from a root folder and returns
:class:`DatasetParts`: every sample with its label, plus the dataset's own split. Every problem
with the files is a :class:`~kdml.errors.KdmlError` of one line that names the file, what was
wrong, the expected layout and the root that was searched.
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

from kdml.data.dataset import DmlDataset
from kdml.data.images import ListedAt, missing_files
from kdml.errors import KdmlError, home_expanded

DEFAULT_KS = (1, 2, 4, 8)
# An integer as a list writes one: int() also reads 1_000, +1 and other scripts' digits (one
# class with 1000 and 1 in a label column).
INTEGER = re.compile(r"-?[0-9]+")
INT64 = range(-2**63, 2**63)  # what a label tensor holds
Line = TypeVar("Line")  # where a key was read: a line number, or a (file, line number)
Place = int | tuple[str, int]  # where an image is listed: a line number, or (file, number)
PART_NAMES = ("train", "test", "query", "gallery")


@dataclass
class DatasetParts:
    """A dataset as read from disk.

    Args:
        dataset: every sample with its label: the files' class ids where they have them,
            else classes numbered 0..C-1 in sorted order.
        parts: the dataset's own split as index tensors into ``dataset``: ``train`` and
            ``test``, or ``train``, ``query`` and ``gallery`` (In-Shop). Empty when the
            dataset has no split of its own (the split then follows ``data.split``).
        eval_ks: the Recall@K values papers report for this dataset (``eval.ks`` default).
    """

    dataset: DmlDataset
    parts: dict[str, Tensor] = field(default_factory=dict)
    eval_ks: tuple[int, ...] = DEFAULT_KS

    def __post_init__(self) -> None:
        unknown = set(self.parts) - set(PART_NAMES)
        if unknown:
            raise ValueError(f"unknown part names {sorted(unknown)}")


@dataclass(frozen=True)
class Layout:
    """How to report problems with one format's files.

    Args:
        dataset: the ``--dataset`` name, e.g. ``"cub"``.
        root: the folder that was searched.
        expected: the expected layout in a few words, e.g. ``"CUB-200-2011's images.txt,
            image_class_labels.txt and images/"``.
    """

    dataset: str
    root: Path
    expected: str

    def error(self, problem: str) -> KdmlError:
        return KdmlError(f"{self.dataset}: {problem} (searched {self.root}; expected "
                         f"{self.expected})")

    def file(self, relative: str) -> Path:
        """``root / relative``, which must be an existing file."""
        path = self.root / relative
        if not path.is_file():
            raise self.error(self.lacks(relative))
        return path

    def lacks(self, *names: str) -> str:
        """What to say of a needed file none of whose ``names`` is a file in the root: "X is
        not a file" for the first that is there as something else (a folder), which "missing"
        had called absent, else "missing X" of the first name."""
        there = next((name for name in names if (self.root / name).exists()), None)
        return f"{there} is not a file" if there is not None else f"missing {names[0]}"

    def read_rows(self, relative: str, columns: int, header_lines: int = 0,
                  example: str = "") -> list[tuple[int, list[str]]]:
        """The whitespace-separated rows of a text file, each with its 1-based line number.

        A byte-order mark at the start is dropped (as the CSV reader does); blank lines are
        skipped; a row with another number of fields than ``columns`` is a malformed line
        (``example`` shows a good one).
        """
        path = self.file(relative)
        try:
            lines = path.read_text(encoding="utf-8-sig").splitlines()
        except UnicodeDecodeError:
            raise self.error(f"{relative} is not UTF-8 text") from None
        rows = []
        for number, line in enumerate(lines[header_lines:], start=header_lines + 1):
            fields = line.split()
            if not fields:
                continue
            if len(fields) != columns:
                hint = f", e.g. {example!r}" if example else ""
                # the official files separate fields by whitespace, so a space splits a path
                spaces = (" (fields are separated by whitespace: rename any file or folder "
                          "with a space in its name)") if len(fields) > columns else ""
                raise self.error(f"{relative} line {number} is malformed: expected {columns} "
                                 f"fields{hint}, got {line.strip()[:80]!r}{spaces}")
            rows.append((number, fields))
        if not rows:
            raise self.error(f"{relative} lists nothing")
        return rows

    def header(self, relative: str, count: int) -> list[str]:
        """The first ``count`` lines of a text file (the header lines ``read_rows`` skips)."""
        with self.file(relative).open(encoding="utf-8-sig", errors="replace") as handle:
            return [handle.readline().strip() for _ in range(count)]

    def integer(self, text: str, relative: str, line: int) -> int:
        if not INTEGER.fullmatch(text):
            raise self.error(f"{relative} line {line} is malformed: {text!r} is not an "
                             "integer")
        if int(text) not in INT64:
            raise self.error(f"{relative} line {line} is malformed: {text} is beyond the "
                             "64-bit integers an id can be")
        return int(text)

    def check_path(self, path: str, where: str) -> None:
        """Refuse a listed path that holds a NUL byte, a damaged list: no file name can hold
        one, and the file system's calls raise on it instead of saying the file is missing."""
        if "\0" in path:
            raise self.error(f"{where}the path {path!r} holds a NUL byte, which no file name "
                             "can: the list is damaged; correct or remove that line")

    def check_images(self, paths: Sequence[str], lines: Sequence[Place] | None = None,
                     unit: str = "line", why: Callable[[str], str] | None = None) -> None:
        """Every listed image must be a file (a link must lead to one); report the first that
        is not, and the count, at its place in the list where ``lines`` gives each path's (a
        line number of the one list, or a list file and its line: :func:`place`). ``why``
        says, of a missing path, why it may be missing (``": ..."``), or ``""``."""
        missing = missing_files(paths)
        if not missing:
            return
        first = missing[0]
        where = f"{place(lines[list(paths).index(first)], unit)}: " if lines is not None else ""
        self.check_path(first, where)
        link = (f", a link to {os.readlink(first)} that leads to no file"
                if os.path.islink(first) else "")
        unreadable = unreadable_folder(os.path.dirname(first))
        if unreadable:  # there, perhaps, but not to be listed: "missing" would mislead
            raise self.error(f"{where}cannot read the folder of {first} ({unreadable}); make "
                             f"it readable ({len(missing)} of {len(paths)} listed images could "
                             "not be found)")
        if os.path.isdir(first):  # there, but a folder: "missing" would send the user looking
            raise self.error(f"{where}{first} is a folder, not an image file; list its images "
                             f"one per line ({len(missing)} of {len(paths)} listed images are "
                             "not files)")
        twin = unicode_twin(first)
        if twin is not None:  # the name as listed and as on disk print alike: say why
            form = unicode_form(twin)
            raise self.error(f"{where}missing image {first}: the file there is named in "
                             f"Unicode's {form} form and the list in the {unicode_form(first)} "
                             "one, which look alike but are two names on this file system; "
                             f"write the list's paths in {form[-4:-1]} (Python: unicodedata."
                             f"normalize('{form[-4:-1]}', path)) ({len(missing)} of "
                             f"{len(paths)} listed images are missing)")
        reason = why(first) if why is not None and not link else ""
        raise self.error(f"{where}missing image {first}{link}{reason} ({len(missing)} of "
                         f"{len(paths)} listed images are missing)")


def place(line: Place, unit: str = "line") -> str:
    """Where a listed image is in its list, for an error: ``"line 5"`` of the one list the
    dataset is (a CSV, whose name the error already gives), ``"Ebay_test.txt line 5"`` of one
    of a dataset's list files; ``unit`` names what is counted (``"annotation"`` for
    Cars196's ``cars_annos.mat``, which has no lines).

    >>> place(("Ebay_test.txt", 5))
    'Ebay_test.txt line 5'
    """
    if isinstance(line, tuple):
        file, number = line
        return f"{file} {unit} {number}"
    return f"{unit} {line}"


def listed_at(lines: Sequence[Place], unit: str = "line", file: str = "") -> ListedAt:
    """Each image's place in its list (a line number of the one list ``file``, or a list file
    and its line, as :meth:`Layout.check_images` takes them), kept for the error or warning of
    an image that is there but does not decode, which only the loader finds.

    >>> listed_at([("Ebay_train.txt", 2), ("Ebay_test.txt", 2)]).of(1)
    'Ebay_test.txt line 2'
    """
    named = [line if isinstance(line, tuple) else (file, line) for line in lines]
    files = tuple(dict.fromkeys(name for name, _ in named))
    index = {name: position for position, name in enumerate(files)}
    return ListedAt(files, np.array([index[name] for name, _ in named], dtype=np.int32),
                    np.array([number for _, number in named], dtype=np.int64), unit)


def real_path(path: str, folders: dict[str, tuple[str, frozenset[str]]]) -> str:
    """``os.path.realpath(path)`` of an absolute ``path``, the same string, at one realpath and
    one listing per folder instead of a system call per folder level per file (a list of
    120,053 images in 12 folders): ``folders`` keeps each folder's real path and the names in
    it that are not links, for the next file of the same folder.

    The real path of a file that is not a link is its folder's real path joined with its name,
    as realpath itself builds it; a link, a name the listing lacks (a missing file, another
    spelling of a name), an unlistable folder, and ``.`` or ``..`` as the last part take
    realpath itself.
    """
    folder, name = os.path.split(path)
    if name in ("", os.curdir, os.pardir):
        return os.path.realpath(path)
    if folder not in folders:
        real = os.path.realpath(folder)
        folders[folder] = real, plain_entries(real)
    real, plain = folders[folder]
    return os.path.join(real, name) if name in plain else os.path.realpath(path)


def plain_entries(folder: str) -> frozenset[str]:
    """The names in ``folder`` that are not symbolic links; none where it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return frozenset(entry.name for entry in entries if not entry.is_symlink())
    except (OSError, ValueError):  # missing, unreadable, a loop of links
        return frozenset()


def unicode_twin(path: str, kind: str = "file") -> str | None:
    """The file (``kind="folder"``: folder) that ``path`` names but for the Unicode form of
    its names, where ``path`` itself is not one: ``café`` composed (NFC, U+00E9, as most
    editors and Linux tools write it) in a list or ``folder:`` name, ``café`` decomposed (NFD,
    e + U+0301) on disk, as macOS writes names and its zip files keep them. The two print
    alike, so "missing image" or "no such folder" alone would name what the user can see;
    ``None`` where no such file or folder is there."""
    parts = Path(path).parts
    found = parts[0]
    for part in parts[1:]:
        candidate = os.path.join(found, part)
        if not os.path.lexists(candidate):
            wanted = unicodedata.normalize("NFC", part)
            try:
                with os.scandir(found) as entries:
                    candidate = next((entry.path for entry in entries
                                      if unicodedata.normalize("NFC", entry.name) == wanted),
                                     "")
            except OSError:
                return None
            if not candidate:
                return None
        found = candidate
    # ``path`` itself is not one
    return found if (os.path.isdir if kind == "folder" else os.path.isfile)(found) else None


def unicode_hint(path: Path, kind: str) -> str:
    """``"; ..."``, what to write where ``path``, a ``folder:`` or ``csv:`` path that is not a
    ``kind`` ("file" or "folder"), names one but for the Unicode form of its names; else
    ``""``."""
    twin = unicode_twin(str(path), kind)
    if twin is None:
        return ""
    return (f"; the {kind} there is named in Unicode's {unicode_form(twin)} form and the "
            f"path given in the {unicode_form(str(path))} one, which look alike but are two "
            "names on this file system: type the path with the shell's Tab completion, which "
            "copies the name as stored, or rename the " + kind)


def unicode_form(path: str) -> str:
    """``"decomposed (NFD)"`` where a name of ``path`` is written so, else ``"composed
    (NFC)"``."""
    return ("decomposed (NFD)" if any(not unicodedata.is_normalized("NFC", part)
                                      for part in Path(path).parts) else "composed (NFC)")


def unreadable_folder(folder: str) -> str:
    """Why ``folder`` cannot be listed where the system refuses it (no permission on it or on
    a folder above it: "Permission denied"), else "" (it lists, or it does not exist)."""
    try:
        with os.scandir(folder or "."):
            return ""
    except PermissionError as error:
        return error.strerror or "Permission denied"
    except (OSError, ValueError):  # missing, not a folder, a NUL byte: said otherwise
        return ""


def resolved(path: Path, dataset: str, kind: str) -> Path:
    """``path`` made absolute, links resolved, or a one-line error where it is a loop of
    links (Python before 3.13 raises RuntimeError there; 3.13 returns the link)."""
    expanded = home_expanded(path)
    try:
        real = expanded.resolve()
    except (RuntimeError, OSError):
        real = expanded.absolute()
    if real.is_symlink():  # resolving stopped at a link: one that leads back to itself
        raise KdmlError(f"{dataset}: {real} is a symbolic link in a loop (it leads back to "
                        f"itself), so it names no {kind}; give the path of the {kind} itself")
    return real


def first_repeat(keys: Iterable[tuple[Hashable, Line]]) -> tuple[Hashable, Line, Line]:
    """The first key, with its line numbers, of (key, line) pairs that repeats one."""
    first_line: dict[Hashable, Line] = {}
    for key, line in keys:
        if key in first_line:
            return key, first_line[key], line
        first_line[key] = line
    raise ValueError("no key repeats")


def repeated_path(paths: Iterable[tuple[str, Line]]) -> tuple[str, Line, Line] | None:
    """The first image path listed twice, with both line numbers, of (path, line) pairs, paths
    compared as written once normalised (``a/./b`` is ``a/b``); ``None`` when each is listed
    once. A duplicate would be its twin's perfect match, or have two labels."""
    files = [(os.path.normpath(path), line) for path, line in paths]
    if len({file for file, _ in files}) == len(files):
        return None
    path, first, line = first_repeat(files)
    return str(path), first, line


def indices_where(mask: Sequence[bool] | Tensor) -> Tensor:
    """Positions of the True entries, as a sorted int64 tensor."""
    return torch.as_tensor(mask, dtype=torch.bool).nonzero().squeeze(1)
