"""The names ``--dataset`` takes, known without the dataset registries (which import torch):
a mistyped one is said at once, where importing them took seconds first. Kept in step with
:data:`kdml.data.registry.DATASETS` and ``FORMATS`` and :data:`kdml.data.domains.DOMAIN_PAIRS`
(tests/test_data.py checks that they agree)."""

from __future__ import annotations

from kdml.errors import KdmlError, did_you_mean

OFFLINE_NAMES = ("mnist5k", "digits", "mnist1d")  # the registry's DATASETS
FORMAT_NAMES = ("cub", "cars196", "sop", "inshop", "cifar10", "cifar100", "mnist",
                "fashion-mnist")  # its on-disk FORMATS
PAIR_NAMES = ("mnist5k->digits", "digits->mnist5k")  # the domain pairs
PATH_PREFIXES = ("folder:", "csv:", "npz:")  # datasets named by their path


def check_dataset_name(dataset: str) -> None:
    """Refuse, in one line, a ``--dataset`` that names no dataset, domain pair or path format,
    listing every kind: ``kdml train``'s, and that of the commands that read a run with
    another dataset (``eval``, ``embed``, ``index``), whose model may take a domain pair's
    features only (the registry's own refusal lists neither the pairs nor ``npz:PATH``). Any
    ``SOURCE->TARGET`` passes here: the pairs' own check suggests the nearest pair."""
    if (dataset.startswith(PATH_PREFIXES) or dataset in OFFLINE_NAMES
            or dataset in FORMAT_NAMES or "->" in dataset):
        return
    # An unquoted 'mnist5k->digits' reaches us as 'mnist5k-': the shell took '>'.
    hint = (" (quote domain pairs in the shell: --dataset 'mnist5k->digits')"
            if dataset.endswith("-") else "")
    names = [*OFFLINE_NAMES, *FORMAT_NAMES, *PAIR_NAMES]
    near = "" if hint else did_you_mean(dataset, names)
    raise KdmlError(f"unknown dataset {dataset!r}{near}; choose one of: "
                    f"{', '.join(names)}, folder:DIR, csv:FILE or npz:PATH{hint}")
