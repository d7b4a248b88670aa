"""Checkpoints: written atomically, read with a clear error when missing or corrupt."""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path
from typing import Any

import torch

from kdml.errors import UnreadableCheckpoint, raised_over
from kdml.file_write import partials_in

# save_checkpoint's partial files: ".{name}.XXXXXXXX.tmp" beside a run's checkpoint
_PARTIAL = re.compile(r"\.(last|best|unscored)\.pt\.[a-z0-9_]{8}\.tmp")


def save_checkpoint(state: dict[str, Any], path: Path) -> None:
    """Write ``state`` to ``path`` so that a crash at any moment leaves either the old file or
    the new one, never a truncated file: write a temporary file in the same folder, flush it to
    disk, then rename it over the target (an atomic replace on POSIX)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_name = str(path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp"))
    # O_EXCL, as mkstemp; not mkstemp itself, whose 0600 would make a checkpoint unreadable to
    # others where the run's other files are not (0666, less the umask)
    handle = os.open(tmp_name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(handle, "wb") as tmp_file:
            torch.save(state, tmp_file)
            tmp_file.flush()
            os.fsync(tmp_file.fileno())
        os.replace(tmp_name, path)
    except BaseException as error:
        Path(tmp_name).unlink(missing_ok=True)
        # a Ctrl-C or kill mid-write makes torch's writer raise "unexpected pos" over it
        stop = raised_over(error, KeyboardInterrupt) if isinstance(error, RuntimeError) else None
        if stop is not None:
            raise stop from None
        # a full disk: the OS's error, or torch's over it, names no file; say which
        refused = raised_over(error, OSError) if isinstance(error, RuntimeError | OSError) else None
        if refused is not None:
            raise OSError(refused.errno, refused.strerror or str(refused), str(path)) from None
        raise


def partial_checkpoints(folder: Path) -> list[Path]:
    """The files :func:`save_checkpoint` was writing in ``folder`` when its process was killed
    (SIGKILL, power loss: no ``except`` ran), never renamed into place: kdml's own, which the
    next session of the run may remove."""
    if not folder.is_dir():
        return []
    return partials_in(folder, _PARTIAL)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only)."""
    if not path.is_file():
        raise UnreadableCheckpoint(
            f"no checkpoint at {path}: the run has not finished an epoch (or the file was "
            f"removed); train it with 'kdml train --resume {path.parent.parent}'")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a damaged file
        raise UnreadableCheckpoint(
            f"checkpoint {path} is corrupt or unreadable ({type(error).__name__}); "
            "delete it and train again"
        ) from None
    required = {"epoch", "method", "optimizer", "history"}
    if not isinstance(state, dict) or not required <= state.keys():
        missing = sorted(required - state.keys()) if isinstance(state, dict) else sorted(required)
        raise UnreadableCheckpoint(
            f"checkpoint {path} is not a kdml checkpoint (missing {', '.join(missing)})")
    # the types save_checkpoint writes: others had stopped the loading code with a traceback
    kinds = {"epoch": int, "method": dict, "optimizer": dict | None, "history": list,
             "config": dict | None}
    wrong = [key for key, kind in kinds.items()
             if not isinstance(state.get(key), kind) or isinstance(state.get(key), bool)]
    if wrong:
        raise UnreadableCheckpoint(
            f"checkpoint {path} is damaged: its {wrong[0]!r} is a "
            f"{type(state.get(wrong[0])).__name__}, not what kdml writes; delete it and train "
            "again")
    return state
