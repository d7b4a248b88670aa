"""Time and memory of retrieval evaluation at Stanford Online Products (SOP) test scale.

Synthetic SOP-shaped data (60,502 L2-normalized 512-d embeddings, 11,316 classes of 2..12
samples, class centre + noise), evaluated side by side by:

* ``kdml``        kdml.evaluation.retrieval_metrics, ks=(1, 10, 100), nmi=False
* ``knn_search``  kdml.evaluation.knn_search alone (k=100, self excluded), no metrics
* ``faiss``       bare faiss IndexFlatIP add + search of the top 101, one call
* ``torch_topk``  chunked torch matmul + topk of the top 101: the alternative k-NN backend
* ``nmi``         kdml's k-means NMI alone (11,316 clusters: slow)
* ``seeding``     its k-means++ seeding alone, of ``--seeding-centres`` centres (default
                  all: slow; a few hundred time its cost per centre)
* ``pml``         pytorch-metric-learning AccuracyCalculator(k="max_bin_count")

Each stage runs in a fresh spawned process that loads the embeddings from disk, then
resets the kernel's peak-RSS counter (``/proc/self/clear_refs``); the reported memory is
the peak RSS reached during the stage minus the RSS right before it, i.e. on top of
the loaded embeddings and imported libraries. Times are wall-clock seconds. The fast
stages repeat in rounds (faiss next to kdml, order reversed every other round) and the
CPU time other processes used meanwhile is reported, since a shared 2-core machine
makes single timings unreliable.

Usage::

    PYTHONPATH=src .venv/bin/python benchmarks/eval_scale.py --repeats 5   # docs/benchmarks.md
    PYTHONPATH=src .venv/bin/python benchmarks/eval_scale.py --num-samples 5000 \
        --num-classes 900 --skip-nmi --skip-pml --repeats 1                # quick smoke run
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import faiss
import numpy as np
import torch
from machine import machine_description  # sibling module: scripts run as benchmarks/NAME.py
from measure import (
    busy_cpu_seconds,
    cpu_seconds,
    non_negative_count,
    others_share,
    positive_count,
    proc_status_kib,
    refuse_too_few_points,
    reset_peak_rss,
)

from kdml.evaluation import knn_search, retrieval_metrics
from kdml.evaluation.clustering import (
    canonical_order,
    centred_float32,
    clustering_nmi,
    kmeans_plus_plus,
)

RETRIEVAL_KS = (1, 10, 100)
FAST_STAGES = ("faiss", "kdml", "knn_search", "torch_topk")  # repeated; nmi and pml run once
TOP_K = max(RETRIEVAL_KS) + 1  # what a leave-one-out Recall@100 must search for


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=positive_count, default=60502)
    parser.add_argument("--dim", type=positive_count, default=512)
    parser.add_argument("--num-classes", type=positive_count, default=11316)
    parser.add_argument("--min-class-size", type=positive_count, default=2)
    parser.add_argument("--max-class-size", type=positive_count, default=12)
    parser.add_argument(
        "--noise", type=float, default=2.25, help="noise norm relative to the class centre"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--chunk-size", type=positive_count, default=None, help="kdml chunk size")
    parser.add_argument("--torch-chunk-size", type=positive_count, default=1024)
    parser.add_argument("--repeats", type=positive_count, default=3, help="runs of each fast stage")
    parser.add_argument("--nmi-niter", type=positive_count, default=20, help="k-means iterations")
    parser.add_argument("--seeding-centres", type=non_negative_count, default=0,
                        help="centres the seeding stage draws (0: one per class)")
    parser.add_argument("--skip-nmi", action="store_true")
    parser.add_argument("--skip-pml", action="store_true")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument(
        "--stages",
        nargs="+",
        choices=list(STAGES),
        default=[name for name in STAGES if name != "seeding"],
        help="stages to run (default: all but seeding, which the nmi stage includes); faiss "
        "always runs, as the reference time",
    )
    args = parser.parse_args()
    refuse_too_few_points(parser, "--num-samples", args.num_samples, TOP_K,
                          "leave-one-out Recall@100")
    return args


# --------------------------------------------------------------------------- data


def sop_like_class_sizes(
    num_samples: int, num_classes: int, smallest: int, largest: int, rng: np.random.Generator
) -> np.ndarray:
    """Class sizes in [smallest, largest] summing to exactly num_samples, most classes small.

    Sizes are drawn from p(s) ~ exp(-rate * s), with the rate chosen by bisection so the
    mean is num_samples / num_classes; random classes are then grown or shrunk by one
    until the total is exact.
    """
    if not smallest * num_classes <= num_samples <= largest * num_classes:
        raise SystemExit("num-samples cannot be split into classes of the given sizes")
    sizes = np.arange(smallest, largest + 1)
    low, high = -5.0, 5.0
    for _ in range(100):
        rate = (low + high) / 2
        probabilities = np.exp(-rate * (sizes - smallest))
        probabilities /= probabilities.sum()
        if probabilities @ sizes > num_samples / num_classes:
            low = rate
        else:
            high = rate
    class_sizes = rng.choice(sizes, size=num_classes, p=probabilities)
    while (excess := int(class_sizes.sum()) - num_samples) != 0:
        can_move = class_sizes > smallest if excess > 0 else class_sizes < largest
        chosen = rng.choice(np.flatnonzero(can_move), size=min(abs(excess), can_move.sum()))
        np.add.at(class_sizes, chosen, -1 if excess > 0 else 1)
        class_sizes = np.clip(class_sizes, smallest, largest)
    return class_sizes


def make_embeddings(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Unit class centres plus Gaussian noise of relative norm ``args.noise``, normalized."""
    rng = np.random.default_rng(args.seed)
    class_sizes = sop_like_class_sizes(
        args.num_samples, args.num_classes, args.min_class_size, args.max_class_size, rng
    )
    labels = rng.permutation(np.repeat(np.arange(args.num_classes), class_sizes))
    centres = rng.standard_normal((args.num_classes, args.dim), dtype=np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    embeddings = rng.standard_normal((args.num_samples, args.dim), dtype=np.float32)
    embeddings *= args.noise / np.sqrt(args.dim)
    embeddings += centres[labels]
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    return embeddings, labels.astype(np.int64), class_sizes


# --------------------------------------------------------------------------- stages


def stage_kdml(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    chunk = {} if args.chunk_size is None else {"chunk_size": args.chunk_size}
    return retrieval_metrics(x, y, ks=RETRIEVAL_KS, metric="cosine", nmi=False, **chunk)


def stage_knn_search(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    chunk = {} if args.chunk_size is None else {"chunk_size": args.chunk_size}
    chunks = knn_search(x, k=TOP_K - 1, metric="cosine", exclude_self=True, **chunk)
    rows = sum(len(c.indices) for c in chunks)
    return {"rows": rows}


def stage_faiss(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    index = faiss.IndexFlatIP(x.shape[1])
    index.add(x)
    _, indices = index.search(x, TOP_K)
    return {"self_first": float((indices[:, 0] == np.arange(len(x))).mean())}


def stage_torch_topk(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    reference = torch.from_numpy(x)
    indices = torch.empty((len(x), TOP_K), dtype=torch.int64)
    for start in range(0, len(x), args.torch_chunk_size):
        similarities = reference[start : start + args.torch_chunk_size] @ reference.T
        indices[start : start + args.torch_chunk_size] = similarities.topk(TOP_K, dim=1).indices
    return {"self_first": float((indices[:, 0] == torch.arange(len(x))).double().mean())}


def stage_nmi(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    return {"nmi": clustering_nmi(x, y, metric="cosine", niter=args.nmi_niter)}


def stage_seeding(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    """The k-means++ seeding of the NMI stage's k-means, on the same centred rows in the same
    order (its cosine metric scales them to unit length first; these are unit rows already)."""
    centres = args.seeding_centres or len(np.unique(y))
    centred = centred_float32(x)
    ordered = np.ascontiguousarray(centred[canonical_order(centred, args.seed)])
    kmeans_plus_plus(ordered, centres, np.random.default_rng(args.seed))
    return {"centres": centres}


def stage_pml(x: np.ndarray, y: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    calculator = AccuracyCalculator(
        include=("precision_at_1", "mean_average_precision_at_r", "r_precision"),
        k="max_bin_count",
        device=torch.device("cpu"),
    )
    return calculator.get_accuracy(torch.from_numpy(x), torch.from_numpy(y))


STAGES: dict[str, tuple[str, Callable[..., dict[str, Any]]]] = {
    "kdml": ("kdml retrieval_metrics (ks=1,10,100, nmi=False)", stage_kdml),
    "knn_search": ("kdml knn_search alone (k=100, self excluded)", stage_knn_search),
    "faiss": (f"bare faiss IndexFlatIP add + search, k={TOP_K}", stage_faiss),
    "torch_topk": (f"torch matmul + topk, k={TOP_K}, chunks", stage_torch_topk),
    "nmi": ("kdml k-means NMI alone", stage_nmi),
    "seeding": ("kdml k-means++ seeding alone", stage_seeding),
    "pml": ('PML AccuracyCalculator(k="max_bin_count")', stage_pml),
}


# --------------------------------------------------------------------------- measuring


def run_stage(name: str, data_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    """Body of one fresh process: load the data, measure one stage.

    Besides time and memory, records how much CPU other processes used meanwhile, as a
    fraction of all cores: on a shared 2-core machine that flags a disturbed timing.
    """
    torch.set_num_threads(os.cpu_count() or 1)
    embeddings = np.load(Path(data_dir) / "embeddings.npy")
    labels = np.load(Path(data_dir) / "labels.npy")
    peak_was_reset = reset_peak_rss()
    baseline_kib = proc_status_kib("VmRSS")
    machine_cpu, process_cpu = busy_cpu_seconds(), cpu_seconds()
    start = time.perf_counter()
    summary = STAGES[name][1](embeddings, labels, args)
    seconds = time.perf_counter() - start
    peak_growth_kib = proc_status_kib("VmHWM") - baseline_kib
    stage_cpu = cpu_seconds() - process_cpu
    others_cpu = busy_cpu_seconds() - machine_cpu - stage_cpu
    return {
        "seconds": seconds,
        "cpu_seconds": stage_cpu,
        "others_load": others_share(others_cpu, seconds),
        "peak_mib": peak_growth_kib / 1024,
        "peak_was_reset": peak_was_reset,
        "summary": summary,
    }


def in_fresh_process(name: str, data_dir: str, args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(run_stage, name, data_dir, args).result()


# --------------------------------------------------------------------------- report


def print_table(results: dict[str, list[dict[str, Any]]]) -> None:
    """Markdown summary. Other processes only ever add time, so the best run of a stage is
    its least disturbed one; the per-round ratio compares each run with the bare faiss
    run next to it, which cancels slow drifts in machine speed."""
    best = {name: min(runs, key=lambda r: r["seconds"]) for name, runs in results.items()}
    print(
        "| stage | runs | best wall time (s) | median (s) | best / best bare faiss "
        "| median per-round ratio to bare faiss | CPU time of best (s) "
        "| peak RSS above data, max (MiB) | others' CPU load during best |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, runs in results.items():
        median = statistics.median(r["seconds"] for r in runs)
        peak = max(r["peak_mib"] for r in runs)
        paired = "-"  # single-run stages have no round
        if name in FAST_STAGES and len(runs) > 1:
            ratios = [
                r["seconds"] / f["seconds"] for r, f in zip(runs, results["faiss"], strict=True)
            ]
            paired = f"{statistics.median(ratios):.2f}"
        print(
            f"| {STAGES[name][0]} | {len(runs)} | {best[name]['seconds']:.1f} | {median:.1f} "
            f"| {best[name]['seconds'] / best['faiss']['seconds']:.2f} | {paired} "
            f"| {best[name]['cpu_seconds']:.1f} | {peak:.0f} | {best[name]['others_load']:.0%} |"
        )


def main() -> None:
    args = parse_args()
    skipped = {"torch_topk": args.skip_torch, "nmi": args.skip_nmi, "pml": args.skip_pml}
    chosen = [name for name in STAGES if name in args.stages + ["faiss"] and not skipped.get(name)]
    # Fast stages run in rounds, faiss next to kdml and the order reversed every other
    # round, so that drifting machine load hits them alike; slow stages run once.
    fast = [name for name in FAST_STAGES if name in chosen]
    slow = [name for name in ("nmi", "seeding", "pml") if name in chosen]
    rounds = [fast if r % 2 == 0 else fast[::-1] for r in range(args.repeats)]

    embeddings, labels, class_sizes = make_embeddings(args)
    print(f"machine: {machine_description()}")
    print(
        f"threads: faiss OpenMP {faiss.omp_get_max_threads()}, torch {torch.get_num_threads()}; "
        f"faiss {faiss.__version__}, torch {torch.__version__}, numpy {np.__version__}"
    )
    sizes_histogram = {
        int(s): int(c) for s, c in zip(*np.unique(class_sizes, return_counts=True), strict=True)
    }
    print(
        f"data: {len(embeddings)} x {embeddings.shape[1]} float32 "
        f"({embeddings.nbytes / 2**20:.0f} MiB), {len(class_sizes)} classes, "
        f"class size -> count {sizes_histogram}, noise {args.noise}"
    )

    results: dict[str, list[dict[str, Any]]] = {name: [] for name in fast + slow}
    with tempfile.TemporaryDirectory() as data_dir:
        np.save(Path(data_dir) / "embeddings.npy", embeddings)
        np.save(Path(data_dir) / "labels.npy", labels)
        del embeddings
        for name in [name for round_ in rounds for name in round_] + slow:
            result = in_fresh_process(name, data_dir, args)
            results[name].append(result)
            print(
                f"  {name:<11} {result['seconds']:8.2f} s  cpu {result['cpu_seconds']:7.1f} s  "
                f"{result['peak_mib']:6.0f} MiB  others' load {result['others_load']:4.0%}  "
                f"{result['summary']}",
                flush=True,
            )

    if not all(r["peak_was_reset"] for runs in results.values() for r in runs):
        print("note: peak RSS could not be reset; peaks include the data loading")
    print()
    print_table(results)
    print()
    for name, label in (("kdml", "kdml metrics"), ("nmi", "kdml NMI"), ("pml", "PML metrics")):
        if name in results:
            print(f"{label}: {results[name][0]['summary']}")


if __name__ == "__main__":
    main()
