"""What the commands print: progress bars or not, the metrics table, and lines that only rank
0 prints under torchrun."""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from kdml.errors import KdmlError, Terminated
from kdml.launch import launch_rank

if TYPE_CHECKING:
    from kdml.config import RunConfig


def _is_main_process() -> bool:
    return _rank() == 0


def _rank() -> int:
    """This process's rank: the process group's, else (torchrun started it, the group is not
    joined yet) torchrun's ``RANK``, so that an error every rank meets before joining is
    printed once, by rank 0, not once per process."""
    module = sys.modules.get("kdml.distributed")  # imported only by commands that train
    if module is not None and module.world().is_distributed:
        return int(module.world().rank)
    try:
        return launch_rank()
    except KdmlError:  # torchrun's variables set wrong, by hand: the error says so, once each
        return 0


def _say(message: str) -> None:
    """Print on rank 0 only (the only process under a single launch)."""
    from kdml import distributed

    if distributed.world().is_main:
        print(message)


def _progress(args: argparse.Namespace) -> bool | None:
    return False if args.no_progress else None


def _print_results(config: RunConfig, metrics: dict[str, float], run_dir: Path,
                   validated: bool | None = None) -> None:
    """The metrics table; ``validated`` (default: whether the run validates) names the part."""
    validated = bool(config.data.validation) if validated is None else validated
    scored = "Validation" if validated else "Test"
    print(f"\n{scored} metrics ({config.recipe}, {config.data.dataset}):")
    width = max([12, *map(len, metrics)])  # source_nn_accuracy is 18 long
    print(f"  {'metric':<{width}} value")
    for name, value in metrics.items():
        print(f"  {name:<{width}} {value:.4f}")
    print(f"run folder: {run_dir}")


def _stop_code(stop: KeyboardInterrupt) -> tuple[int, str]:
    """The shell's exit code for a stop, and the word for it: a kill (SIGTERM, 143) or
    Ctrl-C (130)."""
    if isinstance(stop, Terminated):
        return 128 + signal.SIGTERM, "terminated"
    return 130, "interrupted"

