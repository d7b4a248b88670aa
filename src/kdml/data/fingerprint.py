"""A fingerprint of the data a run trains and scores on, kept in its run folder (``data.json``)
so that ``kdml eval`` and the other commands, or ``kdml train --resume``, refuse data other
than the run's instead of scoring it: ``--data-root`` pointed at another dataset with as many
training classes loads the checkpoint without complaint.

Each part of the splits (``train``, then ``validation`` or ``test`` and ``gallery`` as the run
has them, and ``target``) gets its sample count, class count and a SHA-256 of its samples'
identities, labels and class names. A file's identity is its path relative to the deepest
folder holding all of the part's files, so a copy of the dataset moved elsewhere matches; an
in-memory array's is its dtype, shape and bytes (floats rounded: :func:`_stable_bytes`). Splits
are deterministic, so the order of the samples is part of the digest; nothing hashed depends on
the process (no Python ``hash()``).
"""

from __future__ import annotations

import hashlib
import json
import os
import unicodedata
from typing import Any

import numpy as np

from kdml.data.dataset import ArrayDataset, DmlDataset
from kdml.data.images import ImageFiles
from kdml.data.splits import DataSplits
from kdml.errors import counted

# The top-level field that marks kdml's data.json and holds its format's version: a fingerprint
# of another version is not compared (its digests may cover other things).
FORMAT_FIELD = "data_fingerprint"
FORMAT = 1
# The parts in the order a difference is looked for (and said).
PARTS = ("train", "validation", "test", "gallery", "target")


def data_fingerprint(splits: DataSplits, test_part: DataSplits | None = None) -> dict[str, Any]:
    """The fingerprint of ``splits`` as a run trains on them and, for a run that validates
    (``splits.validation``), of ``test_part``: the same data split without validation.

    Returns:
        ``{"data_fingerprint": 1, "folder": F, "parts": {NAME: {"samples": N, "classes": C,
        "kind": "files" or "array", "sha256": HEX}}}``, NAME among :data:`PARTS`. ``F`` is the
        deepest folder holding every file (for an array read from files, as MNIST's IDX files,
        their folder; ``None`` for data made in memory), to say where the data was read from;
        it is not compared (a moved copy still matches).
    """
    parts: dict[str, DmlDataset | None] = {"train": splits.train, "target": splits.target}
    if splits.validation:  # its test part, when given, is the one it is finally scored on
        parts["validation"] = splits.test
        if test_part is not None:
            parts["test"], parts["gallery"] = test_part.test, test_part.gallery
    else:
        parts["test"], parts["gallery"] = splits.test, splits.gallery
    extra = {"train": json.dumps(splits.train_classes).encode()}  # the labels before remapping
    entries, folders = {}, []
    for name in PARTS:
        part = parts.get(name)
        if part is not None:
            entries[name], folder = _part(part, extra.get(name, b""))
            folders += [folder] if folder else []
    return {FORMAT_FIELD: FORMAT, "folder": _shared_folder(folders), "parts": entries}


def fingerprint_difference(recorded: dict[str, Any], now: dict[str, Any]) -> str | None:
    """How the data ``now`` differs from the data ``recorded`` (both :func:`data_fingerprint`
    results), as a clause: ``"its train part had 5,864 samples of 100 classes then and has
    5,000 samples of 100 classes now"``; ``None`` when they agree, or when ``recorded`` is of
    another format (or not kdml's whole) and cannot be compared."""
    then_parts, now_parts = recorded.get("parts"), now["parts"]
    if recorded.get(FORMAT_FIELD) != FORMAT or not isinstance(then_parts, dict) or not all(
            isinstance(part, dict) for part in then_parts.values()):
        return None
    difference = _first_differing_part(then_parts, now_parts)
    if difference is None:
        return None
    name, then, current = difference
    if then is None or current is None:
        had, has = ("none", _counts(current)) if then is None else (_counts(then), "none")
        return f"its {name} part had {had} then and has {has} now"
    if not _same_counts(then, current):
        return f"its {name} part had {_counts(then)} then and has {_counts(current)} now"
    return (f"its {name} part has the same {_counts(current)} but its {_contents(current)} or "
            "labels differ")


def rank_difference(first: dict[str, Any], other: dict[str, Any], rank: int) -> str | None:
    """How rank ``rank``'s data (``other``) differs from rank 0's (``first``), both
    :func:`data_fingerprint` results of the same kdml, as a clause; ``None`` when they agree.
    Paths are not compared (each machine may keep its copy elsewhere), nor ``folder``."""
    difference = _first_differing_part(first["parts"], other["parts"])
    if difference is None:
        return None
    name, zero, current = difference
    if current is None:
        return f"rank {rank} has no {name} part, rank 0's has {_counts(zero)}"
    if zero is None:
        return f"rank {rank}'s {name} part has {_counts(current)}, rank 0 has none"
    if not _same_counts(zero, current):
        return f"rank {rank}'s {name} part has {_counts(current)}, rank 0's {_counts(zero)}"
    return (f"rank {rank}'s {name} part has the same {_counts(current)} as rank 0's, but its "
            f"{_contents(current)} or labels differ")


