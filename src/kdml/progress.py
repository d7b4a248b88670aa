"""When kdml draws a progress bar: the one rule of the trainer's and the evaluator's bars."""

from __future__ import annotations


def bar_disabled(progress: bool | None, main: bool = True) -> bool | None:
    """tqdm's ``disable`` for a bar: ``progress`` None draws it on a terminal only (tqdm's own
    rule, ``None``), False never, True always; a torchrun rank other than 0 (``main`` False)
    never draws one, since rank 0's stands for them all. (``None or not main`` had read as
    False on rank 0, drawing bars into redirected output.)"""
    if not main:
        return True
    return None if progress is None else not progress
