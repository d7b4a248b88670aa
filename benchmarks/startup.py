"""How long a kdml command takes to start: fresh interpreters, timed from the outside.

Every ``kdml`` command, and every rank of a torchrun job, starts a Python process that imports
torch and kdml's modules before it does any work. Four figures, each the median (and range) of
``--repeats`` fresh processes:

* ``imports``: ``python -c "import kdml.training.trainer, kdml.evaluation.evaluator"``, the
  modules ``kdml train`` and ``kdml eval`` load;
* ``one step``: ``kdml train amsoftmax`` on a tiny ``folder:DIR`` dataset (4 classes of 8
  PNG images, 32 px) for one training step and one evaluation, on the CPU with one thread;
* ``mistyped run``: ``kdml eval`` of a run folder that does not exist, to its one-line error
  (exit status 2);
* ``mistyped recipe``: ``kdml train jdr --dataset digits``, to its one-line error (exit
  status 2).

Each pass also reports the CPU share other processes used meanwhile ("others' load", share of
all cores), from ``/proc/stat``.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/startup.py --repeats 5
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import machine_description
from measure import busy_cpu_seconds, cpu_seconds, others_share, positive_count
from PIL import Image

IMPORTS = "import kdml.training.trainer, kdml.evaluation.evaluator"


def write_folder(root: Path, classes: int = 4, per_class: int = 8, size: int = 32) -> Path:
    """A ``folder:DIR`` dataset of random PNG images."""
    rng = np.random.default_rng(0)
    for label in range(classes):
        folder = root / f"c{label}"
        folder.mkdir(parents=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{index}.png")
    return root


def timed(command: list[str], status: int = 0) -> tuple[float, float]:
    """Wall seconds of ``command``, which must exit with ``status``, and the share of all cores
    others used meanwhile."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    busy, own = busy_cpu_seconds(), cpu_seconds(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode != status:
        raise SystemExit(f"{' '.join(command)} exited with {done.returncode}, not {status}:\n"
                         f"{done.stderr}")
    wall = time.perf_counter() - start
    others = busy_cpu_seconds() - busy - (cpu_seconds(resource.RUSAGE_CHILDREN) - own)
    return wall, others_share(others, wall)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=positive_count, default=5)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="kdml-startup-"))
    try:
        folder = write_folder(scratch / "images")
        cases = {
            "imports": [sys.executable, "-c", IMPORTS],
            "one step": [sys.executable, "-m", "kdml", "train", "amsoftmax", "--dataset",
                         f"folder:{folder}", "--no-progress", "train.epochs=1",
                         "train.steps_per_epoch=1", "data.batch_size=8",
                         "data.samples_per_class=4", "data.image_size=32",
                         "model.backbone=cnn", "eval.nmi=false", "train.device=cpu"],
            "mistyped run": [sys.executable, "-m", "kdml", "eval", str(scratch / "no-such-run")],
            "mistyped recipe": [sys.executable, "-m", "kdml", "train", "jdr", "--dataset",
                                "digits"],
        }
        statuses = {"mistyped run": 2, "mistyped recipe": 2}
        print(f"machine: {machine_description()}\n")
        print("| command | median wall (s) | range (s) | others' load |")
        print("|---|---|---|---|")
        for name, command in cases.items():
            results = []
            for repeat in range(args.repeats):
                out = scratch / f"run-{repeat}"
                results.append(timed([*command, "--out", str(out)] if name == "one step"
                                     else command, statuses.get(name, 0)))
                shutil.rmtree(out, ignore_errors=True)
            walls = [wall for wall, _ in results]
            load = max(share for _, share in results)
            print(f"| {name} | {statistics.median(walls):.2f} | {min(walls):.2f}-"
                  f"{max(walls):.2f} | at most {load:.0%} |")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