def _first_differing_part(first: dict[str, Any], second: dict[str, Any]
                          ) -> tuple[str, Any, Any] | None:
    """The first part, in :data:`PARTS` order, whose entries differ between two fingerprints'
    ``parts``: its name and each side's entry (``None`` where that side has no such part);
    ``None`` when every part agrees."""
    for name in PARTS:
        if first.get(name) != second.get(name):
            return name, first.get(name), second.get(name)
    return None


def _same_counts(first: dict[str, Any], second: dict[str, Any]) -> bool:
    return (first.get("samples"), first.get("classes")) == (second.get("samples"),
                                                            second.get("classes"))


def _contents(part: dict[str, Any]) -> str:
    """What a part's entry hashes: its image ``files``, or its in-memory ``samples``."""
    return "files" if part["kind"] == "files" else "samples"


def _counts(part: dict[str, Any]) -> str:
    return (f"{counted(part.get('samples', 0), 'sample')} of "
            f"{counted(part.get('classes', 0), 'class', 'classes')}")


def _part(dataset: DmlDataset, extra: bytes) -> tuple[dict[str, Any], str | None]:
    """One part's entry (its counts and the SHA-256 of its samples, labels, class names and
    ``extra``), and the deepest folder holding its files (for an array, the folder it was read
    from: ``None`` for data made in memory)."""
    digest = hashlib.sha256()
    folder: str | None = None
    if isinstance(dataset, ImageFiles):
        kind = "files"
        paths = dataset.paths.tolist()
        folder = _common_folder(paths)
        # NUL before each path (no path holds one), the folder cut off each at once: a
        # string's replace, many times faster than slicing 100,000 paths one by one
        joined = "\0" + "\0".join(paths)
        relative = joined.replace("\0" + folder, "\0") if folder else joined
        # the same files on Windows ("\\") or macOS (decomposed accents) hash the same
        relative = unicodedata.normalize("NFC", relative.replace(os.sep, "/"))
        # surrogateescape: a file name that is not UTF-8, as Python reads one
        digest.update(relative.encode("utf-8", "surrogateescape"))
    elif isinstance(dataset, ArrayDataset):
        kind = "array"
        folder = dataset.folder  # the files it was read from; None for data made in memory
        array = np.ascontiguousarray(dataset.x.numpy())  # the samples' memory: no copy
        digest.update(f"{array.dtype.str} {array.shape}\0".encode())
        digest.update(_stable_bytes(array))
    else:  # every dataset kdml makes is one of the two
        raise TypeError(f"no fingerprint for a {type(dataset).__name__}")
    digest.update(b"\0labels\0" + dataset.labels.numpy().astype("<i8").tobytes())
    # NFC, as the paths above: a class folder's name spelled decomposed (macOS) is the same
    names = sorted((label, unicodedata.normalize("NFC", name) if isinstance(name, str) else name)
                   for label, name in (dataset.class_names or {}).items())
    # surrogateescape: a name holding bytes that are not UTF-8, as Python reads a file name;
    # a UTF-8 name encodes as before, so existing runs' data.json still match
    names_json = json.dumps(names, ensure_ascii=False).encode("utf-8", "surrogateescape")
    digest.update(b"\0classes\0" + names_json + extra)
    return {"samples": len(dataset), "classes": dataset.num_classes, "kind": kind,
            "sha256": digest.hexdigest()}, folder


def _shared_folder(folders: list[str]) -> str | None:
    """The folder holding every part's files, for messages (``None`` for arrays, or where the
    parts lie on different Windows drives and no folder holds them all)."""
    try:
        return os.path.commonpath(folders) if folders else None
    except ValueError:
        return None


def _stable_bytes(array: np.ndarray) -> memoryview:
    """The bytes of ``array`` to hash: as they are for integers (images); for floating point
    (generated MNIST-1D, PCA-reduced features, computed in float64) rounded to float32 with the
    last 8 of its 23 mantissa bits cleared (a relative step of 3e-5), so that the last-bit
    differences another BLAS, CPU or thread count gives float64 features do not refuse the
    run's own data. A value within that of a rounding boundary can still tip over (float32
    noise would do so for a few values in a thousand); the refusal then says how to go on."""
    if not np.issubdtype(array.dtype, np.floating):
        return array.data
    coarse = array.astype(np.float32) + np.float32(0.0)  # + 0: -0.0 and 0.0 alike
    return (coarse.view(np.uint32) & np.uint32(0xFFFFFF00)).data


def _common_folder(paths: list[str]) -> str:
    """The deepest folder holding all of ``paths`` with its trailing separator, or ``""``
    (none, or no path). The paths are those the reader made: absolute, as the file system
    spells them."""
    if not paths:
        return ""
    # the common prefix of the smallest and largest path is that of all of them: cut back to
    # its last separator, so that "/d/c1/a.jpg" and "/d/c10/b.jpg" share "/d/", not "/d/c1"
    prefix = os.path.commonprefix([min(paths), max(paths)])
    cut = max(prefix.rfind(os.sep), prefix.rfind("/"))
    return prefix[:cut + 1]
