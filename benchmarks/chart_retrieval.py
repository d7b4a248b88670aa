"""Time and memory of Atlas chart retrieval (manifold distance, argmax charts).

Synthetic compressed codes with class structure: C classes with SOP-like sizes (2 to 12
images, mean N / C), each class has a home chart (uniform over the n charts) and a centre
N(0, 2^2 I_d) in pre-sigmoid coordinates; an image lands in its class's home chart with
probability 0.8 (otherwise in a random chart) at centre + N(0, I_d). So classes are split
over charts and charts mix classes, as with a trained model.

Stages, each in a fresh Python process:

* ``chart``    kdml.evaluation.charts.chart_retrieval_metrics (nmi=False): one chunked exact
               faiss search per chart, never an N x N array.
* ``dense``    the direct formulation of Eq. 7 with one-hot memberships: the [n, N, N] tensor
               of chart-wise distances (torch.cdist, float32, weighted in place), summed over
               charts, then top-k per row; same metric definitions (neighbours at +inf miss).
* ``baseline`` imports and data loading only, subtracted from the others' peaks.

Memory is each process's peak RSS (``ru_maxrss``) minus that of the baseline process, i.e.
what the stage adds on top of the imported libraries and the loaded codes. Times are wall
seconds of the stage alone (median of ``--repeats`` fresh processes).

Usage::

    .venv/bin/python benchmarks/chart_retrieval.py              # SOP size + CUB-size comparison
    .venv/bin/python benchmarks/chart_retrieval.py --num-samples 5000 --num-classes 900 \\
        --repeats 1 --skip-dense                                # quick smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from machine import machine_description  # sibling module: scripts run as benchmarks/NAME.py
from measure import positive_count, refuse_too_few_points

SOP_KS = (1, 10, 100)
CUB_KS = (1, 2, 4, 8)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-samples", type=positive_count, default=60502, help="SOP test size")
    parser.add_argument("--num-classes", type=positive_count, default=11316,
                        help="SOP test classes")
    parser.add_argument("--dense-samples", type=positive_count, default=5924, help="CUB test size")
    parser.add_argument("--dense-classes", type=positive_count, default=100,
                        help="CUB test classes")
    parser.add_argument("--n-charts", type=positive_count, default=32)
    parser.add_argument("--dim", type=positive_count, default=8)
    parser.add_argument("--home-chart-probability", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=positive_count, default=3,
                        help="fresh runs of the chart stages")
    parser.add_argument("--skip-dense", action="store_true")
    # internal: run one stage in this process and print its measurements as JSON
    parser.add_argument("--stage", choices=("baseline", "chart", "dense"), help=argparse.SUPPRESS)
    parser.add_argument("--data", help=argparse.SUPPRESS)
    parser.add_argument("--ks", type=int, nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.stage is None:  # a stage's process gets the sizes already checked
        refuse_too_few_points(parser, "--num-samples", args.num_samples, max(SOP_KS) + 1,
                              f"leave-one-out Recall@{max(SOP_KS)}")
        refuse_too_few_points(parser, "--dense-samples", args.dense_samples, max(CUB_KS) + 1,
                              f"leave-one-out Recall@{max(CUB_KS)}")
    return args


# --------------------------------------------------------------------------- data


def class_sizes(num_samples: int, num_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Sizes in [2, 12] summing to num_samples: uniform draws around the mean, then random
    +-1 corrections of classes that stay in range."""
    mean = num_samples / num_classes
    if not 2 <= mean <= 12:
        raise SystemExit("num-samples / num-classes must lie in [2, 12]")
    spread = min(mean - 2, 12 - mean, 3.0)
    sizes = np.rint(rng.uniform(mean - spread, mean + spread, num_classes)).astype(np.int64)
    while (excess := int(sizes.sum()) - num_samples) != 0:
        movable = np.flatnonzero(sizes > 2 if excess > 0 else sizes < 12)
        chosen = rng.choice(movable, size=min(abs(excess), len(movable)), replace=False)
        sizes[chosen] -= int(np.sign(excess))
    return sizes


