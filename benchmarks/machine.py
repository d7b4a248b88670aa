"""The machine a benchmark ran on, as one line for its report (shared by the scripts here)."""

from kdml.machine import machine_description

__all__ = ["machine_description"]
