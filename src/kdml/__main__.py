"""``python -m kdml``: the ``kdml`` command (also what ``torchrun -m kdml`` runs)."""

import sys

from kdml.entry import main

sys.exit(main())
