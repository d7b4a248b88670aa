"""Resident memory and CPU time of a benchmark's process, from /proc and getrusage (Linux).

psutil would do the same, but it is not a dependency of kdml, and these few reads are all the
benchmarks need.
"""

from __future__ import annotations

import argparse
import os
import resource


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
