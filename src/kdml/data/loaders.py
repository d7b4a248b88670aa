"""DataLoaders over kdml datasets: worker processes decode, the main process moves batches.

Datasets return whole :class:`~kdml.data.dataset.Batch` es from ``__getitems__``, so the
loaders use batch samplers (:mod:`kdml.data.samplers`) and no per-sample collation. Workers are
worth their start-up only for file-backed datasets: ``data.num_workers = -1`` (the default)
gives one per core, at most 8, for those and none for in-memory arrays, whose batches are a
single gather. Under torchrun the cores are shared among the processes on the machine
(``LOCAL_WORLD_SIZE``), each taking its share, at least one: every process starts its own
loader, and 8 workers each for 8 processes on a 16-core machine would be 64 decoders.
"""

from __future__ import annotations

import logging
import multiprocessing.synchronize
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from types import FrameType, TracebackType

import torch
from PIL import UnidentifiedImageError
from torch.utils.data import BatchSampler, DataLoader, Sampler, SequentialSampler

from kdml.data.dataset import Batch, DmlDataset, collate_batch
from kdml.data.images import DECODE_ERRORS
from kdml.errors import KdmlError, LocalError
from kdml.launch import launched_by_torchrun, processes_on_this_machine

MAX_AUTO_WORKERS = 8
BAD_IMAGE_POLICIES = ("error", "skip")

logger = logging.getLogger("kdml.data")


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def resolve_num_workers(setting: int, dataset: DmlDataset) -> int:
    """``data.num_workers``: a count, or -1 for the default described in the module doc."""
    if setting >= 0:
        return setting
    if not dataset.is_file_backed:
        return 0
    share = available_cores() // processes_on_this_machine(1)
    return max(1, min(share, MAX_AUTO_WORKERS))


def batch_loader(dataset: DmlDataset, batch_sampler: Iterable[list[int]], num_workers: int,
                 pin_memory: bool = False, persistent: bool = False) -> DataLoader:
    """A ``DataLoader`` yielding :class:`Batch` es of ``dataset`` as ``batch_sampler`` says.

    ``pin_memory`` puts batches in page-locked memory, for non-blocking copies to a GPU;
    ``persistent`` keeps the workers alive between passes (a training loader).
    """
    # The loader's own generator only seeds the workers, which draw nothing; giving it one
    # keeps it from drawing that seed from torch's global generator.
    return _Loader(dataset, batch_sampler=batch_sampler, num_workers=num_workers,
                      # __getitems__ hands it a Batch; torch's stubs expect a list of samples
                      collate_fn=collate_batch,  # type: ignore[arg-type]
                      pin_memory=pin_memory,
                      persistent_workers=persistent and num_workers > 0,
                      worker_init_fn=set_up_worker,
                      generator=torch.Generator().manual_seed(0))


class _Loader(DataLoader):
    """torch's DataLoader without its check of the worker count against the cores: a count
    the user set (data.num_workers, up to 256) is the user's to choose, and torch's advice
    came as Python's two-line warning naming torch's source, twice a loader."""

    def check_worker_number_rationality(self) -> None:
        pass


def set_up_worker(worker_id: int) -> None:
    """A loader worker's ``worker_init_fn``: a kill or Ctrl-C stops it where it holds none of
    the locks it shares with the main process (:func:`stop_outside_shared_locks`), and it does
    not report the send a stopped main process no longer receives
    (:func:`quiet_when_the_receiver_goes`)."""
    stop_outside_shared_locks()
    quiet_when_the_receiver_goes(worker_id)


# The module of multiprocessing's locks shared between processes (Lock, Condition, Event).
_SHARED_LOCKS_MODULE = multiprocessing.synchronize.__name__

# How long a stop that arrived inside a shared lock waits before it is tried again, in seconds.
_RETRY_S = 0.01


def stop_outside_shared_locks() -> None:
    """In a loader worker: the first SIGTERM or SIGINT raises ``KeyboardInterrupt``, which
    torch's worker loop takes as its end, once the worker is out of multiprocessing's shared
    locks; a second one ends the worker at once.

    A kill of the whole process group (SLURM, systemd, ``kill -- -PGID``; Ctrl-C in a terminal)
    reaches the workers with the main process. A worker that died of it at once while it held
    the lock of torch's shared "workers done" event (each worker reads that event once a batch)
    left that lock taken for good, and the main process, stopping as the kill asked, then waited
    forever to set the event in the loader's shutdown: kdml's test of such a kill hung after
    "kdml: terminated". Raised at once, ``KeyboardInterrupt`` leaks that lock too where it is
    raised between the lock's acquisition and its ``with`` block (Python runs a signal's handler
    as the call that acquired it returns); so a stop that arrives inside
    ``multiprocessing.synchronize`` is tried again a moment later (SIGALRM).
    """
    for stop in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop, _stop_once)


def _stop_once(signum: int, frame: FrameType | None) -> None:
    """A worker's handler of its first SIGTERM or SIGINT (:func:`stop_outside_shared_locks`)."""
    signal.signal(signum, signal.SIG_DFL)  # the next one ends the worker at once
    _stop_outside_shared_locks(signum, frame)