def make_codes(num_samples: int, num_classes: int, args: argparse.Namespace) -> dict[str, Any]:
    """Compressed codes (argmax-chart coordinates, chart index) and labels, plus the full
    per-chart coordinates the dense formulation needs (random where a point has no mass)."""
    rng = np.random.default_rng(args.seed)
    if num_samples / num_classes > 12:  # CUB-like: classes of ~60, no SOP size limits
        sizes = np.full(num_classes, num_samples // num_classes)
        sizes[: num_samples - sizes.sum()] += 1
    else:
        sizes = class_sizes(num_samples, num_classes, rng)
    labels = rng.permutation(np.repeat(np.arange(num_classes), sizes))
    home = rng.integers(0, args.n_charts, num_classes)
    at_home = rng.random(num_samples) < args.home_chart_probability
    charts = np.where(at_home, home[labels], rng.integers(0, args.n_charts, num_samples))
    centres = 2.0 * rng.standard_normal((num_classes, args.dim))
    codes = (centres[labels] + rng.standard_normal((num_samples, args.dim))).astype(np.float32)
    return {"codes": codes, "charts": charts.astype(np.int64), "labels": labels.astype(np.int64)}


# --------------------------------------------------------------------------- stages


def dense_metrics(codes: np.ndarray, charts: np.ndarray, labels: np.ndarray, n_charts: int,
                  ks: tuple[int, ...], seed: int) -> dict[str, float]:
    """Eq. 7 on the full representation: [n, N, N] distances, weighted by one-hot q."""
    import torch

    num_points, dim = codes.shape
    rng = np.random.default_rng(seed + 1)
    full = rng.standard_normal((num_points, n_charts, dim)).astype(np.float32)
    full[np.arange(num_points), charts] = codes
    coords = torch.from_numpy(full).transpose(0, 1).contiguous()  # [n, N, d]
    q = torch.nn.functional.one_hot(torch.from_numpy(charts), n_charts).float().T  # [n, N]
    distances = torch.cdist(coords, coords)  # [n, N, N]: the tensor this formulation needs
    distances.mul_(q[:, :, None]).mul_(q[:, None, :])
    numerator = distances.sum(dim=0)
    del distances
    denominator = q.T @ q
    manifold = torch.where(denominator > 0, numerator / denominator.clamp_min(1e-30), torch.inf)
    manifold.fill_diagonal_(torch.inf)  # leave-one-out: the query is never its own neighbour

    label_tensor = torch.from_numpy(labels)
    same = label_tensor[:, None] == label_tensor[None, :]
    num_relevant = same.sum(dim=1) - 1
    width = int(max(max(ks), int(num_relevant.max())))
    order = manifold.topk(width, dim=1, largest=False)
    hits = same.gather(1, order.indices) & torch.isfinite(order.values)
    counted = num_relevant > 0
    results = {f"recall@{k}": float(hits[:, :k].any(dim=1)[counted].double().mean()) for k in ks}
    ranks = torch.arange(1, width + 1)
    relevant = hits & (ranks[None, :] <= num_relevant[:, None])
    cumulative = relevant.cumsum(dim=1).double()
    r = num_relevant.clamp_min(1).double()
    average_precision = ((cumulative / ranks) * relevant).sum(dim=1) / r
    results["map@r"] = float(average_precision[counted].mean())
    results["r_precision"] = float((cumulative[:, -1] / r)[counted].mean())
    return results


def run_stage(args: argparse.Namespace) -> dict[str, Any]:
    """Body of a child process: import, load, then time one stage."""
    import torch

    from kdml.evaluation.charts import chart_retrieval_metrics

    torch.set_num_threads(os.cpu_count() or 1)
    data = np.load(args.data)
    codes, charts, labels = data["codes"], data["charts"], data["labels"]
    ks = tuple(args.ks)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    if args.stage == "chart":
        summary = chart_retrieval_metrics(codes, charts, labels, ks=ks, nmi=False)
    elif args.stage == "dense":
        summary = dense_metrics(codes, charts, labels, args.n_charts, ks, args.seed)
    else:
        summary = {}
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"seconds": seconds, "peak_mib": peak_kib / 1024, "load": load_before,
            "summary": summary}


