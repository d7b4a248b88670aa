"""The run folder: config, metrics, checkpoints, logs, TensorBoard events and plots."""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from kdml.checks import is_count
from kdml.config import FORMAT_KEY, SECTIONS
from kdml.data.fingerprint import FORMAT, FORMAT_FIELD
from kdml.errors import KdmlError, check_run_folder
from kdml.file_write import partial_names, partials_in, write_through_new_file
from kdml.training.checkpoint import partial_checkpoints

LOCK_NAME = ".training.lock"


@dataclass(frozen=True)
class RunFolder:
    """Paths inside one run folder.

    Layout::

        config.yaml        the resolved configuration
        data.json          a fingerprint of the data it trains and scores on (counts and
                           digests, :mod:`kdml.data.fingerprint`), checked by every reader,
                           and what the model takes (:mod:`kdml.data.sample_spec`)
        metrics.csv        one row per epoch: train/<loss term>, then test/<metric> (or
                           val/<metric> when data.validation is scored instead), and
                           unreadable/<part> where data.on_bad_image=skip left samples out
        metrics.json       {"epochs": [...], "final": {...}, "scored": "test" or "validation"}
        train.log          the log of every session of this run
        checkpoints/last.pt
        checkpoints/best.pt  the best validation epoch's (train.keep_best)
        checkpoints/unscored.pt  an epoch trained but not yet scored, while it is scored
        .training.lock     held by the process training the run
        tensorboard/       TensorBoard events
        plots/*.png        training loss (and the logged terms that are not losses, in
                           diagnostics.png) and test (or validation) metrics over epochs
    """

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def data_fingerprint(self) -> Path:
        """``data.json``: the fingerprint of the run's data (:mod:`kdml.data.fingerprint`)."""
        return self.root / "data.json"

    @property
    def metrics_csv(self) -> Path:
        return self.root / "metrics.csv"

    @property
    def metrics_json(self) -> Path:
        return self.root / "metrics.json"

    @property
    def log(self) -> Path:
        return self.root / "train.log"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoints" / "last.pt"

    @property
    def best_checkpoint(self) -> Path:
        """The best-scoring epoch's checkpoint (``train.keep_best``)."""
        return self.root / "checkpoints" / "best.pt"

    @property
    def unscored_checkpoint(self) -> Path:
        """The checkpoint of an epoch trained but not yet scored, written before the scoring
        (which can take minutes) and removed once ``last.pt`` holds the epoch: a kill while
        it is scored loses none of its training (``kdml train --resume`` scores it first)."""
        return self.root / "checkpoints" / "unscored.pt"

    @property
    def resumable(self) -> bool:
        """Whether the run saved training to continue from: ``last.pt``, or ``unscored.pt``
        (an epoch trained and not yet scored). Without either, ``--resume`` starts over."""
        return self.checkpoint.is_file() or self.unscored_checkpoint.is_file()

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def lock_file(self) -> Path:
        """Held (``flock``) by the process training the run; see :meth:`held`."""
        return self.root / LOCK_NAME

    def output(self, path: Path) -> Path:
        """``path``, a file in the run folder where a command that reads the run writes what
        it made of it (eval.json, generalization.json, plots/...), once the run is checked to
        be still there: a run folder moved or deleted while the command worked (minutes of
        scoring) had been made again at its old path, holding that file alone, which no
        command opens as a run (training checks before each write too: ``Recorder``)."""
        if not self.config.is_file():
            raise KdmlError(f"the run folder {self.root} was moved or deleted while kdml read "
                            f"it, so its {path.relative_to(self.root)} is not written; give the "
                            "command the folder where the run is now")
        return path

    def held(self) -> contextlib.AbstractContextManager[None]:
        """Hold the run folder for this process while it trains: a second process that tries
        (another ``kdml train --resume``, a grid or reproduction reaching the same run) gets a
        one-line error instead of interleaving its writes with the first's."""
        return hold_folder(self.lock_file, _busy(self.root))

    @classmethod
    def existing(cls, root: str | Path) -> RunFolder:
        """An existing run folder; a clear error when it is missing or holds no config."""
        run = cls(Path(root))
        check_run_folder(run.root)
        if not run.config.is_file():
            from kdml.training.grid import MARKER, recorded_cells  # grid imports this module

            if recorded_cells(run.root) is not None:  # a grid's cells are its runs, not the grid
                raise KdmlError(f"{run.root} is a grid's folder ({MARKER}), not a run: each "
                                f"of its cells is a run folder{_example_cell(run.root)}; give "
                                "one of those (to continue the whole grid, run the command "
                                f"that made it again with --out {run.root})")
            raise KdmlError(f"{run.root} is not a kdml run folder (no config.yaml)")
        return run

    def recorded_data(self) -> dict[str, Any] | None:
        """The fingerprint of the data the run trained on (``data.json``), or ``None`` where
        there is none kdml wrote: a run of a kdml before data.json, or a file of the user's
        (JSON without kdml's fields). One that is not JSON, or kdml's without its parts, is
        refused in one line: taken for the user's, it had turned the data check off unseen."""
        path = self.data_fingerprint
        if not path.is_file():
            return None

        def damaged(why: str) -> KdmlError:
            return KdmlError(f"{path} is damaged ({why}), so the data this run trained on "
                             "cannot be checked; restore it from a copy, or delete it to go on "
                             "unchecked (a --resume then records the data it reads)")

        try:
            recorded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise damaged(f"not readable JSON: {error}") from None
        if not isinstance(recorded, dict) or FORMAT_FIELD not in recorded:
            return None
        parts = recorded.get("parts")
        if not (isinstance(parts, dict) and parts
                and all(isinstance(part, dict) for part in parts.values())):
            raise damaged("kdml's record without its parts")
        if recorded.get(FORMAT_FIELD) == FORMAT and not all(
                is_count(part.get("samples")) and is_count(part.get("classes"))
                for part in parts.values()):  # the messages print them as numbers
            raise damaged("a part whose sample or class count is not a whole number")
        return recorded

    def write_data_fingerprint(self, fingerprint: dict[str, Any]) -> None:
        """Write ``data.json`` whole or not at all, never over a file kdml did not write."""
        write_json(fingerprint, self.data_fingerprint, (FORMAT_FIELD,))

    def final_metrics(self) -> dict[str, float] | None:
        """The last epoch's scores of a finished run (``metrics.json``'s ``final``: of the test
        part, or of the validation part with data.validation), else ``None``."""
        final = self._metrics_record().get("final")
        return final if isinstance(final, dict) else None

    def history(self) -> list[dict[str, Any]]:
        """``metrics.json``'s rows, one per epoch trained so far (none when it is missing)."""
        epochs = self._metrics_record().get("epochs")
        if not (isinstance(epochs, list) and all(isinstance(row, dict) for row in epochs)):
            return []
        return epochs

    def _metrics_record(self) -> dict[str, Any]:
        """``metrics.json`` as read, or ``{}`` where it is missing, not JSON, or JSON that is no
        record (``[]``, a number: not kdml's, read as no metrics rather than a traceback;
        ``kdml train --resume`` refuses to replace it)."""
        if not self.metrics_json.is_file():
            return {}
        try:
            recorded = json.loads(self.metrics_json.read_text())
        except ValueError:
            return {}
        return recorded if isinstance(recorded, dict) else {}

    def write_metrics(self, history: list[dict[str, Any]], final: dict[str, Any] | None,
                      scored: str = "test") -> None:
        """Rewrite metrics.csv and metrics.json from the whole history (each atomically).
        ``scored`` names the part the scores are of: ``test`` or ``validation``."""
        columns: list[str] = []
        for row in history:
            columns += [key for key in row if key not in columns]
        lines = [columns] + [[_cell(row.get(key)) for key in columns] for row in history]

        def write_csv(partial: Path) -> None:
            with partial.open("w", newline="") as handle:
                csv.writer(handle).writerows(lines)

        # both checked before either is replaced (write_json checks the JSON)
        check_csv_replaceable(self.metrics_csv)
        write_json({"epochs": history, "final": final, "scored": scored}, self.metrics_json,
                   METRICS_FIELDS)
        write_through_new_file(self.metrics_csv, write_csv)

    def check_metrics_replaceable(self) -> None:
        """Refuse a metrics.json or metrics.csv kdml did not write (a user's notes under the
        name): :meth:`write_metrics` would replace it. ``--resume`` checks before its first
        epoch, which had trained (hours on a real run) before the refusal."""
        check_json_replaceable(self.metrics_json, METRICS_FIELDS)
        check_csv_replaceable(self.metrics_csv)


