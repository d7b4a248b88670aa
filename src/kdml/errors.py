"""The one exception type that the CLI turns into a one-line message."""

from __future__ import annotations

from pathlib import Path


class KdmlError(ValueError):
    """Bad input from the user: the message says what was wrong and what to do."""


class QuietExit(KdmlError):
    """A failure that another process (rank 0 under torchrun) reports; this one stops without
    printing it again."""


class LocalError(KdmlError):
    """An error one process meets alone, in its own share of the data (an unreadable image):
    under torchrun the process says it itself, since rank 0, which says the errors all ranks
    meet alike, sees only a failed collective."""


class Terminated(KeyboardInterrupt):
    """A kill (SIGTERM), unwound as Ctrl-C is (the CLI's handler raises it)."""


def why_missing(path: Path, kind: str) -> str:
    """Why ``path`` is not the ``kind`` ("file" or "folder") a message expected: "is not a
    file" where something else is there, else "does not exist"."""
    return f"is not a {kind}" if path.exists() else "does not exist"


def check_not_a_link(path: Path, option: str = "--out") -> None:
    """Refuse an output path that is a symbolic link (even a dangling one): kdml writes a new
    file and renames it into place, which would replace the user's link."""
    if path.is_symlink():
        raise KdmlError(f"{option} {path} is a symbolic link, which kdml would replace; give "
                        "the path it points to, or another one")
