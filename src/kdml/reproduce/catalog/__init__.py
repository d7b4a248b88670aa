"""The experiments of ``kdml reproduce``: each paper's tables and figures, at the largest
scale the offline data allows.

The papers' own datasets (CUB-200-2011, Cars196, SOP, LFW, CIFAR-10) are not offline, so each
experiment runs on the offline sets named in issue 12 and shows the paper's number, measured on
its own data, in a column beside kdml's. Settings are the recipes' defaults (the papers', except
where docs/recipes.md says why not); the changes are the data, the CPU settings their tables
name and, with ``quick``, fewer epochs and cells. No setting is chosen on
test classes: nothing here is tuned at all.
"""

from __future__ import annotations

from kdml.reproduce.catalog.atlas import atlas_experiments
from kdml.reproduce.catalog.dtml import dtml_experiments
from kdml.reproduce.catalog.jrd import jrd_experiments
from kdml.reproduce.experiments import Experiment

PAPERS = ("jrd", "atlas", "dtml")


def experiments(paper: str, quick: bool = False) -> list[Experiment]:
    """The experiments of ``paper`` (``jrd``, ``atlas``, ``dtml`` or ``all``)."""
    builders = {"jrd": jrd_experiments, "atlas": atlas_experiments, "dtml": dtml_experiments}
    names = PAPERS if paper == "all" else (paper,)
    return [experiment for name in names for experiment in builders[name](quick)]
