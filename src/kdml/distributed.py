r"""Many processes (``torchrun``) with torch.distributed: the one place that knows about ranks.

kdml's regularizers are functions of the whole batch: kernel matrices with adaptive bandwidths,
neighbour graphs, MMDs. Split across processes, each would see only its share and the
objective would silently change. So every rank :func:`gather` s the representations of the
global batch, in rank order, and computes the *same* global objective; the gradient reaches
each rank's own rows only, scaled so that DistributedDataParallel's averaging gives exactly the
single-process gradient (see :class:`_GatherWithGradient`).

Nothing here does anything in a single process: :func:`gather` returns its input, the world
has one rank, and rank 0 is the only rank.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import re
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from kdml.errors import KdmlError, LocalError, QuietExit
from kdml.launch import (
    check_rendezvous,
    launch_rank,
    launched_by_torchrun,
    local_rank,
    processes_on_this_machine,
    world_size,
)

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes the run folder and prints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.size > 1


def world() -> World:
    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size(), local_rank(dist.get_rank()))
    return World()


def refusal(message: str) -> KdmlError:
    """The error that refuses a command under torchrun, before any process group exists: every
    rank meets it alike, so rank 0 (torchrun's ``RANK``) prints it and the others stop quietly
    (:class:`~kdml.errors.QuietExit`) rather than print the same line once each."""
    return KdmlError(message) if launch_rank() == 0 else QuietExit(message)


def setup(use_cuda: bool) -> World:
    """Join the process group torchrun set up the environment for (NCCL on GPUs, gloo on
    CPUs); a single process stays as it is."""
    if not launched_by_torchrun() or dist.is_initialized():
        return world()
    check_rendezvous()
    if use_cuda:
        torch.cuda.set_device(local_rank())
    # The first DistributedDataParallel imports this module (through torch.distributed._shard),
    # and its functions' defaults (group=group.WORLD) would then hold the process group for
    # good: teardown could not free it, and its gloo threads, still finishing a collective's
    # cleanup (which takes the GIL), would abort the process if the interpreter were shutting
    # down ("terminate called without an active exception"). Imported before the group
    # exists, the defaults are None.
    importlib.import_module("torch.distributed.nn.functional")

    # torchrun's processes meet at once; one started by hand, or a machine whose processes
    # are late, had waited up to the 30 minutes without a word
    waiting = threading.Timer(JOIN_NOTICE_S, _say_still_waiting)
    waiting.daemon = True
    waiting.start()
    try:
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(minutes=30))
    finally:
        waiting.cancel()
    return world()


# Seconds of waiting for the job's other processes before saying so.
JOIN_NOTICE_S = 60.0


def _say_still_waiting() -> None:
    """One line on stderr: what this process waits for, and what it takes to start it."""
    address = f"{os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')}"
    print(f"kdml: rank {launch_rank()} has waited {JOIN_NOTICE_S:g} s at {address} for the "
          f"job's {world_size()} processes (WORLD_SIZE) to join; it waits up to 30 minutes: "
          "start the others (torchrun starts them all), or stop this one and unset WORLD_SIZE "
          "to train in one process", file=sys.stderr, flush=True)


def device_for(name: str) -> str:
    """``cuda`` becomes this process's own GPU (``cuda:LOCAL_RANK``) under torchrun; a machine
    with fewer visible GPUs than torchrun's processes on it is refused by the processes left
    without one (:class:`~kdml.errors.LocalError`: rank 0 may have one)."""
    if name in ("cuda", "auto") and torch.cuda.is_available() and launched_by_torchrun():
        rank_here, count = local_rank(), torch.cuda.device_count()
        if rank_here >= count:  # its cuda:N, refused later, would blame train.device
            gpus = f"{count} visible GPU{'' if count == 1 else 's'}"
            local = processes_on_this_machine(world_size())
            raise LocalError(f"torchrun started {local} processes on this machine, which has "
                             f"{gpus}, and each process trains on its own GPU: start at most "
                             f"{count} per machine (torchrun's nproc_per_node), or give "
                             "train.device=cpu")
        return f"cuda:{rank_here}"
    return name


class _GatherWithGradient(torch.autograd.Function):
    r"""All ranks' ``x`` concatenated in rank order; the backward returns ``world_size`` times
    the gradient of this rank's rows.

    Why the scaling is right: every rank computes the same global loss :math:`L` from the same
    gathered tensor, so the incoming gradient on rank :math:`r` is the exact
    :math:`\partial L / \partial x_r` for its rows :math:`x_r`; the other ranks' rows are
    constants here, their own ranks backpropagate them. Rank :math:`r`'s parameter gradient is
    then :math:`\sum_{i \in r} \partial L / \partial x_i \cdot \partial x_i / \partial
    \theta`, and the single-process gradient is the sum of these over the ranks. DDP
    *averages* the ranks' gradients, dividing that sum by the world size; multiplying by it
    here gives back the sum. (Parameters used only after the gather get the full gradient on
    every rank, which DDP's average leaves unchanged. JRD's proxies enter before it, through
    the class-level cosines, and follow the rule above.)
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        size, rank = dist.get_world_size(), dist.get_rank()
        parts = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(parts, x.contiguous())
        ctx.rows, ctx.size = (rank * len(x), (rank + 1) * len(x)), size
        return torch.cat(parts)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        start, stop = ctx.rows
        return grad[start:stop] * ctx.size


def gather(x: Tensor) -> Tensor:
    """The global batch of ``x`` (every rank's rows, in rank order), keeping the gradient of
    this rank's rows (:class:`_GatherWithGradient`); ``x`` itself in a single process. Every
    rank must pass the same number of rows."""
    if not world().is_distributed:
        return x
    if x.requires_grad:
        return _GatherWithGradient.apply(x)
    parts = [torch.empty_like(x) for _ in range(world().size)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts)


def every_rank(value: T) -> list[T]:
    """Every rank's ``value`` (any picklable object), in rank order; ``[value]`` in a single
    process."""
    if not world().is_distributed:
        return [value]
    values: list[T | None] = [None] * world().size
    dist.all_gather_object(values, value)
    return values  # type: ignore[return-value]


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """The sum of ``tensor`` over the ranks (a new tensor; ``tensor`` in a single process)."""
    if not world().is_distributed:
        return tensor
    total = tensor.clone()
    dist.all_reduce(total)
    return total


def mean_over_ranks(tensor: Tensor) -> Tensor:
    """The mean of ``tensor`` over the ranks (``tensor`` in a single process): a mean over
    the global batch, from each rank's mean over its equal share of it."""
    if not world().is_distributed:
        return tensor
    return all_reduce_sum(tensor) / world().size


def broadcast(value: T) -> T:
    """Rank 0's ``value`` on every rank (any picklable object)."""
    if not world().is_distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# What gloo and NCCL say when a peer of a collective is gone (killed, crashed, out of memory)
_PEER_LOST = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|communicator was "
                        r"aborted|ProcessGroupNCCL's watchdog|remote process exited", re.I)


