"""The ``kdml`` console script and ``python -m kdml``: :func:`kdml.cli.main`, imported where a
Ctrl-C is said in one line too.

The command line's modules take ~0.1-0.4 s to import, before :func:`kdml.cli.main` turns a
stop into a line and an exit status; a Ctrl-C in that time would print Python's traceback.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Run the ``kdml`` command on ``sys.argv``; its exit status."""
    try:
        from kdml.cli import main as run_command
    except KeyboardInterrupt:  # the line and status kdml.cli gives a Ctrl-C
        print("kdml: interrupted", file=sys.stderr)
        return 130
    return run_command()