def _example_cell(root: Path) -> str:
    """`` (such as ROOT/CELL)`` for a cell of the grid in ``root`` that holds a run (the first
    in grid.yaml's order), or ``""`` where none does yet."""
    from kdml.training.grid import recorded_cells  # grid imports this module

    # only the grid's own cells: another folder beside them that holds a run is no cell
    listed = recorded_cells(root) or []
    cells = [root / name for name in listed if (root / name / "config.yaml").is_file()]
    return f" (such as {cells[0]})" if cells else ""


# The hidden partial of a new run's config.yaml or data.json, or of a new grid's grid.yaml
# (file_write's ".NAME.PID.TOKEN.EXT"): what a kill while kdml wrote them leaves
_FIRST_PARTIAL = partial_names("config.yaml", "grid.yaml", "data.json")


def first_partials(folder: Path) -> list[Path]:
    """The hidden partials of ``folder``'s config.yaml, data.json and grid.yaml
    (:data:`_FIRST_PARTIAL`, plain files): kdml's own, which a new run or grid there
    replaces."""
    return partials_in(folder, _FIRST_PARTIAL)


# The hidden partials of a run's metrics.json and metrics.csv: what a kill (SIGKILL) while a
# session wrote them leaves
_METRICS_PARTIAL = partial_names("metrics.json", "metrics.csv")


