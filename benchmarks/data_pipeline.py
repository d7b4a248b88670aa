"""Throughput and memory of kdml's image-file data path: JPEG decode, resize, augmentation.

The images are synthetic photo-like JPEGs (quality 90, 4:2:0) generated once into a cache
folder laid out as a ``folder:DIR`` dataset (one sub-folder per class). Their sizes are
CUB-like: long side 500, short side 281-500, a quarter of them portrait. Their content is a
sum of smooth random fields at several scales (shared brightness plus weaker colour) and mild
pixel noise, which JPEG compresses like a textured photo; pure random noise would make every
file several times larger and decode unrealistically slowly. Image ``i`` depends only on the
seed and ``i``, so the cache grows as needed and any run reuses it.

Sections (each printed as a markdown table):

* ``baseline``: plain loops over the same files in this process (one core):
  Pillow decode only (``open`` + ``convert("RGB")``); decode + resize of the short side to
  ``--resize`` (bilinear, as kdml) without and with JPEG ``draft``; decode + resize of the
  centred square only (``resize(..., box=...)``: the output kdml keeps, fewer pixels
  resampled); and kdml's ``load_image`` (draft, resize, centre square, uint8 tensor). Plus
  ``InputPipeline.train`` (kornia random resized crop + flip) alone, on one decoded batch.
* ``throughput``: the kdml training path: ``batch_loader(ImageFiles, ShuffledBatches)`` with
  ``w`` workers iterated for one epoch, each batch then augmented by ``InputPipeline.train``
  in this (the main) process, on the CPU; and the same loader without the augmentation.
* ``memory``: for each N, a fresh spawned process runs one epoch over N images (loader,
  augmentation, a SmallCNN forward without gradients, only the embeddings kept, as the
  evaluator keeps them) and reports its resident memory before the epoch and its peak during
  the epoch (``VmHWM`` from ``/proc/self/status``, reset first through ``clear_refs``;
  ``getrusage``'s maximum RSS would carry the parent's peak over to the child), and its
  workers' RSS after their first batch and at their peak. Each ``--memory-runs`` entry is a
  worker count, with ``+mmap`` for a run under ``MALLOC_MMAP_THRESHOLD_=1048576``: glibc's
  allocator then hands every block of 1 MiB or more back to the system when it is freed,
  instead of raising that threshold as large blocks come and go (its default), which lets
  freed batch-sized blocks stay resident and fragment the heap. The two side by side separate
  memory the data path holds from memory the allocator keeps.

How cores are counted. "Processes" is ``w + 1`` with workers (the workers decode; the main
process receives the batches and augments them) and 1 without. The "per process" rate divides
images/s by that count, capped at the machine's cores. The steadier figure is "images per
CPU-second": images divided by the CPU time of the main process and its workers together
(``getrusage`` of self and of the reaped children), which counts only what was used.

The files are read once before timing, so every figure reads them from the page cache: the
disk is not measured. Each timed pass also reports the CPU share other processes used
meanwhile ("others' load", share of all cores), from ``/proc/stat``; on a shared machine,
``--wait-idle S`` starts each timed pass once the others are quiet (waiting at most S
seconds) and runs a disturbed pass again, twice at most.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/data_pipeline.py --wait-idle 30  # the docs
    PYTHONPATH=src .venv/bin/python benchmarks/data_pipeline.py --quick  # smoke run, seconds
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import PIL
import torch
from machine import machine_description  # sibling module: scripts run as benchmarks/NAME.py
from measure import (
    busy_cpu_seconds,
    cpu_seconds,
    non_negative_count,
    others_share,
    parse_with_quick,
    positive_count,
    proc_status_kib,
    reset_peak_rss,
)
from PIL import Image, features

from kdml.data.images import ImageFiles, load_image
from kdml.data.loaders import available_cores, batch_loader
from kdml.data.registry import open_dataset
from kdml.data.samplers import ShuffledBatches
from kdml.data.transforms import InputPipeline

CACHE_VERSION = "v1"  # bump when the generated images change
LONG_SIDE = 500
SHORT_SIDES = (281, 333, 375, 375, 375, 400, 500)  # 375 (4:3) the most common, as in CUB
# (cells across the long side, amplitude) of the smooth random fields summed into an image
OCTAVES = ((2, 90.0), (6, 50.0), (24, 25.0), (96, 14.0), (250, 20.0))
PIXEL_NOISE = 3.0
MMAP_VARIABLE, MMAP_THRESHOLD = "MALLOC_MMAP_THRESHOLD_", 1 << 20
QUIET_LOAD, RETRIES = 0.10, 2  # --wait-idle: others' CPU share that counts as disturbed


def memory_run(text: str) -> str:
    """An argparse type for a ``--memory-runs`` entry: loader workers, 0 or more, with an
    optional ``+mmap`` (a mistyped entry had failed in ``int()`` after the other sections)."""
    non_negative_count(text.removesuffix("+mmap"))
    return text


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(),
                                                        "kdml-data-pipeline-jpegs"),
                        help="folder of the generated JPEGs (reused between runs)")
    parser.add_argument("--classes", type=positive_count, default=50, help="class sub-folders")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--images", type=positive_count, default=1536,
                        help="images of the throughput and baseline passes")
    parser.add_argument("--workers", type=non_negative_count, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch-size", type=positive_count, default=64)
    parser.add_argument("--resize", type=positive_count, default=256)
    parser.add_argument("--crop", type=positive_count, default=224)
    parser.add_argument("--threads", type=positive_count, default=1,
                        help="torch threads of the main process in the timed passes")
    parser.add_argument("--repeats", type=positive_count, default=3,
                        help="rounds of every timed pass (interleaved); the best is reported")
    parser.add_argument("--memory-sizes", type=positive_count, nargs="+", default=[512, 1024,
                        2048, 4096])
    parser.add_argument("--memory-runs", nargs="+", type=memory_run,
                        default=["0", "2", "2+mmap"],
                        help="loader workers of the memory passes; '+mmap' runs that pass with "
                        f"{MMAP_VARIABLE}={MMAP_THRESHOLD} (glibc's allocator then returns "
                        "every block of 1 MiB or more to the system when it is freed)")
    parser.add_argument("--wait-idle", type=float, default=0.0,
                        help="before each timed pass, wait up to this many seconds for other "
                        "processes to use under 10%% of the CPU over 2 s, and run a pass "
                        "again (twice at most) when they used more than 10%% during it")
    parser.add_argument("--sections", nargs="+", choices=("baseline", "throughput", "memory"),
                        default=["baseline", "throughput", "memory"])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 128 images, 1 round, memory at N = 64 and 128 (as "
                        "defaults: options given too keep their values)")
    return parse_with_quick(parser, {
        "images": 128, "repeats": 1, "batch_size": 32, "workers": [0, 1],
        "memory_sizes": [64, 128], "memory_runs": ["0"]})


# --------------------------------------------------------------------------- the images


def photo_like(index: int, seed: int) -> Image.Image:
    """Image ``index``: smooth random fields at several scales plus mild pixel noise."""
    rng = np.random.default_rng([seed, index])
    short = int(rng.choice(SHORT_SIDES))
    width, height = (short, LONG_SIDE) if rng.random() < 0.25 else (LONG_SIDE, short)
    pixels = np.full((height, width, 3), 128.0, dtype=np.float32)
    for cells, amplitude in OCTAVES:
        grid = (max(2, cells * height // LONG_SIDE + 1), max(2, cells * width // LONG_SIDE + 1))
        brightness = rng.standard_normal((*grid, 1))
        colour = rng.standard_normal((*grid, 3))
        field = (0.8 * brightness + 0.6 * colour) * 32 + 128  # mostly shared across channels
        small = Image.fromarray(field.clip(0, 255).astype(np.uint8))
        smooth = np.asarray(small.resize((width, height), Image.Resampling.BICUBIC))
        pixels += (smooth.astype(np.float32) - 128) * (amplitude / 32)
    pixels += rng.normal(0.0, PIXEL_NOISE, pixels.shape).astype(np.float32)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def image_path(folder: Path, index: int, classes: int) -> Path:
    return folder / f"class{index % classes:03d}" / f"img{index:05d}.jpg"


def ensure_images(args: argparse.Namespace, count: int) -> Path:
    """The cache folder holding images 0..count-1 (generating the missing ones)."""
    folder = Path(args.cache).expanduser() / f"{CACHE_VERSION}-seed{args.seed}-c{args.classes}"
    missing = [i for i in range(count) if not image_path(folder, i, args.classes).is_file()]
    if missing:
        print(f"generating {len(missing)} JPEGs in {folder} ...", flush=True)
    for index in missing:
        path = image_path(folder, index, args.classes)
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        photo_like(index, args.seed).save(partial, "JPEG", quality=90)
        partial.replace(path)  # a run killed half-way leaves no truncated JPEG behind
    return folder


def first_images(folder: Path, count: int) -> ImageFiles:
    """The ``folder:DIR`` dataset of the cache, restricted to images 0..count-1."""
    dataset = open_dataset(f"folder:{folder}").dataset
    assert isinstance(dataset, ImageFiles)
    keep = [row for row, path in enumerate(dataset.paths)
            if int(Path(path).stem.removeprefix("img")) < count]
    return dataset.subset(torch.tensor(keep))


def read_all(paths: np.ndarray) -> int:
    """Read every file once (into the page cache); returns the total bytes."""
    return sum(len(Path(path).read_bytes()) for path in paths)


# --------------------------------------------------------------------------- measuring


def own_cpu_seconds() -> float:
    return cpu_seconds(resource.RUSAGE_SELF) + cpu_seconds(resource.RUSAGE_CHILDREN)


def wait_for_idle(limit: float) -> None:
    """Wait up to ``limit`` seconds for a 2-second window in which other processes used under
    ``QUIET_LOAD`` of the machine's CPU."""
    deadline = time.perf_counter() + limit
    while time.perf_counter() < deadline:
        machine, own = busy_cpu_seconds(), own_cpu_seconds()
        time.sleep(2.0)
        others = busy_cpu_seconds() - machine - (own_cpu_seconds() - own)
        if others < QUIET_LOAD * 2.0 * (os.cpu_count() or 1):
            return