def _stop_outside_shared_locks(signum: int, frame: FrameType | None) -> None:
    """Raise ``KeyboardInterrupt`` unless ``frame`` is inside a shared lock's code; try again
    in :data:`_RETRY_S` if it is."""
    inside = frame
    while inside is not None:
        if inside.f_globals.get("__name__") == _SHARED_LOCKS_MODULE:
            signal.signal(signal.SIGALRM, _stop_outside_shared_locks)
            signal.setitimer(signal.ITIMER_REAL, _RETRY_S)
            return
        inside = inside.f_back
    raise KeyboardInterrupt


# What a worker's send to the main process raises when the main process has gone or stopped.
LOST_RECEIVER = (BrokenPipeError, ConnectionResetError, EOFError)


def quiet_when_the_receiver_goes(worker_id: int) -> None:
    """In a loader worker: a send that fails because the main process stopped is
    not reported by the worker.

    A worker hands each batch's shared memory to the main process through a file descriptor
    that a thread of ``multiprocessing.resource_sharer`` sends on request; if the main process
    is stopped (Ctrl-C, a kill) between asking and receiving, that thread's send fails and it
    prints the error's traceback under the main process's own one-line stop. The main process
    says why it stopped; any other error of the worker is reported as before.
    """
    report = sys.excepthook

    def excepthook(kind: type[BaseException], error: BaseException,
                   trace: TracebackType | None) -> None:
        if not issubclass(kind, LOST_RECEIVER):
            report(kind, error, trace)

    sys.excepthook = excepthook


def sequential_loader(dataset: DmlDataset, batch_size: int, num_workers: int,
                      pin_memory: bool = False) -> DataLoader:
    """Every sample once, in dataset order (for embedding and fitting)."""
    sampler: Sampler[int] = SequentialSampler(range(len(dataset)))
    return batch_loader(dataset, BatchSampler(sampler, batch_size, drop_last=False),
                        num_workers, pin_memory)


UNREADABLE = "not a readable image file"


def decode_failure(dataset: DmlDataset, index: int) -> str:
    """Why sample ``index``'s image does not decode, in a few words.

    The loader's workers only flag an undecodable image (:class:`Batch` holds tensors), so it
    is decoded again here for its error: e.g. :func:`kdml.data.images.eight_bit`'s reason for
    refusing 32-bit pixels, as ``kdml search`` reports for a query image.
    """
    try:
        dataset.load(index)
    except UnidentifiedImageError:  # "cannot identify image file '<path>'": the path again
        return UNREADABLE
    except OSError as error:  # e.g. "No such file or directory", "image file is truncated"
        reason = first_line(error.strerror or str(error))
        return f"{UNREADABLE} ({reason})" if reason else UNREADABLE
    except DECODE_ERRORS as error:  # eight_bit's ValueErrors, DecompressionBombError
        return first_line(str(error)) or UNREADABLE
    return UNREADABLE  # it decodes now: a failure of the worker's read


def first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


def listed_source(dataset: DmlDataset, index: int) -> str:
    """Sample ``index``'s file, with its place in its list file where one lists it
    (``".../Black_Footed_Albatross_0046_18.jpg (images.txt line 5)"``): the row to fix."""
    place = dataset.place_of(index)
    return f"{dataset.source_of(index)} ({place})" if place else dataset.source_of(index)


def readable_batches(batches: Iterable[Batch], dataset: DmlDataset, on_bad_image: str,
                     logged: set[str] | None = None, min_size: int = 1,
                     on_skip: Callable[[Batch], None] | None = None) -> Iterator[Batch]:
    """``batches`` with undecodable images handled as ``data.on_bad_image`` says.

    ``"error"`` stops with a one-line error naming the file; ``"skip"`` drops those samples
    from their batch and drops batches left with fewer than ``min_size`` samples (2 for
    training, whose BatchNorm layers cannot normalise one sample: a batch of 2 with one
    unreadable image had stopped with torch's traceback), logging each file once: once in
    ``batches``, or once for all the calls that share ``logged`` (a training run's epochs,
    which draw a file again and again). ``on_skip`` is called with each batch, as loaded, that
    has images skipped, once their files are logged (training's check of a class left with
    no readable image).
    """
    logged = set() if logged is None else logged
    if on_bad_image not in BAD_IMAGE_POLICIES:
        raise KdmlError(f"data.on_bad_image must be error or skip, got {on_bad_image!r}")
    for batch in batches:
        if batch.unreadable.any():
            indices = batch.indices[batch.unreadable].tolist()
            sources = [listed_source(dataset, int(i)) for i in indices]
            if on_bad_image == "error":
                # under torchrun skip is refused (unequal batches): not offered there
                skip = (", or resume it in one process with data.on_bad_image=skip in its "
                        "config.yaml (torchrun's processes cannot skip: their batches would "
                        "be unequal)" if launched_by_torchrun() else
                        ", or skip such files with data.on_bad_image=skip (for a trained "
                        "run, in its config.yaml, which --resume, eval, embed and plots "
                        "follow)")
                raise LocalError(f"cannot decode image {sources[0]}: "
                                f"{decode_failure(dataset, int(indices[0]))}; "
                                "replace or remove it (a trained run takes a readable copy "
                                f"under the same name: its data.json records its files){skip}")
            for source in sources:
                if source not in logged:
                    logged.add(source)
                    logger.warning("skipping unreadable image %s", source)
            if on_skip is not None:
                on_skip(batch)
            batch = Batch(*(field[~batch.unreadable] for field in batch))
            if len(batch.labels) < min_size:
                continue
        yield batch


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy to ``device`` without waiting (the copy is asynchronous from pinned memory)."""
    return tensor.to(device, non_blocking=True)
