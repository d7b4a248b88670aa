"""The one exception type that the CLI turns into a one-line message."""

from __future__ import annotations

import difflib
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

E = TypeVar("E", bound=BaseException)


class KdmlError(ValueError):
    """Bad input from the user: the message says what was wrong and what to do."""


class QuietExit(KdmlError):
    """A failure that another process (rank 0 under torchrun) reports; this one stops without
    printing it again."""


class LocalError(KdmlError):
    """An error one process meets alone, in its own share of the data (an unreadable image):
    under torchrun the process says it itself, since rank 0, which says the errors all ranks
    meet alike, sees only a failed collective."""


class UnreadableCheckpoint(KdmlError):
    """A checkpoint that cannot be read (gone, damaged, or not kdml's): a caller that needs
    the model only for an extra, such as a plot, can go on without it."""


class Terminated(KeyboardInterrupt):
    """A kill (SIGTERM), unwound as Ctrl-C is (the CLI's handler raises it)."""


def raised_over(error: BaseException, kind: type[E]) -> E | None:
    """``error`` if it is a ``kind``, else the ``kind`` it was raised over, however deep in
    its causes and contexts, or None: torch raises its own errors over a stop or a full disk
    ("unexpected pos" in its checkpoint writer, "DataLoader worker ... is killed" after a
    kill), and a C extension whose import a stop interrupts fails with an ImportError over it
    (pybind11's "initialization failed", matplotlib's at a run's first plot; numpy's own
    ImportError over that one)."""
    seen: set[int] = set()
    waiting: list[BaseException | None] = [error]
    while waiting:
        candidate = waiting.pop(0)
        if candidate is None or id(candidate) in seen:
            continue
        if isinstance(candidate, kind):
            return candidate
        seen.add(id(candidate))
        waiting += [candidate.__cause__, candidate.__context__]
    return None


def one_line(text: str) -> str:
    """``text`` with its control characters (a newline or tab in a file or folder name) as
    Python writes them, ``\\n`` and ``\\t``, so that an error, a warning or a row of the
    search table that names such a file stays one line: its second half had read as a line
    of its own."""
    return "".join(character.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(character) == "Cc" else character
                   for character in text)


def home_expanded(path: str | Path) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded (:meth:`Path.expanduser`), refused
    in one line where that names no home folder (an unknown user, no ``HOME``): pathlib's
    RuntimeError ("Could not determine home directory") names neither the path nor a fix."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        raise KdmlError(f"{path}: {Path(path).parts[0]} names no home folder on this machine "
                        "(no such user); write the path out in full") from None


def why_missing(path: Path, kind: str) -> str:
    """Why ``path`` is not the ``kind`` ("file" or "folder") a message expected: "is not a
    file" where something else is there, else "does not exist"."""
    return f"is not a {kind}" if path.exists() else "does not exist"


def check_run_folder(path: Path) -> None:
    """Refuse ``path`` as a run folder where no folder is there. The commands that read a run
    check it before they import torch (2-3 s), so that a mistyped path is said at once."""
    if not path.is_dir():
        raise KdmlError(f"run folder {path} {why_missing(path, 'folder')}")


def check_not_a_link(path: Path, option: str = "--out") -> None:
    """Refuse an output path that is a symbolic link (even a dangling one): kdml writes a new
    file and renames it into place, which would replace the user's link."""
    if path.is_symlink():
        raise KdmlError(f"{option} {path} is a symbolic link, which kdml would replace; give "
                        "the path it points to, or another one")


def check_no_nul_byte(value: str, named: str) -> None:
    """Refuse a path setting (``named``, as the message names it) that holds a NUL byte, as a
    YAML "\\0" escape can: no file name can hold one, and os calls would stop with a bare
    ValueError."""
    if "\0" in value:
        raise KdmlError(f"{named} holds a NUL byte, which no file name can: remove it")


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the choice nearest ``name`` in spelling, case aside
    (``jdr`` for ``jrd``, ``CUB`` for ``cub``, ``fashion_mnist`` for ``fashion-mnist``), or
    "" where none is near: a refusal of an unknown name then says which was meant before
    listing every choice."""
    by_lower = {choice.lower(): choice for choice in choices}
    near = difflib.get_close_matches(name.lower(), by_lower, n=1, cutoff=0.6)
    return f" (did you mean {by_lower[near[0]]!r}?)" if near else ""


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, plural unless the count is 1 (``plural``, else ``noun + "s"``),
    the count with thousands separators: a message must not say "1 source samples".

    >>> counted(1, "source sample"), counted(1_200, "class", "classes")
    ('1 source sample', '1,200 classes')
    """
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"
