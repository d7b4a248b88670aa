"""The count check shared by the public API: Python and NumPy integers pass, bools do not."""

from __future__ import annotations

from typing import Any, TypeGuard

import numpy as np


def is_positive_int(value: object) -> TypeGuard[int | np.integer[Any]]:
    """Whether ``value`` is a count of at least 1: a Python or NumPy integer (a loop over
    ``np.arange`` gives the latter), not a bool and not a float such as ``2.0``."""
    return bool(not isinstance(value, bool) and isinstance(value, int | np.integer)
                and value >= 1)