def metrics_partials(folder: Path) -> list[Path]:
    """The hidden partials of ``folder``'s metrics.json and metrics.csv (plain files): kdml's
    own, left by a session killed while it wrote them, which the next session of the run
    removes (only the process holding the run writes its metrics: none is being written)."""
    if not folder.is_dir():
        return []
    return partials_in(folder, _METRICS_PARTIAL)


def holds_files(folder: Path) -> bool:
    """Whether ``folder`` holds anything but a run's lock file and the hidden partials of its
    first files (alone, they are what a run that stopped, or was killed, before its config was
    written leaves: such a folder still takes a new run or grid; ``ls`` shows it empty)."""
    partials = set(first_partials(folder))
    return any(path.name != LOCK_NAME and path not in partials for path in folder.iterdir())


def check_utf8_path(root: Path, resume: bool = False, what: str = "run folder") -> None:
    """Refuse a run (or grid: ``what``) folder whose path is not UTF-8 (a byte such as
    Latin-1's 0xF6, which Python reads as a surrogate): TensorBoard, which writes the run's
    ``tensorboard/``, encodes its paths as UTF-8 and stopped the run with a UnicodeEncodeError
    traceback."""
    try:
        str(root).encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(root).decode("utf-8", "backslashreplace")
        remedy = ("rename the folder (or a folder above it) in UTF-8 and resume it there"
                  if resume else "choose an --out named in UTF-8")
        raise KdmlError(f"the {what} {shown} is not named in UTF-8, and TensorBoard writes "
                        f"its event files under UTF-8 paths only: {remedy}") from None


