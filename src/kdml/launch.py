"""torchrun's environment variables, read and checked in one place.

torchrun tells each process it starts where it stands: ``WORLD_SIZE`` (all processes),
``RANK`` (this one's place among them), ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` (the same on
this machine), and ``MASTER_ADDR``/``MASTER_PORT`` (where they meet). A shell or a cluster's
job script may also set some of them by hand; a value that is no count, or a ``WORLD_SIZE``
above 1 without the others, is refused here in one line rather than as ``int()``'s or
torch's own traceback.

Torch-free, so that the CLI can read a process's rank before (or without) importing torch.
"""

from __future__ import annotations

import os

from kdml.errors import KdmlError, LocalError

# What env:// rendezvous (torch.distributed.init_process_group's default) reads.
RENDEZVOUS_VARIABLES = ("RANK", "MASTER_ADDR", "MASTER_PORT")


def _count(name: str, default: int, low: int, high: int | None = None) -> int:
    """The environment variable ``name`` as a whole number from ``low`` up to ``high``
    (inclusive), ``default`` where it is unset."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        # LocalError: this process's own variable, so it says it whatever its rank
        raise LocalError(f"the environment variable {name}={text!r} is not a whole number "
                        f"{bound}: torchrun sets it for the processes it starts; unset it to "
                        "run in one process, or start kdml with torchrun")
    return value


def world_size() -> int:
    """How many processes the job has: torchrun's ``WORLD_SIZE``, else 1."""
    return _count("WORLD_SIZE", 1, 1)


def launched_by_torchrun() -> bool:
    """Whether this process is one of several (``WORLD_SIZE`` above 1)."""
    return world_size() > 1


def launch_rank() -> int:
    """This process's rank as torchrun's ``RANK`` gives it (0 where unset, or in a single
    process), before any process group exists."""
    size = world_size()
    return _count("RANK", 0, 0, size - 1) if size > 1 else 0


def local_rank(default: int = 0) -> int:
    """This process's place among the job's processes on this machine (``LOCAL_RANK``)."""
    return _count("LOCAL_RANK", default, 0)


def processes_on_this_machine(size: int) -> int:
    """How many of the job's ``size`` processes run on this machine: torchrun's
    ``LOCAL_WORLD_SIZE``, else all of them."""
    return _count("LOCAL_WORLD_SIZE", size, 1)


def check_rendezvous() -> None:
    """Refuse to join a process group that ``WORLD_SIZE`` announces but the other variables
    do not describe (a ``WORLD_SIZE`` exported by hand, say): torch would stop with its own
    traceback ("environment variable RANK expected, but not set")."""
    missing = [name for name in RENDEZVOUS_VARIABLES if not os.environ.get(name)]
    if missing:
        raise KdmlError(f"the environment variable WORLD_SIZE={os.environ['WORLD_SIZE']!r} "
                        f"says this process is one of several, but {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not set: start the job "
                        "with torchrun, which sets them all, or unset WORLD_SIZE to train in one "
                        "process")
    launch_rank()  # read for their checks alone: refused here, not by torch after it joins
    # a LOCAL_RANK beyond this machine's processes, or more of them than the job's, had
    # passed, and the process waited without a word for peers that never come
    local = _count("LOCAL_WORLD_SIZE", world_size(), 1, world_size())
    _count("LOCAL_RANK", 0, 0, local - 1)
    _count("MASTER_PORT", 0, 1, 65535)  # torch's own ValueError ("invalid literal") otherwise
