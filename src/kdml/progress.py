"""When a progress bar is drawn: the one rule of the trainer's and the evaluator's bars; and
the screen's log handler, which writes its lines above the bars drawn there."""

from __future__ import annotations

import logging
import os
import sys
from typing import TextIO

from tqdm.auto import tqdm


def bar_disabled(progress: bool | None, main: bool = True) -> bool | None:
    """tqdm's ``disable`` for a bar: ``progress`` None draws it on a terminal only (tqdm's own
    rule, ``None``), False never, True always; a torchrun rank other than 0 (``main`` False)
    never draws one, since rank 0's stands for them all. (``None or not main`` had read as
    False on rank 0, drawing bars into redirected output.) Nor does a process without a
    standard error (closed, ``2>&-``, or ``pythonw``'s: Python's ``sys.stderr`` is None),
    where tqdm, finding no ``isatty`` to ask, had drawn into None and stopped the command
    with an AttributeError. Nor, unless asked (``progress`` True), on a ``TERM=dumb``
    terminal."""
    if not main or sys.stderr is None:
        return True
    if progress is None and os.environ.get("TERM") == "dumb":
        # a terminal that cannot move its cursor (Emacs' shell and compile buffers): the
        # nested bars' cursor-up codes showed as "^[[A" on every redraw
        return True
    return None if progress is None else not progress


class BarsClearedHandler(logging.StreamHandler):
    """A log handler for the screen that clears the progress bars drawn there while it writes
    a record, and draws them again below it (tqdm's ``external_write_mode``): a warning
    written while a bar was drawn (an image skipped as unreadable mid-epoch) had been
    appended to the bar's own line, which the bars then redrew over.

    A data loader's worker process logs through the copy of this handler it was forked with:
    it clears and redraws its copies of the bars (the main process redraws them as they move
    on) without taking tqdm's lock, which another thread may have held when the worker was
    forked."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(stream)
        self._pid = os.getpid()  # the process that draws the bars

    def emit(self, record: logging.LogRecord) -> None:
        with tqdm.external_write_mode(file=self.stream, nolock=os.getpid() != self._pid):
            super().emit(record)