def holds_run(root: Path) -> bool:
    """Whether ``root`` holds a run of kdml's (started, finished, or stopped before its first
    checkpoint): its config.yaml and its log, a checkpoint or kdml's lock."""
    run = RunFolder(root)
    # a config.yaml alone may be the user's own file: a run also has its log or checkpoints,
    # or kdml's lock (a kill between the config and the log's first line, ~0.1 s), and
    # stale_run_files then checks the config's form
    return run.config.is_file() and (run.log.is_file() or run.resumable
                                     or run.lock_file.is_file())


def check_new_run_folder(root: Path, held: bool = False) -> None:
    """Refuse a folder a new run must not write into, with one line: an existing run, a
    non-empty folder that is not a run (kdml never overwrites a file it did not create), a
    file, or a place where no folder can be made.

    A run that stopped before its first checkpoint (see :func:`stale_run_files`) is no
    refusal: a new run starts afresh over its files (:func:`start_afresh`), unless another
    process is training it (checked by taking its lock for a moment, unless this process
    ``held`` the folder already)."""
    run = RunFolder(root)
    trained = run.resumable
    holds_a_run = holds_run(root)
    stale = holds_a_run and stale_run_files(root) is not None
    if holds_a_run and not stale:
        if not (trained or run.best_checkpoint.is_file()):
            # it would make way, were it not for files kdml did not write (or cannot tell)
            raise KdmlError(f"{root} holds a run that saved no checkpoint, beside files kdml "
                            f"did not write{_example_of_others(root)}, so a new run does not "
                            "start afresh there: move those away, continue the run with 'kdml "
                            f"train --resume {root}', or choose another --out")
        raise KdmlError(f"{root} already holds a run; continue it with 'kdml train --resume "
                        f"{root}' or choose another --out")
    if stale and not held:  # refused now, not after the data has loaded
        with hold_folder(root / LOCK_NAME, _busy(root)):
            pass
    if root.exists() and not root.is_dir():
        raise KdmlError(f"--out {root} is a file, not a folder; choose another --out")
    if root.is_dir() and holds_files(root) and not stale:
        raise KdmlError(f"--out {root} is a folder with other files in it; a run goes into a "
                        "new or empty folder: choose another --out")
    parent = next((folder for folder in (root, *root.parents) if folder.exists()), Path("."))
    if not parent.is_dir():
        raise KdmlError(f"cannot make the run folder {root}: {parent} is a file")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise KdmlError(f"cannot make the run folder {root}: {parent} is not writable")


def _run_entries(run: RunFolder) -> set[Path]:
    """The top-level entries a run of kdml's writes before its first checkpoint."""
    return {run.config, run.data_fingerprint, run.log, run.lock_file, run.tensorboard,
            run.checkpoint.parent}


def _example_of_others(root: Path) -> str:
    """`` (such as NAME)`` for a top-level entry of ``root`` that is not a run's, or ``""``."""
    ours = _run_entries(RunFolder(root))
    other = next((path for path in sorted(root.iterdir()) if path not in ours), None)
    return f" (such as {other.name})" if other is not None else ""


# How train.log ends the line of a finished run resumed (no epoch starts).
NOTHING_LEFT = "nothing left to train"
# How train.log's line for a session that stopped before its end starts (an error, Ctrl-C).
STOPPED = "stopped: "
# What a session's "start epoch N of M" line adds when epoch N was trained in the session before
# and is only scored in this one (checkpoints/unscored.pt): it does not start the run afresh.
SCORED_FIRST = "trained before the run stopped, scored first"

# The first line a run writes to train.log (run_logging's time stamp, then the trainer's).
_LOG_START = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} start epoch \d+ of \d+")
_TENSORBOARD_EVENTS = "events.out.tfevents."


