"""The machine a benchmark ran on, as one line for its report (shared by the scripts here)."""

from __future__ import annotations

import os
import platform


def machine_description() -> str:
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line)
    except (OSError, StopIteration):
        pass
    with open("/proc/meminfo") as meminfo:
        total_gib = int(meminfo.readline().split()[1]) / 2**20
    return f"{model}, {os.cpu_count()} logical CPUs, {total_gib:.1f} GiB RAM"
