"""Writing a file whole or not at all: through a new hidden file beside it, then a rename."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path

from kdml.errors import KdmlError


def write_through_new_file(path: Path, write: Callable[[Path], object],
                           replace: bool = True) -> Path:
    """Call ``write`` on a new hidden file beside ``path`` (never an existing file, nor a
    link), then rename it into place: a kill or a full disk leaves the old file or the new one,
    and nothing half-written beside them. With ``replace=False``, ``path`` must not exist: a
    file that appears there meanwhile is kept (a ``FileExistsError``), never renamed over."""
    path.parent.mkdir(parents=True, exist_ok=True)
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    partial = path.with_name(hidden_name(path.stem, f".{token}{path.suffix.lower()}",
                                         path.parent))
    # The hidden file is made inside the try that removes it: a Ctrl-C or SIGTERM right after
    # its creation had left it behind, empty. Only something already at its name (which the
    # pid and random token make all but impossible) is not kdml's, and is never removed.
    try:
        _create(partial)
        write(partial)
        if replace:
            partial.replace(path)
        else:
            _place_new(partial, path)
    except _Taken as taken:
        raise error_about(taken.error, path, partial) from None
    except BaseException as error:  # Ctrl-C or a full disk: nothing half-written stays behind
        # a read-only file system refuses the removal too (EROFS, even of no file): that had
        # replaced the error, naming the hidden file instead of the one asked for
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        if isinstance(error, OSError):  # no permission, a full disk: name the file asked for
            raise error_about(error, path, partial) from None
        raise
    return path


def partial_names(*names: str) -> re.Pattern[str]:
    """The hidden names :func:`write_through_new_file` gives its partials of the files
    ``names`` (``config.yaml``: ``.config.PID.TOKEN.yaml``), to find what a kill (SIGKILL, no
    ``except`` run) left of them."""
    return re.compile(r"\.(?:" + "|".join(
        rf"{re.escape(Path(name).stem)}\.\d+\.[0-9a-f]{{8}}{re.escape(Path(name).suffix.lower())}"
        for name in names) + ")")


def partials_in(folder: Path, names: re.Pattern[str]) -> list[Path]:
    """The plain files (not links) in ``folder`` whose whole name ``names`` matches: kdml's own
    partials (:func:`partial_names`, a checkpoint's), which a later session may remove."""
    return sorted(path for path in folder.iterdir()
                  if names.fullmatch(path.name) and path.is_file() and not path.is_symlink())


# The longest file name where the file system does not say its own (os.pathconf).
NAME_MAX = 255


def hidden_name(stem: str, tail: str, folder: Path) -> str:
    """The hidden name ``.STEM`` + ``tail`` (a unique token, the suffix) of a file or folder
    that kdml writes in ``folder`` before renaming it into place, ``stem`` shortened where
    the whole would be longer (in bytes) than ``folder``'s file system takes: the token
    added to a name that fits had made it too long ("File name too long" for a name the
    file system takes)."""
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError):  # no such folder (yet), or no such setting
        longest = NAME_MAX
    room = (longest if longest > 0 else NAME_MAX) - 1 - len(os.fsencode(tail))
    while stem and len(os.fsencode(stem)) > room:
        stem = stem[:-1]
    return f".{stem}{tail}"


class _Taken(Exception):
    """Something is already at the hidden name (a file or a link): not kdml's to remove."""

    def __init__(self, error: FileExistsError) -> None:
        super().__init__(str(error))
        self.error = error


def _create(partial: Path) -> None:
    """Create the empty hidden file. O_EXCL: a file or link already there is an error, never
    written through. Not mkstemp, whose 0600 would make the file unreadable to others (0666,
    less the umask)."""
    try:
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    except FileExistsError as error:
        raise _Taken(error) from None


APPEARED = "a file appeared there while kdml wrote its own, and is kept"


def _place_new(partial: Path, path: Path) -> None:
    """Move ``partial`` to ``path`` where no file is: a rename would replace one, a hard link
    fails on it (link, then unlink: no half-written ``path`` at any moment)."""
    try:
        os.link(partial, path)
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, APPEARED, str(path)) from None
    except OSError as error:  # a file system without hard links: check, then rename
        if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
            raise
        if os.path.lexists(path):
            raise FileExistsError(errno.EEXIST, APPEARED, str(path)) from None
        partial.replace(path)
        return
    partial.unlink()


def error_about(error: OSError, path: Path, partial: Path) -> OSError:
    """``error`` about ``path``, the file or folder asked for, where it names the hidden
    ``partial`` being written, a file inside it (an index folder's), or no file at all (a full
    disk's ENOSPC from a write names none); the partial's own (random) name already taken
    stays about the partial."""
    if isinstance(error, FileExistsError):
        return error
    name = None if error.filename is None else os.fsdecode(error.filename)
    if name is None or name == str(partial):
        named = path
    elif name.startswith(f"{partial}{os.sep}"):
        named = path / Path(name).relative_to(partial)
    else:
        return error
    return OSError(error.errno, error.strerror or str(error), str(named))


def check_writable_folder(folder: Path, advice: str = "choose another --out") -> None:
    """Check that ``folder`` exists or can be made, by writing a scratch file into it or into
    its nearest existing parent, so that a command that would write there at its end (a report
    after hours of training) fails at once instead. Makes nothing: the writer makes the folder
    when it writes, and a command that fails before then leaves no empty folder behind."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        if existing.is_symlink():  # a dangling link: mkdir would fail on it later
            break
        existing = existing.parent
    if not existing.is_dir():
        raise KdmlError(f"cannot write into {folder}: {existing} is not a folder; {advice}")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise KdmlError(f"cannot write into {folder} ({error.strerror}); {advice}") from None
