"""What a run's ``data.json`` costs: :func:`kdml.data.fingerprint.data_fingerprint` at the
sizes of the real datasets, without their files.

``kdml train`` computes it once when a run starts; ``kdml eval`` (and ``embed``, ``index``,
``search``, ``plot``) and ``--resume`` compute it again to compare. Four cases, each cut into
class-disjoint halves, timed ``--repeats`` times (median and range):

* ``SOP paths``: 120,053 image paths under one folder, 22,634 classes,
  the size of Stanford Online Products; only the path strings and labels are hashed;
* ``MNIST arrays``: 70,000 uint8 images of 1x28x28 (the full MNIST or Fashion-MNIST);
* ``CIFAR arrays``: 60,000 uint8 images of 3x32x32;
* ``float features``: 70,000 rows of 64 float64 features (a PCA-reduced feature file), which
  are rounded before hashing.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/fingerprint.py --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch
from machine import machine_description
from measure import positive_count

from kdml.data.dataset import ArrayDataset, DmlDataset
from kdml.data.fingerprint import data_fingerprint
from kdml.data.images import ImageFiles
from kdml.data.splits import make_splits


def sop_like(generator: np.random.Generator) -> DmlDataset:
    classes = 22_634
    labels = np.sort(generator.integers(0, classes, 120_053))
    labels[:classes] = np.arange(classes)  # every class present
    labels.sort()
    paths = np.asarray([f"/data/Stanford_Online_Products/bicycle_final/{label}_{number}.JPG"
                        for number, label in enumerate(labels)])
    return ImageFiles("sop", "", paths, torch.from_numpy(labels))


def arrays(shape: tuple[int, ...], classes: int, dtype: torch.dtype,
           generator: np.random.Generator) -> DmlDataset:
    values = generator.integers(0, 256, shape) if dtype == torch.uint8 else generator.random(shape)
    labels = torch.from_numpy(generator.integers(0, classes, shape[0]))
    return ArrayDataset("arrays", "", torch.from_numpy(values).to(dtype), labels)


def timed(function: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive_count, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = np.random.default_rng(0)
    cases = {
        "SOP paths": sop_like(generator),
        "MNIST arrays": arrays((70_000, 1, 28, 28), 10, torch.uint8, generator),
        "CIFAR arrays": arrays((60_000, 3, 32, 32), 10, torch.uint8, generator),
        "float features": arrays((70_000, 64), 10, torch.float64, generator),
    }
    print(machine_description())
    print("| case | samples | fingerprint (median, range; s) |")
    print("|---|---|---|")
    for name, dataset in cases.items():
        splits = make_splits(dataset, {}, "class-disjoint")
        times = timed(lambda splits=splits: data_fingerprint(splits), args.repeats)
        print(f"| {name} | {len(dataset):,} | {statistics.median(times):.3f} "
              f"({min(times):.3f}-{max(times):.3f}) |")


if __name__ == "__main__":
    main()