def failed_collective(error: BaseException) -> bool:
    """Whether ``error`` is a torch.distributed collective of a started process group failing
    because a peer is gone (gloo's "Connection reset by peer" when a rank is killed), not a
    collective called wrongly, whose traceback is kept."""
    if not isinstance(error, RuntimeError) or not (dist.is_available()
                                                   and dist.is_initialized()):
        return False
    return isinstance(error, dist.DistNetworkError) or bool(_PEER_LOST.search(str(error)))


def broadcast_buffers(module: nn.Module) -> None:
    """Rank 0's buffers (BatchNorm's running statistics) on every rank, in place; nothing in a
    single process. DistributedDataParallel sends them at the start of each training forward,
    and each rank's own forward then updates its copy from its share of the batch: after the
    last step they differ, and ranks scoring their slices of the test set with them would
    score a model that is no one's (rank 0's is the one saved)."""
    if not world().is_distributed:
        return
    for buffer in module.buffers():
        dist.broadcast(buffer, src=0)


def from_main(function: Callable[[], T]) -> T:
    """Run ``function`` on rank 0 only and return its result on every rank. If it raises a
    :class:`~kdml.errors.KdmlError`, or an OSError about a file (a full disk, no permission:
    the CLI says either in one line), rank 0 raises it and the other ranks a
    :class:`QuietExit`, so no rank waits forever on the others, nor adds "a collective
    operation failed" to rank 0's line."""
    if not world().is_distributed:
        return function()
    outcome: tuple[str, object] = ("ok", None)
    if world().is_main:
        try:
            outcome = ("ok", function())
        except (KdmlError, OSError) as error:
            if not _said_in_a_line(error):
                raise
            outcome = ("error", error)
    kind, value = broadcast(outcome)  # the other ranks' placeholder is replaced by rank 0's
    if kind == "error" and isinstance(value, KdmlError | OSError):
        if world().is_main:
            raise value
        raise QuietExit(_said(value))
    return value  # type: ignore[return-value]