def stale_run_files(root: Path) -> list[Path] | None:
    """The files of a run in ``root`` that stopped before saving its first checkpoint (a
    setting found wrong in its first epoch, an unreadable image, a NaN loss, a kill while the
    checkpoint was being written): its config.yaml, data.json, train.log, TensorBoard events
    and partial checkpoint file, all written by kdml, which a new run may replace. ``None``
    when ``root`` holds anything else: a checkpoint, metrics, plots, a file of the user's (a
    config.yaml, data.json and train.log count as kdml's only in kdml's own form)."""
    run = RunFolder(root)
    checkpoints = run.checkpoint.parent
    try:
        first = first_partials(root)
        allowed = _run_entries(run) | set(first)
        entries = list(root.iterdir())
        events = list(run.tensorboard.iterdir()) if run.tensorboard.is_dir() else []
        # a first checkpoint killed while being written leaves only its partial file
        partial = partial_checkpoints(checkpoints)
        if checkpoints.exists() and (checkpoints.is_symlink() or not checkpoints.is_dir()
                                     or len(list(checkpoints.iterdir())) != len(partial)):
            return None
        # killed before the log's first line (~0.1 s after config.yaml): kdml's lock beside
        # the config in kdml's form says kdml made them
        logged = run.log.exists() or not run.lock_file.is_file()
        first_line = ""
        if logged:
            with run.log.open(encoding="utf-8", errors="replace") as log:
                first_line = log.readline()
        values = yaml.safe_load(run.config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    if (any(path not in allowed or path.is_symlink() for path in entries)
            or any(not path.name.startswith(_TENSORBOARD_EVENTS) or path.is_symlink()
                   or not path.is_file() for path in events)
            or (run.tensorboard.exists() and not run.tensorboard.is_dir())
            or not run.config.is_file() or (logged and not _LOG_START.match(first_line))
            or not isinstance(values, dict)
            or list(values) not in (["recipe", *SECTIONS], [FORMAT_KEY, "recipe", *SECTIONS])
            or (run.data_fingerprint.exists()
                and not written_by_kdml(run.data_fingerprint, (FORMAT_FIELD,)))):
        return None
    fingerprint = [run.data_fingerprint] if run.data_fingerprint.exists() else []
    return [*events, *partial, *first, *fingerprint, run.log, run.config]


def start_afresh(root: Path) -> str | None:
    """Remove the files of a run in ``root`` that saved no checkpoint (:func:`stale_run_files`;
    never its lock file, which the caller holds), so that a new run starts afresh there.
    Returns the line that says so, or ``None`` where there is no such run (and removes only
    the hidden partials of a config.yaml or data.json whose writing was killed,
    :func:`first_partials`). Call it holding the folder, after :func:`check_new_run_folder`."""
    stale = stale_run_files(root)
    if stale is None:  # a folder a new run may take holds at most kdml's first partials
        for path in first_partials(root) if root.is_dir() else []:
            path.unlink(missing_ok=True)
        return None
    for path in stale:
        path.unlink(missing_ok=True)
    run = RunFolder(root)
    for folder in (run.tensorboard, run.checkpoint.parent):
        with contextlib.suppress(OSError):  # the new run's writers make them again
            folder.rmdir()
    return f"starting afresh: the run in {root} saved no checkpoint"


def _busy(root: Path) -> str:
    return f"{root} is being trained by another process; let it finish or stop it first"


def trained_elsewhere(root: Path) -> bool:
    """Whether another process trains the run in ``root`` now (holds its lock: :func:`hold_folder`),
    for a reader's message: a run without a checkpoint yet is then in its first epoch, where
    "train it with kdml train --resume" would be refused as busy. Probed with a shared lock
    taken and let go at once, on the lock file only where it exists (a reader makes no file)."""
    try:
        import fcntl
    except ImportError:  # no flock on Windows: no process is known to hold the folder
        return False
    try:
        handle = (root / LOCK_NAME).open("rb")
    except OSError:  # no lock file: no run was ever trained here by a kdml that holds it
        return False
    with handle:  # closing it lets the shared lock go
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        except OSError:  # a file system without locks: nothing to tell
            return False
    return False


class FolderBusy(KdmlError):
    """Another process holds the folder (:func:`hold_folder`)."""


@contextmanager
def hold_folder(lock_file: Path, busy: str, wait: bool = False) -> Iterator[None]:
    """Hold ``lock_file``'s folder for this process (``flock``), or raise ``busy`` as a
    one-line error (:class:`FolderBusy`) when another process holds it; with ``wait``, wait
    until it lets go instead. The operating system drops the lock when the process ends,
    however it ends, so a crash or a kill never leaves the folder held."""
    make_folder(lock_file.parent)
    try:
        import fcntl
    except ImportError:  # no flock on Windows: the folder goes unguarded there
        yield
        return
    try:
        handle = lock_file.open("a")
    except OSError as error:
        raise KdmlError(f"cannot write {lock_file}: {error.strerror}") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise FolderBusy(busy) from None
        except OSError:  # a file system without locks (some NFS, FUSE): go on unguarded
            pass
        yield


# The fields of metrics.json that every kdml has written ("scored" came later): a file holding
# them all is kdml's own (written_by_kdml)
METRICS_FIELDS = ("epochs", "final")


def make_folder(root: Path) -> None:
    """``mkdir -p`` with a one-line error."""
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        dangling = _dangling_link(root)  # "File exists" misled: nothing is there
        if dangling is not None:
            raise KdmlError(f"cannot make the folder {root}: {_link_to_nothing(dangling, root)}"
                            ) from None
        raise KdmlError(f"cannot make the folder {root}: {error.strerror}") from None


def written_by_kdml(path: Path, fields: Iterable[str]) -> bool:
    """Whether ``path`` is a JSON object holding every top-level field of ``fields``, those
    that kdml has always written there: its own earlier output (an older kdml's too, which
    may lack the fields added since), not a user's notes that happen to have the name. One
    shared field had been enough, and a user's ``{"metrics": ..., "source": ...}`` was
    replaced by kdml eval's."""
    try:
        existing = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(existing, dict) and set(fields) <= existing.keys()


def check_csv_replaceable(path: Path) -> None:
    """Refuse a metrics CSV path where a folder, a link, or a file kdml did not write is in
    the way: kdml's first row is its header, starting with ``epoch`` (empty before any
    epoch)."""
    _check_replaceable(path, _kdml_metrics_csv)


def _kdml_metrics_csv(path: Path) -> bool:
    """Whether ``path``'s first line is the header kdml writes (or the file is empty)."""
    try:
        with path.open("rb") as handle:
            header = handle.readline(4096)
    except OSError:
        return False
    return not header.strip() or header.split(b",")[0].strip() == b"epoch"


def check_json_replaceable(path: Path, fields: Iterable[str]) -> None:
    """Refuse a JSON result path where a folder, a link, or a file kdml did not write (see
    :func:`written_by_kdml`) is in the way; commands check before their work."""
    _check_replaceable(path, lambda existing: written_by_kdml(existing, fields))


def _check_replaceable(path: Path, written_by_kdml_here: Callable[[Path], bool]) -> None:
    """Refuse ``path`` where a folder, a link, or a file kdml did not write (as
    ``written_by_kdml_here`` tells) is in the way."""
    if path.is_dir():  # the rename would fail at the end
        raise KdmlError(f"{path} is a folder, where kdml writes a file; move it away")
    if path.is_symlink() or (path.exists() and not written_by_kdml_here(path)):
        raise KdmlError(f"{path} is in the way and kdml did not write it; move it away (kdml "
                        "never replaces a file it did not write)")


def write_json(values: dict[str, Any], path: Path, fields: Iterable[str]) -> None:
    """Write ``values`` to ``path`` whole or not at all, never over a file kdml did not write
    (one lacking a field of ``fields``: :func:`written_by_kdml`)."""
    check_json_replaceable(path, fields)
    text = json.dumps(values, indent=2)
    write_through_new_file(path, lambda partial: partial.write_text(text))


def safe_name(dataset: str) -> str:
    """A folder-name form of a ``--dataset`` value: ``folder:/data/my photos`` ->
    ``folder-my-photos``, ``mnist5k->digits`` -> ``mnist5k--digits`` (the arrow's ``-`` is
    kept and ``>`` becomes another). A path never nests folders and no character needs quoting
    in a shell."""
    if ":" in dataset:
        prefix, path = dataset.split(":", 1)
        dataset = f"{prefix}-{Path(path.rstrip('/')).stem}"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", dataset).strip("-.") or "data"


# where runs go when given no --out
RUNS_FOLDER = Path("runs")


def default_run_dir(recipe: str, dataset: str, parent: Path = RUNS_FOLDER) -> Path:
    """A new folder for a run (or a grid) given no ``--out``: ``RECIPE-DATASET-TIMESTAMP`` in
    ``parent``, or with ``-2``, ``-3``, ... where that is taken. It is made here (``mkdir``,
    which one process alone can win), so that it is this process's: picking a name that did
    not exist yet let jobs started in the same second take the same one, and all but one fail.
    The command removes it again where the run is refused before writing in it
    (:func:`remove_if_unused`)."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = f"{recipe}-{safe_name(dataset)}-{stamp}"
    suffix = 1
    while True:
        path = parent / (base if suffix == 1 else f"{base}-{suffix}")
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:  # another run's (or anything else): the next name
            dangling = _dangling_link(path)
            if dangling is not None:  # every name fails alike: it had tried them forever
                raise KdmlError(f"cannot make the run folder {path}: "
                                f"{_link_to_nothing(dangling, path)}") from None
            suffix += 1
        except OSError as error:  # a parent that is a file, not writable, ...
            there = next((folder for folder in path.parents if folder.exists()), Path("."))
            why = error.strerror if there.is_dir() else f"{there} is a file"
            raise KdmlError(f"cannot make the run folder {path}: {why}") from None


def _dangling_link(path: Path) -> Path | None:
    """``path`` or the folder above it that is a link to nothing (``runs`` linked to a drive
    not mounted), where ``mkdir -p`` says "File exists" of every name under it; else None."""
    return next((folder for folder in (path, *path.parents)
                 if folder.is_symlink() and not folder.exists()), None)


def _link_to_nothing(link: Path, path: Path) -> str:
    """Why ``path`` cannot be made: ``link`` (it, or a folder above it) links to nothing."""
    return (f"{'it' if link == path else link} is a link to {os.readlink(link)}, which does "
            "not exist; make that folder, or remove the link")


def check_outside_image_folders(run_dir: Path, dataset: str) -> None:
    """Refuse a run folder (or, given no ``--out``, the ``runs/`` folder) inside the folder of
    a ``folder:`` dataset, as when training from inside the photo folder: the run's plots
    would be read as the images of a class the next time the folder is read, and its
    data.json would no longer match the data."""
    # the whole name is the folder's path, "->" included: no domain pair has a folder side
    if not dataset.startswith("folder:") or not dataset.removeprefix("folder:").strip():
        return  # no path (folder: of an unset variable): the data's reader says it needs one
    try:
        images = Path(dataset.removeprefix("folder:")).expanduser().resolve()
        place = run_dir.expanduser().resolve()
    except (RuntimeError, OSError):  # a loop of links: the data's reader says so
        return
    if place == images or images in place.parents:
        named = f"{run_dir} (where runs go without --out)" if run_dir == RUNS_FOLDER else (
            str(run_dir))
        raise KdmlError(f"the run folder {named} would lie inside {images}, the image "
                        f"folder of --dataset {dataset}: its plots would be read as images of "
                        "a class the next time; give --out a folder outside it")


def remove_if_unused(root: Path) -> None:
    """Remove ``root``, a folder :func:`default_run_dir` made, where the run it was made for
    wrote nothing in it (refused, or interrupted, before it started: at most its lock file
    is there), so that no empty folder is left behind."""
    with contextlib.suppress(OSError):  # anything in it, or gone: it stays as it is
        if not holds_files(root):
            (root / LOCK_NAME).unlink(missing_ok=True)
            root.rmdir()


def _cell(value: Any) -> Any:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return value