def undisturbed(args: argparse.Namespace, run_pass: Callable[[], dict[str, Any]]
                ) -> dict[str, Any]:
    """``run_pass()``; with ``--wait-idle``, started on a quiet machine and run again (at most
    ``RETRIES`` times) while other processes used more than ``QUIET_LOAD`` of the CPU."""
    for attempt in range(RETRIES + 1 if args.wait_idle else 1):
        wait_for_idle(args.wait_idle)
        result = run_pass()
        result["attempts"] = attempt + 1
        if result["meter"].others_load <= QUIET_LOAD:
            break
    return result


class Meter:
    """Wall time, own CPU time (main process, reaped children) and others' load over a pass."""

    def __enter__(self) -> Meter:
        self.machine = busy_cpu_seconds()
        self.main_cpu = cpu_seconds(resource.RUSAGE_SELF)
        self.children_cpu = cpu_seconds(resource.RUSAGE_CHILDREN)
        self.start = time.perf_counter()
        return self

    def stop(self) -> None:
        """End of the timed work (the CPU time is read at ``__exit__``: reaped workers)."""
        self.seconds = time.perf_counter() - self.start

    def __exit__(self, *exc: object) -> None:
        if not hasattr(self, "seconds"):
            self.stop()
        elapsed = time.perf_counter() - self.start
        self.main_cpu = cpu_seconds(resource.RUSAGE_SELF) - self.main_cpu
        self.children_cpu = cpu_seconds(resource.RUSAGE_CHILDREN) - self.children_cpu
        self.cpu_seconds = self.main_cpu + self.children_cpu
        others = busy_cpu_seconds() - self.machine - self.cpu_seconds
        self.others_load = others_share(others, elapsed)


