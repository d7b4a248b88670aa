"""What a training run writes into its folder, epoch by epoch: the log, TensorBoard events,
checkpoints, metrics and plots."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kdml import distributed
from kdml.errors import KdmlError, Terminated, raised_over
from kdml.run_log import run_logging
from kdml.training.checkpoint import save_checkpoint
from kdml.training.run_folder import STOPPED, RunFolder
from kdml.training.selection import SCORED_PARTS

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter


# Seconds between redraws of plots/ while a run trains; the session's end draws the last epochs.
# Drawing the two plots takes about 0.3 s on a 2-core CPU (matplotlib; 0.27 s median of 7 for
# 10 epochs), more than a small run's epoch: small runs (tests, `kdml reproduce --quick`) spent
# up to half their time redrawing them every epoch.
PLOT_EVERY_S = 30.0


class Recorder:
    """What a run writes: ``train.log``, TensorBoard events, the checkpoint and the metrics
    once per epoch, and the plots at most every :data:`PLOT_EVERY_S` seconds and when the
    session ends (the metrics they draw are written every epoch). Only rank 0 writes; on the
    others every call does nothing."""

    def __init__(self, run: RunFolder, writes: bool, scored: str = "test",
                 from_scratch: bool = False) -> None:
        self.run, self.writes, self.scored = run, writes, scored  # scored: "test" or "val"
        # a run resumed without a checkpoint trains from epoch 1 again (records alone, or a
        # deleted last.pt): TensorBoard is told to drop the events files' earlier epochs,
        # which it had shown beside the new ones (each epoch twice)
        self.from_scratch = from_scratch
        self._stack = contextlib.ExitStack()
        self.log = logging.getLogger("kdml.train")
        self.writer: SummaryWriter | None = None
        self._plotted_at = time.monotonic()
        self._unplotted: list[dict[str, Any]] | None = None  # a history not drawn yet
        self._folder: tuple[int, int] | None = None  # the run folder's (device, inode)
        self._config: tuple[int, int] | None = None  # its config.yaml's (mtime_ns, size)
        self._thread_hook = threading.excepthook  # the one this session's replaces

    def __enter__(self) -> Recorder:
        if self.writes:
            self.log = self._stack.enter_context(run_logging(self.run.log))
            self._folder = _identity(self.run.root)
            self._config = _stamp(self.run.config)
            # the events file waits for the first epoch recorded (:meth:`_events`), but what
            # is in the way of its folder is said before training, as it was
            try:
                self.run.tensorboard.mkdir(exist_ok=True)
            except BaseException:
                self._stack.close()  # train.log's handler: no __exit__ follows a failed enter
                raise
            self._stack.callback(self._close_writer)
            # TensorBoard's writer thread fails on its own when the folder goes (it reopens
            # its file by path): a line in train.log, not a thread's traceback on stderr
            self._thread_hook = threading.excepthook
            self._stack.callback(setattr, threading, "excepthook", self._thread_hook)
            threading.excepthook = self._thread_failed
        else:
            self.log.disabled = True
            self._stack.callback(setattr, self.log, "disabled", False)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: object) -> None:
        with self._stack:  # train.log is still open for the plots' warning and the stop line
            moved = self.writes and self._moved()  # then nothing is drawn where it was
            if kind is not None and self.writes:
                self._log_stop(kind, error)  # into the open train.log, wherever it went
                if moved:
                    return
                try:  # the plots' own error (the same full disk) must not hide the stop's
                    self._plot()
                except Exception as plotting:
                    self.log.warning("the training plots are not drawn: %s", plotting)
            elif not moved:
                try:
                    self._plot()
                except BaseException as stopped:  # a Ctrl-C while the last plots are drawn
                    self._log_stop(type(stopped), stopped)
                    raise

    def _log_stop(self, kind: type[BaseException], error: BaseException | None) -> None:
        """Say in ``train.log`` why the session stopped before its end: the log otherwise ends
        at the last thing it did, as if still running. kdml's own errors, the file system's
        about a file (a full disk), a collective whose peer process is gone, a Ctrl-C and a
        kill (SIGTERM, :class:`Terminated`; not under torchrun, which stops its ranks with it)
        take one line; anything else its traceback (SIGKILL leaves no line). Logged as INFO:
        the command itself prints the error. An error raised over a Ctrl-C or kill (an import
        it interrupted: an ImportError over it) is that stop."""
        stop = raised_over(error, KeyboardInterrupt) if error is not None else None
        if stop is not None:
            kind = type(stop)
        if issubclass(kind, Terminated):
            self.log.info("%sterminated (SIGTERM)", STOPPED)
        elif issubclass(kind, KeyboardInterrupt):
            self.log.info("%sinterrupted (Ctrl-C)", STOPPED)
        elif isinstance(error, KdmlError):
            self.log.info("%s%s", STOPPED, error)
        elif isinstance(error, OSError) and error.filename is not None:  # a full disk, say
            self.log.info("%s%s: %s", STOPPED, os.fsdecode(error.filename)
                          if isinstance(error.filename, bytes) else error.filename,
                          error.strerror or error)
        elif error is not None and distributed.failed_collective(error):
            # the cause, where the rank that stopped left it (an error of its own)
            causes = "; ".join(distributed.stopped_ranks()) or "its output says why"
            self.log.info("%sa collective operation failed, most likely because another "
                          "process of this job stopped: %s", STOPPED, causes)
        else:
            self.log.info("%san error", STOPPED, exc_info=error)

    def _moved(self) -> bool:
        """Whether the run folder is no longer the one this session started writing into:
        gone, or another folder without the run's config.yaml (a file system whose folders'
        inode numbers change is not taken for a move while config.yaml is there). The
        config.yaml of another folder is told from the run's own by its time stamp and size:
        a new run started at the old path of a folder moved away (its own config.yaml, the
        same text where the same command started it) had taken this session's checkpoints
        and metrics into its folder, over its own."""
        if self._folder is None:
            return False
        now = _identity(self.run.root)
        return now is None or (now != self._folder and _stamp(self.run.config) != self._config)

    def _check_folder(self) -> None:
        """Refuse to write on when the run folder was moved or deleted while the run trained:
        the writes would make a new, half one at its old path (its checkpoints, metrics and
        plots without config.yaml), which no command then opens."""
        if self._moved():
            raise KdmlError(f"the run folder {self.run.root} was moved or deleted while the run "
                            "trained, so nothing more is written; a moved folder keeps the "
                            "epochs trained before: continue with kdml train --resume "
                            "NEW_FOLDER")

    def _events(self) -> SummaryWriter:
        """TensorBoard's writer, opened at the first epoch recorded: a session that records
        none (a finished run resumed) had left an empty events file at each --resume."""
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter  # slow import: only when training

            with _named(self.run.tensorboard):  # its first flush, which can fail
                self.writer = SummaryWriter(str(self.run.tensorboard),
                                            purge_step=1 if self.from_scratch else None)
        return self.writer

    def _close_writer(self) -> None:
        """Close TensorBoard's writer, unless the run folder went: its last flush would fail
        (its thread is a daemon, and ends with the process). Its last events that the disk
        refuses (full) are a warning, as the plots' are: the run's checkpoint and metrics are
        written, and an error here would replace the one that stopped the run."""
        if self.writer is not None and not self._moved():
            try:
                self.writer.close()
            except OSError as error:
                self.log.warning("TensorBoard's last events are not written to %s: %s",
                                 self.run.tensorboard, error.strerror or error)

    def _thread_failed(self, failure: threading.ExceptHookArgs) -> None:
        if type(failure.thread).__name__ == "_AsyncWriterThread":  # TensorBoard's writer
            if not self._moved():  # else the run stops at its next write, saying why
                self.log.warning("TensorBoard's event writer stopped: %s", failure.exc_value)
        else:
            self._thread_hook(failure)

    def _plot(self) -> None:
        """Draw the history not drawn yet (if any) into ``plots/``."""
        if self._unplotted is None:
            return
        # imported at the first plot: matplotlib is a second of every `kdml train`'s start-up,
        # which a failed start or torchrun's other ranks (rank 0 alone draws) never use
        from kdml import viz

        try:
            viz.plot_training(self._unplotted, self.run.plots)
        # a picture of the user's in plots/, or plots/ not writable, must not stop training:
        # later epochs draw the whole history again (a full disk stops it at the checkpoint)
        except KdmlError as error:  # kdml's refusal of the pictures in the way: the rest drawn
            self.log.warning("a training plot is not drawn (the others are): %s", error)
        except OSError as error:
            self.log.warning("the training plots are not drawn: %s", error)
        self._unplotted, self._plotted_at = None, time.monotonic()

    def trained(self, epoch: int, checkpoint: Callable[[], dict[str, Any]]) -> None:
        """Keep an epoch trained but not yet scored (``checkpoints/unscored.pt``): scoring can
        take minutes, and a kill then loses none of its training."""
        if not self.writes:
            return
        self._check_folder()
        save_checkpoint(checkpoint(), self.run.unscored_checkpoint)
        self.log.info("epoch %d trained; scoring", epoch)

    def drop_unscored(self) -> None:
        """Remove the epoch whose scoring stopped with an error kdml reports that scoring it
        again would repeat (embeddings that overflow), or with any error in the run's first
        epoch: the run folder is then as it was before the epoch, with no checkpoint at all
        if it was the first."""
        if not self.writes:
            return
        self.run.unscored_checkpoint.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # only when empty: no earlier checkpoint there
            self.run.unscored_checkpoint.parent.rmdir()

    def epoch(self, row: dict[str, Any], history: list[dict[str, Any]],
              checkpoint: Callable[[], dict[str, Any]], keep_as_best: bool = False,
              recorded: Collection[str] = ()) -> None:
        """Save the checkpoint, then record ``row`` (log line, TensorBoard) and the metrics.
        ``recorded``: keys of ``row`` an earlier session logged already (an epoch trained
        then, scored now): only the others are logged, so that train.log and TensorBoard
        hold each value once. Logged after the checkpoint: a stop while it is written has the
        epoch done again (or scored again) by --resume, and logged then, once; a Ctrl-C or kill
        (SIGTERM) after it waits for the log line (:func:`_stops_deferred`)."""
        if not self.writes:
            return
        self._check_folder()
        writer = self._events()
        state = checkpoint()
        if keep_as_best:  # before last.pt: a crash between the two then redoes this epoch
            save_checkpoint(state, self.run.best_checkpoint)
        with _stops_deferred():  # once last.pt holds the epoch, --resume never logs it again
            save_checkpoint(state, self.run.checkpoint)
            self.run.unscored_checkpoint.unlink(missing_ok=True)  # last.pt holds the epoch now
            new = {key: value for key, value in row.items()
                   if key != "epoch" and key not in recorded}
            with _named(self.run.tensorboard):
                for key, value in new.items():
                    writer.add_scalar(key, value, row["epoch"])
            self.log.info("epoch %d%s: %s", row["epoch"], " scored" if recorded else "",
                          _format_row(new))
        if keep_as_best:
            self.log.info("epoch %d has the best validation score so far: kept as %s",
                          row["epoch"], self.run.best_checkpoint.name)
        self.run.write_metrics(history, None, SCORED_PARTS[self.scored])
        self._unplotted = list(history)
        if time.monotonic() - self._plotted_at >= PLOT_EVERY_S:
            self._plot()

    def finish(self, history: list[dict[str, Any]], final: dict[str, float]) -> None:
        """Record the run's ``final`` scores. Where this session recorded no epoch (a
        finished run resumed), its end draws the plots of the whole ``history``: a kill that
        no process can catch (SIGKILL) after the last epoch's metrics, before the plots were
        drawn, or a Ctrl-C or SIGTERM while those metrics were written, had left them without
        the last epoch, or missing, for good."""
        if self.writes:
            self._check_folder()
            self.run.write_metrics(history, final, SCORED_PARTS[self.scored])
            self.log.info("final %s metrics: %s", SCORED_PARTS[self.scored], final)
            if self.writer is None:  # opened by the first epoch recorded: none was
                self._unplotted = list(history)


def _identity(folder: os.PathLike[str]) -> tuple[int, int] | None:
    """``folder``'s (device, inode), None where it is gone."""
    try:
        status = os.stat(folder)
    except OSError:
        return None
    return status.st_dev, status.st_ino


