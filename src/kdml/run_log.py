"""Where kdml's log records and warnings go while a command runs: ``kdml: warning: ...`` on
stderr (above any progress bars), and a training run's ``train.log``. Kept apart from the run
folder and free of torch: every command sets it up, and one refused at once (a mistyped
recipe for ``kdml config``) should not wait seconds for torch to be imported first."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kdml.errors import one_line
from kdml.progress import BarsClearedHandler


class OneLineFormatter(logging.Formatter):
    """A formatter that keeps each record's message on one line (:func:`one_line`): a
    warning naming a file with a newline in its name (``skipping unreadable image ...``) had
    taken two lines, on stderr and in ``train.log``. A logged traceback, appended after the
    message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


def warning_handler() -> logging.Handler:
    """kdml's warnings on stderr, in the form of its errors: ``kdml: warning: ...``, each on
    a line of its own above the progress bars drawn there (:class:`BarsClearedHandler`)."""
    to_screen = BarsClearedHandler(sys.stderr)
    to_screen.setLevel(logging.WARNING)
    to_screen.setFormatter(OneLineFormatter("kdml: warning: %(message)s"))
    return to_screen


PACKAGE_FOLDER = str(Path(__file__).resolve().parent)  # src/kdml


@contextmanager
def kdml_warnings_logged() -> Iterator[None]:
    """Python warnings that kdml's own code raises (its modules warn a library user, e.g.
    ``MarginalFisherLoss`` of batches with too few neighbours) go to the ``kdml`` logger while
    a command runs: ``kdml: warning: ...`` on stderr and, while a run trains, in its
    ``train.log``, not Python's two lines naming kdml's source file. Others' warnings are
    shown as Python shows them."""
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: Any = None, line: str | None = None) -> None:
            if str(Path(filename).resolve()).startswith(PACKAGE_FOLDER + os.sep):
                logging.getLogger("kdml.warnings").warning("%s", message)
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


@contextmanager
def warnings_on_stderr(shown: bool = True) -> Iterator[None]:
    """Show kdml's warnings (a skipped image while embedding) as ``kdml: warning: ...`` for a
    command that does not train (training's :func:`run_logging` shows them itself), and while
    a run loads its data, before its log opens. ``shown=False`` (torchrun's other ranks, which
    load the same data) drops them instead of letting Python print them bare."""
    package = logging.getLogger("kdml")
    to_screen = warning_handler() if shown else logging.NullHandler()
    package.addHandler(to_screen)
    try:
        with kdml_warnings_logged():
            yield
    finally:
        package.removeHandler(to_screen)


@contextmanager
def run_logging(path: Path) -> Iterator[logging.Logger]:
    """While a run trains, kdml's log records (``kdml.*``: the trainer's, and the data
    loaders' warnings such as a skipped image) are appended to the run's ``train.log``, and
    warnings are also shown on stderr. Yields the trainer's logger."""
    package = logging.getLogger("kdml")
    to_file = RunLogHandler(path)
    to_file.setFormatter(OneLineFormatter("%(asctime)s %(message)s"))
    to_screen = warning_handler()
    level = package.level
    package.setLevel(logging.INFO)
    package.addHandler(to_file)
    package.addHandler(to_screen)
    try:
        with kdml_warnings_logged():
            yield logging.getLogger("kdml.train")
    finally:
        package.removeHandler(to_file)
        to_file.close()  # its warning of lines not written still goes to the screen
        package.removeHandler(to_screen)
        package.setLevel(level)


class RunLogHandler(logging.FileHandler):
    """``train.log``'s handler. A line the file system refuses (a full disk: the append that
    needs a new block) is said once, as a warning on stderr, and the run goes on: Python's
    handler had printed "--- Logging error ---" and a traceback for each line, and its close,
    flushing the same lines, had raised its ENOSPC (which names no file) over the error that
    stopped the run, which the CLI then reported as "the output could not be written". The
    unwritten lines stay buffered: a later flush writes them if space is freed meanwhile."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.refused = False

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if isinstance(error, OSError):
            self._refused(error)
        else:  # not the file system's: a bug, shown as Python shows it
            super().handleError(record)

    def close(self) -> None:
        try:
            super().close()
        except OSError as error:
            self._refused(error)

    def _refused(self, error: OSError) -> None:
        if self.refused:
            return
        self.refused = True  # set first: the warning below comes back here through the logger
        logging.getLogger("kdml.train").warning(
            "%s cannot be written (%s): the run's log may miss lines from here on",
            self.baseFilename, error.strerror or error)