def child_pids() -> list[str]:
    """Live child processes of this process (the loader's workers), from /proc."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = stat.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        if parent == str(os.getpid()):
            children.append(entry)
    return children


# --------------------------------------------------------------------------- passes


def pillow_decode(path: str, size: int) -> Any:
    with Image.open(path) as image:
        return image.convert("RGB")


def pillow_resize(path: str, size: int, draft: bool = False) -> Any:
    with Image.open(path) as image:
        if draft:
            image.draft("RGB", (size, size))
        image = image.convert("RGB")
        width, height = image.size
        scale = size / min(width, height)
        return image.resize((max(size, round(width * scale)), max(size, round(height * scale))),
                            Image.Resampling.BILINEAR)


def pillow_square(path: str, size: int) -> Any:
    """Resize only the centred square of the short side (``resize``'s ``box``), with draft."""
    with Image.open(path) as image:
        image.draft("RGB", (size, size))
        image = image.convert("RGB")
        width, height = image.size
        side = min(width, height)
        left, top = (width - side) // 2, (height - side) // 2
        return image.resize((size, size), Image.Resampling.BILINEAR,
                            box=(left, top, left + side, top + side))


BASELINES: dict[str, tuple[str, Callable[[str, int], Any]]] = {
    "decode": ("Pillow decode only: open + convert(RGB)", pillow_decode),
    "resize": ("Pillow decode + resize short side, no draft (the target's loop)",
               pillow_resize),
    "draft": ("Pillow decode + resize short side, with draft",
              lambda path, size: pillow_resize(path, size, draft=True)),
    "square": ("Pillow decode + resize of the centre square only (resize's box), with draft",
               pillow_square),
    "load_image": ("kdml load_image (draft, resize, centre square, uint8 tensor)", load_image),
}


def baseline_pass(name: str, paths: np.ndarray, size: int) -> dict[str, Any]:
    function = BASELINES[name][1]
    with Meter() as meter:
        for path in paths:
            function(str(path), size)
    return {"images": len(paths), "meter": meter}


def augment_pass(args: argparse.Namespace, batch: torch.Tensor, batches: int) -> dict[str, Any]:
    """``InputPipeline.train`` alone on one decoded batch, ``batches`` times."""
    pipeline = InputPipeline(crop_size=args.crop)
    generator = torch.Generator().manual_seed(args.seed)
    with Meter() as meter:
        for _ in range(batches):
            pipeline.train(batch, generator)
    return {"images": batches * len(batch), "meter": meter}


def loader_pass(args: argparse.Namespace, dataset: ImageFiles, workers: int, augment: bool,
                epoch: int) -> dict[str, Any]:
    """One epoch of the training loader, each batch augmented in this process if ``augment``."""
    sampler = ShuffledBatches(len(dataset), args.batch_size, args.seed)
    sampler.set_epoch(epoch)
    pipeline = InputPipeline(crop_size=args.crop)
    generator = torch.Generator().manual_seed(args.seed + epoch)
    images, first_batch = 0, float("nan")
    with Meter() as meter:
        for batch in batch_loader(dataset, sampler, num_workers=workers):
            if images == 0:
                first_batch = time.perf_counter() - meter.start
            if augment:
                pipeline.train(batch.inputs, generator)
            images += len(batch.labels)
        meter.stop()  # the exhausted loader has joined its workers: their CPU time counts
    return {"images": images, "meter": meter, "first_batch": first_batch}


# --------------------------------------------------------------------------- memory


def memory_epoch(folder: str, count: int, workers: int, args: argparse.Namespace
                 ) -> dict[str, Any]:
    """Body of a fresh process: one epoch over ``count`` images, embeddings kept."""
    from kdml.models.backbones import SmallCNN

    torch.set_num_threads(available_cores())
    dataset = first_images(Path(folder), count).resized(args.resize)
    torch.manual_seed(args.seed)  # the model's initial weights, the same at every rerun
    model = SmallCNN(3, args.crop).eval()
    pipeline = InputPipeline(crop_size=args.crop)
    sampler = ShuffledBatches(len(dataset), args.batch_size, args.seed)
    generator = torch.Generator().manual_seed(args.seed)
    loader = batch_loader(dataset, sampler, num_workers=workers)
    peak_was_reset = reset_peak_rss()
    before_kib = proc_status_kib("VmRSS")
    worker_first: dict[str, int] = {}
    worker_peaks: dict[str, int] = {}
    embeddings = []
    start = time.perf_counter()
    with torch.no_grad():
        for step, batch in enumerate(loader):
            embeddings.append(model(pipeline.train(batch.inputs, generator)))
            # the workers' RSS once they have made a batch, and their peak at their last one
            if workers and (step == 0 or step >= len(sampler) - workers):
                for pid in child_pids():
                    with contextlib.suppress(OSError, RuntimeError):  # a worker just ended
                        worker_first.setdefault(pid, proc_status_kib("VmRSS", pid))
                        worker_peaks[pid] = proc_status_kib("VmHWM", pid)
    seconds = time.perf_counter() - start
    kept = torch.cat(embeddings)
    return {
        "n": count, "workers": workers, "images": len(kept), "seconds": seconds,
        "before_mib": before_kib / 1024, "peak_mib": proc_status_kib("VmHWM") / 1024,
        "embeddings_mib": kept.numel() * kept.element_size() / 2**20,
        "worker_first_mib": max(worker_first.values(), default=0) / 1024,
        "worker_peak_mib": max(worker_peaks.values(), default=0) / 1024,
        "peak_was_reset": peak_was_reset,
    }


def in_fresh_process(function: Callable[..., dict[str, Any]], *call_args: Any,
                     environment: dict[str, str] | None = None) -> dict[str, Any]:
    """``function(*call_args)`` in a new spawned interpreter, with extra ``environment``."""
    saved = {name: os.environ.get(name) for name in environment or {}}
    os.environ.update(environment or {})
    try:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
            return pool.submit(function, *call_args).result()
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


# --------------------------------------------------------------------------- report


def best_and_median(runs: list[dict[str, Any]]) -> tuple[dict[str, Any], float]:
    """The least disturbed run (fastest: others only ever add time) and the median rate."""
    best = min(runs, key=lambda run: run["meter"].seconds)
    return best, statistics.median(run["images"] / run["meter"].seconds for run in runs)


def baseline_section(args: argparse.Namespace, dataset: ImageFiles) -> None:
    paths = dataset.paths
    batch = dataset.__getitems__(list(range(min(args.batch_size, len(dataset))))).inputs
    augment_batches = max(1, len(paths) // len(batch))
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in [*BASELINES, "augment"]}
    for round_ in range(args.repeats):
        order = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
        for name in order:
            if name == "augment":
                result = undisturbed(args, partial(augment_pass, args, batch, augment_batches))
            else:
                result = undisturbed(args, partial(baseline_pass, name, paths, args.resize))
            runs[name].append(result)
            meter = result["meter"]
            print(f"  {name:<11} {result['images'] / meter.seconds:7.1f} images/s  "
                  f"others' load {meter.others_load:4.0%}  attempts {result['attempts']}",
                  flush=True)
    print()
    print(f"Plain loops in one process, {len(paths)} files (augmentation: {augment_batches} x "
          f"the same batch of {len(batch)}), torch threads {torch.get_num_threads()}; best of "
          f"{args.repeats} round(s).")
    print()
    print("| loop | images/s, best | median | ms per image (best) | images per CPU-second "
          "| others' load during best |")
    print("|---|---|---|---|---|---|")
    for name, results in runs.items():
        best, median = best_and_median(results)
        meter = best["meter"]
        label = (f"kdml InputPipeline.train alone ({args.resize} -> {args.crop}, random resized "
                 "crop + flip)" if name == "augment" else BASELINES[name][0])
        print(f"| {label} | {best['images'] / meter.seconds:.1f} | {median:.1f} "
              f"| {1000 * meter.seconds / best['images']:.2f} "
              f"| {best['images'] / meter.cpu_seconds:.1f} | {meter.others_load:.0%} |")
    print()


def throughput_section(args: argparse.Namespace, dataset: ImageFiles) -> None:
    cores = available_cores()
    configs = [(w, augment) for augment in (False, True) for w in args.workers]
    runs: dict[tuple[int, bool], list[dict[str, Any]]] = {config: [] for config in configs}
    for round_ in range(args.repeats):
        for workers, augment in configs if round_ % 2 == 0 else configs[::-1]:
            result = undisturbed(args, partial(loader_pass, args, dataset, workers, augment,
                                               epoch=round_))
            runs[workers, augment].append(result)
            meter = result["meter"]
            print(f"  workers {workers} augment {augment!s:<5} "
                  f"{result['images'] / meter.seconds:7.1f} images/s  cpu "
                  f"{meter.cpu_seconds:6.1f} s  others' load {meter.others_load:4.0%}  "
                  f"attempts {result['attempts']}", flush=True)
    print()
    print(f"One epoch of batch_loader(ImageFiles(resize={args.resize}), ShuffledBatches(batch "
          f"{args.batch_size})) over {len(dataset)} files; augmentation: "
          f"InputPipeline(crop_size={args.crop}).train in the main process, on the CPU; main "
          f"process torch threads {torch.get_num_threads()}; best of {args.repeats} round(s). "
          f"Processes = workers + 1 main with workers, 1 without; per process = images/s / "
          f"min(processes, {cores} cores).")
    print()
    print("| workers | augmentation | processes | images/s, best | median | images/s per "
          "process | images per CPU-second | CPU ms per image: main | workers "
          "| first batch (s) | others' load during best |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (workers, augment), results in runs.items():
        best, median = best_and_median(results)
        meter = best["meter"]
        processes = workers + 1 if workers else 1
        rate = best["images"] / meter.seconds
        worker_ms = f"{1000 * meter.children_cpu / best['images']:.2f}" if workers else "-"
        print(f"| {workers} | {'crop + flip' if augment else 'none'} | {processes} "
              f"| {rate:.1f} | {median:.1f} | {rate / min(processes, cores):.1f} "
              f"| {best['images'] / meter.cpu_seconds:.1f} "
              f"| {1000 * meter.main_cpu / best['images']:.2f} | {worker_ms} "
              f"| {best['first_batch']:.2f} | {meter.others_load:.0%} |")
    print()


def memory_section(args: argparse.Namespace, folder: Path) -> None:
    results = []
    for run in args.memory_runs:
        workers, mmap = int(run.removesuffix("+mmap")), run.endswith("+mmap")
        environment = {MMAP_VARIABLE: str(MMAP_THRESHOLD)} if mmap else {}
        for count in args.memory_sizes:
            result = in_fresh_process(memory_epoch, str(folder), count, workers, args,
                                      environment=environment)
            result["run"] = run
            results.append(result)
            print(f"  N {count:5d} run {run:<7} before {result['before_mib']:6.0f} MiB  peak "
                  f"{result['peak_mib']:6.0f} MiB  worker peak {result['worker_peak_mib']:5.0f}"
                  f" MiB  {result['seconds']:6.1f} s", flush=True)
    print()
    print(f"One epoch in a fresh spawned process: loader (batch {args.batch_size}, last partial "
          f"batch dropped), InputPipeline.train, SmallCNN(3, {args.crop}) forward without "
          f"gradients, embeddings kept; torch threads {available_cores()}. Allocator: glibc's "
          f"defaults, or '+mmap': {MMAP_VARIABLE}={MMAP_THRESHOLD}. RSS of the main process; "
          "growth = its peak minus its peak at the smallest N of the same run. Workers: the "
          "largest RSS of a worker after its first batch and its peak (a forked worker's RSS "
          "counts the pages it shares with the main process).")
    print()
    print("| N | workers | allocator | images seen | RSS before epoch (MiB) | peak RSS (MiB) "
          "| peak - before (MiB) | growth from smallest N (MiB) | embeddings kept (MiB) "
          "| worker RSS after 1st batch -> peak (MiB) | epoch (s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for result in results:
        first = next(r for r in results if r["run"] == result["run"])
        worker = (f"{result['worker_first_mib']:.0f} -> {result['worker_peak_mib']:.0f}"
                  if result["workers"] else "-")
        allocator = "+mmap" if result["run"].endswith("+mmap") else "default"
        print(f"| {result['n']} | {result['workers']} | {allocator} | {result['images']} "
              f"| {result['before_mib']:.0f} | {result['peak_mib']:.0f} "
              f"| {result['peak_mib'] - result['before_mib']:.0f} "
              f"| {result['peak_mib'] - first['peak_mib']:+.0f} "
              f"| {result['embeddings_mib']:.2f} | {worker} | {result['seconds']:.1f} |")
    if not all(result["peak_was_reset"] for result in results):
        print("\nnote: the peak RSS could not be reset; peaks include the set-up")
    print()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    needed = max([args.images] + (args.memory_sizes if "memory" in args.sections else []))
    folder = ensure_images(args, needed)
    dataset = first_images(folder, args.images).resized(args.resize)
    total_bytes = read_all(first_images(folder, needed).paths)
    sizes = [Image.open(path).size for path in dataset.paths]
    print(f"machine: {machine_description()}; {available_cores()} cores available")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (threads "
          f"{torch.get_num_threads()}, interop {torch.get_num_interop_threads()}), Pillow "
          f"{PIL.__version__} (libjpeg-turbo {features.version('libjpeg_turbo')}), numpy "
          f"{np.__version__}, load average at start {os.getloadavg()[0]:.2f}")
    print(f"images: {folder}, {needed} JPEGs (quality 90), {args.classes} classes, mean "
          f"{total_bytes / needed / 1024:.0f} KiB per file; throughput set {len(dataset)} files, "
          f"mean {np.mean([w for w, _ in sizes]):.0f} x {np.mean([h for _, h in sizes]):.0f} "
          f"pixels, {sum(w < h for w, h in sizes)} portrait")
    print()
    if "baseline" in args.sections:
        baseline_section(args, dataset)
    if "throughput" in args.sections:
        throughput_section(args, dataset)
    if "memory" in args.sections:
        memory_section(args, folder)


if __name__ == "__main__":
    main()