def agreed(function: Callable[[], T]) -> T:
    """Run ``function`` on every rank, which then agree on its outcome: where it raised a
    :class:`~kdml.errors.KdmlError`, or an OSError about a file (no permission, an I/O error),
    on any rank, rank 0 raises one (its own, else the first failed rank's, named
    ``rank K: ...``) and the other ranks a :class:`QuietExit`.

    For the work each process does for itself and may fail at alone (reading its machine's
    copy of the data, its weights file): a rank that had stopped there by itself said nothing,
    since only rank 0 prints an error all ranks meet, and rank 0, waiting in the next
    collective, was stopped by torchrun before it could say anything. ``function`` must not
    call collectives where one rank can fail before them."""
    if not world().is_distributed:
        return function()
    error: KdmlError | OSError | None = None
    value: T | None = None
    try:
        value = function()
    except (KdmlError, OSError) as raised:
        if not _said_in_a_line(raised):
            raise
        error = raised
    messages: list[str | None] = [None] * world().size
    dist.all_gather_object(messages, None if error is None else _said(error))
    failed = [(rank, message) for rank, message in enumerate(messages) if message is not None]
    if not failed:
        return value  # type: ignore[return-value]
    if not world().is_main:
        raise QuietExit(failed[0][1])
    if error is not None:
        raise error
    rank, message = failed[0]
    raise KdmlError(f"rank {rank}: {message}")


def _said_in_a_line(error: KdmlError | OSError) -> bool:
    """Whether the CLI says ``error`` in one line: a KdmlError, or an OSError about a file (a
    full disk, no permission); one not about a path is a bug's, whose traceback is kept."""
    return isinstance(error, KdmlError) or error.filename is not None


def _said(error: KdmlError | OSError) -> str:
    """``error`` in a line: an OSError as ``PATH: reason`` (its filename and strerror)."""
    if isinstance(error, KdmlError) or error.filename is None:
        return str(error)
    name = error.filename
    return f"{os.fsdecode(name) if isinstance(name, bytes) else name}: {error.strerror or error}"


def barrier() -> None:
    if world().is_distributed:
        dist.barrier()


# Seconds that a rank stopping quietly (on an error rank 0 says) waits for rank 0 to have said
# it: rank 0 first closes the run folder's records (train.log's line, the plots).
MAIN_SAYS_WITHIN_S = 30.0


def _store() -> dist.Store:
    """The process group's key-value store (torchrun's rendezvous store), which torch gives
    only through a private, long-standing accessor."""
    return dist.distributed_c10d._get_default_store()