def _stamp(file: Path) -> tuple[int, int] | None:
    """``file``'s (mtime_ns, size), None where it is gone."""
    try:
        status = os.stat(file)
    except OSError:
        return None
    return status.st_mtime_ns, status.st_size


@contextlib.contextmanager
def _named(folder: Path) -> Iterator[None]:
    """Raise an OSError that names no file as one about ``folder``: TensorBoard's writer
    thread meets a full disk with such an error, which its next write raises again; the CLI
    took it for its printed output's ("the output could not be written"), and train.log's
    stop line held its traceback."""
    try:
        yield
    except OSError as error:
        if error.filename is not None:
            raise
        raise OSError(error.errno, error.strerror or str(error), str(folder)) from None


@contextlib.contextmanager
def _stops_deferred() -> Iterator[None]:
    """Hold a Ctrl-C (SIGINT) or kill (SIGTERM) that arrives inside the block until its end,
    then stop as it would have: between an epoch's checkpoint and its log line it had left the
    epoch in last.pt but never in train.log or TensorBoard (--resume goes on after it). Only in
    the main thread, where Python runs signal handlers; SIGKILL cannot be held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {number: signal.signal(number, lambda number, _: held.append(number))
                for number in stops}
    try:
        yield
    finally:
        for number, handler in previous.items():  # None: one set outside Python
            signal.signal(number, signal.SIG_DFL if handler is None else handler)
        if held:  # to the handler that was there (the CLI's, Python's Ctrl-C, or none)
            signal.raise_signal(held[0])


def _format_row(row: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) and math.isfinite(v) else f"{k}={v}"
                     for k, v in row.items() if k != "epoch")