def in_fresh_process(stage: str, data: Path, ks: tuple[int, ...],
                     args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--stage", stage, "--data", str(data),
               "--n-charts", str(args.n_charts), "--seed", str(args.seed),
               "--ks", *map(str, ks)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"stage {stage} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- report


def available_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) / 1024


def measure(name: str, stage: str, data: Path, ks: tuple[int, ...], repeats: int,
            args: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    baseline = in_fresh_process("baseline", data, ks, args)
    runs = [in_fresh_process(stage, data, ks, args) for _ in range(repeats)]
    times = [run["seconds"] for run in runs]
    row = {
        "name": name,
        "median": statistics.median(times),
        "spread": (min(times), max(times)),
        "peak_above_baseline": max(run["peak_mib"] for run in runs) - baseline["peak_mib"],
        "peak_total": max(run["peak_mib"] for run in runs),
        "load": max(run["load"] for run in runs),
        "summary": runs[0]["summary"],
    }
    rows.append(row)
    print(f"  {name}: {row['median']:.2f} s, +{row['peak_above_baseline']:.0f} MiB "
          f"(process peak {row['peak_total']:.0f} MiB), load {row['load']:.1f}", flush=True)
    return row


def main() -> None:
    args = parse_args()
    if args.stage is not None:
        print(json.dumps(run_stage(args)))
        return
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"machine: {machine_description()}")
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        sop = Path(folder) / "sop.npz"
        cub = Path(folder) / "cub.npz"
        np.savez(sop, **make_codes(args.num_samples, args.num_classes, args))
        np.savez(cub, **make_codes(args.dense_samples, args.dense_classes, args))
        print(f"data: N = {args.num_samples} ({args.num_classes} classes) and "
              f"N = {args.dense_samples} ({args.dense_classes} classes), n = {args.n_charts} "
              f"charts, d = {args.dim}")
        measure(f"chart, N={args.num_samples}, ks={SOP_KS}", "chart", sop, SOP_KS,
                args.repeats, args, rows)
        chart_cub = measure(f"chart, N={args.dense_samples}, ks={CUB_KS}", "chart", cub, CUB_KS,
                            args.repeats, args, rows)
        dense_bytes = 4 * args.n_charts * args.dense_samples**2
        if args.skip_dense:
            print("  dense: skipped (--skip-dense)")
        elif 1.5 * dense_bytes / 2**20 > 0.8 * available_mib():  # the tensor and temporaries
            print(f"  dense: skipped, its [n, N, N] tensor needs {dense_bytes / 2**30:.1f} GiB "
                  f"and only {available_mib() / 1024:.1f} GiB are available")
        else:
            dense = measure(f"dense [n, N, N], N={args.dense_samples}, ks={CUB_KS}", "dense",
                            cub, CUB_KS, 1, args, rows)
            gaps = [abs(dense["summary"][key] - value)
                    for key, value in chart_cub["summary"].items()]
            print(f"  chart vs dense metrics: largest difference {max(gaps):.2e}")
    print()
    print("| stage | wall time (s), median [min-max] | peak RSS above baseline (MiB) "
          "| process peak RSS (MiB) | load average |")
    print("|---|---|---|---|---|")
    for row in rows:
        low, high = row["spread"]
        spread = f" [{low:.2f}-{high:.2f}]" if high > low else ""
        print(f"| {row['name']} | {row['median']:.2f}{spread} | {row['peak_above_baseline']:.0f} "
              f"| {row['peak_total']:.0f} | {row['load']:.1f} |")
    print()
    for row in rows:
        metrics = ", ".join(f"{key} {value:.4f}" for key, value in row["summary"].items())
        print(f"{row['name']}: {metrics}")


if __name__ == "__main__":
    main()