def _store_key(kind: str, *parts: object) -> str:
    """A key of this attempt of the job on :func:`_store` (torchrun's store outlives a
    restart): ``rank-0-has-said``, set once rank 0 has said how the command ended, or
    ``rank-stopped``/RANK, the error RANK stopped on alone."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return "/".join(["kdml", kind, attempt, *map(str, parts)])


def _wait_for_main(quiet: bool, within_s: float, store: dist.Store | None = None,
                   main: bool | None = None) -> bool:
    """Rank 0: tell the other ranks that it has said how the command ended. Another rank that
    stops ``quiet`` ly (an error rank 0 says): wait until rank 0 has, at most ``within_s``
    seconds, on the process group's store (or ``store``, where ``main`` says whether this
    process is rank 0), so that torchrun, which stops the other processes once one has
    failed, does not stop rank 0 before its line (it had, where rank 0's plots took longer
    than the quiet rank's exit). Rank 0 gone (its store with it, where it held it), or too
    slow: go on stopping. Returns False where a quiet rank's wait ran out (rank 0 had not
    said it: the error may be this rank's alone), else True."""
    store = _store() if store is None else store
    main = world().is_main if main is None else main
    try:
        if main:
            store.set(_store_key("rank-0-has-said"), "1")
        elif quiet:
            store.wait([_store_key("rank-0-has-said")], timedelta(seconds=within_s))
    except RuntimeError:  # torch's DistStoreError (timed out) or DistNetworkError (gone)
        return main or not quiet
    return True


def tell_main(message: str) -> None:
    """A rank other than 0 that stops on an error of its own (an unreadable image in its
    share, its own out of memory) leaves ``message`` on the process group's store, before its
    exit breaks the others' collectives: rank 0 sees only a failed collective, and records
    the cause in train.log (:func:`stopped_ranks`). Nothing on rank 0, in one process, or
    where the store is gone."""
    if not (dist.is_available() and dist.is_initialized()) or world().rank == 0:
        return
    with contextlib.suppress(RuntimeError):  # the store is gone: its output alone says it
        _store().set(_store_key("rank-stopped", world().rank), message)


def stopped_ranks() -> list[str]:
    """``rank K: message`` for each other rank that stopped on an error of its own
    (:func:`tell_main`), read without waiting; none in one process or where the store is
    gone."""
    if not (dist.is_available() and dist.is_initialized()) or not world().is_distributed:
        return []
    store = _store()
    said = []
    try:
        for rank in range(1, world().size):
            key = _store_key("rank-stopped", rank)
            if store.check([key]):
                message = store.get(key).decode(errors="replace")
                said.append(f"rank {rank}: {message}")
    except RuntimeError:  # the store is gone (it was a rank's that stopped)
        pass
    return said


def _said_before_joining(quiet: bool) -> bool:
    """:func:`_wait_for_main` for a command that stops before the process group exists (a
    command refused under torchrun, a usage error or a bad setting, which every process meets
    alike), on torchrun's own store, which its processes reach at ``MASTER_ADDR:MASTER_PORT``
    (``TORCHELASTIC_USE_AGENT_STORE``): the quiet processes had exited at once, and torchrun
    then stopped a rank 0 a moment slower before its line, leaving the job's only word of why
    unsaid. Processes started otherwise (by hand, by a job script) have no store to meet at,
    and stop at once. Returns :func:`_wait_for_main`'s answer (True where there was none
    to wait for)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return True
    try:
        main = launch_rank() == 0
        address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    except (KdmlError, KeyError, ValueError):  # set wrong by hand: each process says so itself
        return True
    if not (main or quiet):
        return True  # this process's own error (a LocalError) is said by itself
    try:
        store = dist.TCPStore(address, port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=MAIN_SAYS_WITHIN_S))
    except RuntimeError:  # torchrun's store is gone (torchrun is stopping the job)
        return True
    return _wait_for_main(quiet, MAIN_SAYS_WITHIN_S, store, main)


def teardown(in_flight: BaseException | None = None, quiet: bool = False) -> bool:
    """Free the process group, which joins its threads, once the DistributedDataParallel
    wrappers holding it are gone (:func:`setup` says why it matters). First rank 0 tells the
    others it is done saying how the command ended, and a rank that stops ``quiet`` ly, on
    an error rank 0 says, waits for that (:func:`_wait_for_main`); so they do where the
    command stopped before the group existed (:func:`_said_before_joining`). Returns False
    where a quiet rank waited in vain: its error is then its own to say.

    ``in_flight``: an exception on its way out (a bug's), whose traceback's frames hold the
    wrapper: their locals are cleared first (the traceback still prints). Otherwise the
    wrapper's reducer, freed with the exception at exit, dropped the group's last reference
    while its gloo thread still finished the last broadcast: the rank then hung (the join
    holding the GIL that thread waits for) or aborted."""
    if not dist.is_available():
        return True
    if not dist.is_initialized():
        return _said_before_joining(quiet)
    said = not world().is_distributed or _wait_for_main(quiet, MAIN_SAYS_WITHIN_S)
    if in_flight is not None and in_flight.__traceback__ is not None:
        traceback.clear_frames(in_flight.__traceback__)
        gc.collect()  # a wrapper in a reference cycle
    dist.destroy_process_group()
    return said
