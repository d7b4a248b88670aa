"""The machine a measurement ran on, as one line (benchmarks and ``kdml reproduce`` reports)."""

from __future__ import annotations

import os
import platform

import torch


def machine_description(device: torch.device | None = None) -> str:
    """CPU model, logical CPUs and memory; with a CUDA ``device``, the GPU's name first."""
    model = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line)
    except (OSError, StopIteration):
        pass
    memory = ""
    try:
        with open("/proc/meminfo") as meminfo:
            memory = f", {int(meminfo.readline().split()[1]) / 2**20:.1f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    host = f"{model}, {os.cpu_count()} logical CPUs{memory}"
    if device is not None and device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} GPU; {host}"
    return host
