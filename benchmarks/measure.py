"""Resident memory and CPU time of a benchmark's process, from /proc and getrusage (Linux).

psutil would do the same, but it is not a dependency of kdml, and these few reads are all the
benchmarks need.
"""

from __future__ import annotations

import argparse
import functools
import os
import resource
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from kdml.errors import KdmlError

Arguments = ParamSpec("Arguments")
Result = TypeVar("Result")


def proc_status_kib(field: str, pid: str = "self") -> int:
    """A ``kB`` field of ``/proc/PID/status``, e.g. ``VmRSS`` or ``VmHWM`` (the peak)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/{pid}/status")


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        return False
    return proc_status_kib("VmHWM") <= proc_status_kib("VmRSS") + 1024


def busy_cpu_seconds() -> float:
    """CPU time spent by everything on the machine (all cores), from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def others_share(others_cpu: float, wall: float) -> float:
    """The share of all cores that other processes used over ``wall`` seconds, in [0, 1].
    /proc/stat counts in clock ticks (10 ms each), so over a pass of a few milliseconds a
    tick or two had read as 516% of two cores."""
    return min(1.0, max(0.0, others_cpu) / (wall * (os.cpu_count() or 1)))


def cpu_seconds(who: int = resource.RUSAGE_SELF) -> float:
    """CPU time of this process, or of its children that have been waited for."""
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _whole_number_at_least(text: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
    return value


def positive_count(text: str) -> int:
    """An argparse type for a count or size of at least 1: timed runs (``--repeats``,
    ``--rounds``), samples, classes, dimensions, batch and image sizes, threads. Zero repeats
    had left nothing to time (min() or median() of no timings ended the script in a traceback,
    or a table of inf and nan, after its other stages), and a zero or negative size failed
    deep inside torch, numpy or faiss."""
    return _whole_number_at_least(text, 1)


def non_negative_count(text: str) -> int:
    """An argparse type for a count where 0 means none or off (``--warmup``, loader
    ``--workers``, a section's ``--points`` that 0 skips), but a negative one means nothing."""
    return _whole_number_at_least(text, 0)


def refuse_too_few_points(parser: argparse.ArgumentParser, option: str, points: int,
                          needed: int, why: str) -> None:
    """Stop in one line (argparse's, exit status 2) where a size of at least 1 still leaves
    fewer points than the k a script searches for: ``retrieval_metrics`` had ended the script
    in a traceback ('K=100 in ks is larger than the 49 available references'), after its
    data, and some of its stages, were made."""
    if points < needed:
        parser.error(f"argument {option}: leaves {points} points; {why} needs at least "
                     f"{needed}")


def parse_with_quick(parser: argparse.ArgumentParser,
                     quick: dict[str, Any]) -> argparse.Namespace:
    """The command line's options; with ``--quick``, ``quick``'s values (by ``dest``) stand in
    for the defaults only, so an option given explicitly keeps its value (``--quick --batch 4``
    is a smoke run at batch 4)."""
    args = parser.parse_args()
    if args.quick:
        parser.set_defaults(**quick)
        args = parser.parse_args()
    return args


def one_line_kdml_errors(main: Callable[Arguments, Result]) -> Callable[Arguments, Result]:
    """A script's main, whose KdmlError (a mistyped recipe, dataset, config key or run folder)
    ends it as kdml's own commands end: ``SCRIPT: error: ...`` on one line, exit status 2. It
    had ended the scripts in a traceback of up to 45 lines."""
    @functools.wraps(main)
    def said_in_one_line(*args: Arguments.args, **kwargs: Arguments.kwargs) -> Result:
        try:
            return main(*args, **kwargs)
        except KdmlError as error:
            print(f"{Path(sys.argv[0]).name}: error: {error}", file=sys.stderr)
            raise SystemExit(2) from None

    return said_in_one_line
