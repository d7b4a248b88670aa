"""Training throughput at paper scale, and exact evaluation at SOP scale, on a GPU.

Section ``train``: images per second and peak GPU memory of one optimisation step (forward,
backward, Adam) on synthetic 224-pixel images, batch 100, embedding 512, for

- ``backbone``: the bare backbone with a linear classifier (the floor);
- ``amsoftmax`` and ``jrd``: kdml's recipes as the trainer builds them,

in fp32 and bf16 (autocast), optionally channels_last. The three are timed in interleaved
rounds and compared round by round (``--rounds``). Targets: JRD within 5% of AM-Softmax,
AM-Softmax within 5% of the bare backbone.

Section ``eval``: ``retrieval_metrics`` (Recall@1/10/100, MAP@R, R-Precision) on 60,502 x 512
embeddings on the GPU against the bare chunked matmul + topk of the same k. Target: 0.5 s on
an H100, within 4x of the bare search.

Section ``profile``: ``torch.profiler`` over a few ``amsoftmax`` and ``jrd`` steps (the first
of ``--precisions``): the operators with the most device time, and the host-device
synchronisations and copies per step (``cudaStreamSynchronize``, ``cudaMemcpy*``), which is
where a per-step overhead on a GPU hides; counted inside the steps' own span, so that the
``cudaDeviceSynchronize`` this script and the profiler make after the steps are not theirs.

Needs no data and no weights. Run on a GPU machine:

    PYTHONPATH=src python benchmarks/train_throughput.py --backbone bninception
    PYTHONPATH=src python benchmarks/train_throughput.py --backbone timm:resnet50

``--quick`` runs tiny sizes on any device (a smoke test, not a measurement).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from machine import machine_description
from measure import non_negative_count, parse_with_quick, positive_count
from recipe_step import BARE_BACKBONE, training_step
from torch.autograd import DeviceType

from kdml.evaluation import retrieval_metrics
from kdml.models.backbones import build_backbone


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step: Callable[[], None], device: torch.device, warmup: int, repeats: int) -> float:
    """Median seconds of ``step`` after ``warmup`` calls."""
    for _ in range(warmup):
        step()
    synchronize(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def recipe_step(name: str, args: argparse.Namespace, device: torch.device,
                precision: str) -> Callable[[], None]:
    """One training step of a kdml recipe (``backbone``: the bare backbone + a classifier) on
    synthetic images."""
    generator = torch.Generator(device=device).manual_seed(0)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device, generator=generator)
    labels = torch.arange(args.batch, device=device) % args.classes
    if args.channels_last:
        images = images.contiguous(memory_format=torch.channels_last)
    torch.manual_seed(0)  # the initial weights, the same at every rerun
    return training_step(name, build_backbone(args.backbone, (3, args.size, args.size)), images,
                         labels, args.classes, [f"model.embedding_size={args.embedding}"],
                         precision, args.channels_last, args.compile)


STEPS = (BARE_BACKBONE, "amsoftmax", "jrd")
BASELINE = {"amsoftmax": BARE_BACKBONE, "jrd": "amsoftmax"}


def train_section(args: argparse.Namespace, device: torch.device) -> None:
    """The three steps are built side by side and timed in ``--rounds`` interleaved rounds
    (order rotated each round), so that a drift of the machine's speed, which on a host-bound
    step is several percent between runs, hits them alike; each comparison is the median of
    its per-round ratios, with their range."""
    print(f"\n### Training step: {args.backbone}, {args.size} px, batch {args.batch}, "
          f"embedding {args.embedding}, {args.classes} classes, channels_last "
          f"{args.channels_last}, torch.compile {args.compile}, {args.rounds} rounds of "
          f"{args.repeats} steps\n")
    print("| step | precision | ms / step | images / s | peak GPU memory (GiB) | vs | "
          "range over rounds |")
    print("|---|---|---|---|---|---|---|")
    for precision in args.precisions:
        steps, peaks = {}, {}
        for name in STEPS:  # built and warmed one at a time: each peak is its own
            before = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            steps[name] = recipe_step(name, args, device, precision)
            for _ in range(args.warmup):
                steps[name]()
            synchronize(device)
            # a device without GPU memory has none to report: '-', not 'nan'
            peaks[name] = (f"{(torch.cuda.max_memory_allocated(device) - before) / 2**30:.2f}"
                           if device.type == "cuda" else "-")
        rounds: dict[str, list[float]] = {name: [] for name in STEPS}
        for index in range(args.rounds):
            for name in STEPS[index % 3:] + STEPS[:index % 3]:
                rounds[name].append(timed(steps[name], device, 1, args.repeats))
        for name in STEPS:
            seconds = statistics.median(rounds[name])
            versus = spread = ""
            if name in BASELINE:
                ratios = [mine / base - 1 for mine, base in
                          zip(rounds[name], rounds[BASELINE[name]], strict=True)]
                versus = f"{100 * statistics.median(ratios):+.1f}% vs {BASELINE[name]}"
                spread = f"{100 * min(ratios):+.1f}% to {100 * max(ratios):+.1f}%"
            print(f"| {name} | {precision} | {1000 * seconds:.1f} | "
                  f"{args.batch / seconds:,.0f} | {peaks[name]} | {versus} | {spread} |")
        del steps


def eval_section(args: argparse.Namespace, device: torch.device) -> None:
    rng = np.random.default_rng(0)
    sizes = rng.integers(2, 13, args.eval_classes)
    labels = np.repeat(np.arange(args.eval_classes), sizes)[:args.eval_points]
    centres = rng.standard_normal((args.eval_classes, args.eval_dim)).astype(np.float32)
    points = centres[labels] + 2.25 * rng.standard_normal((len(labels), args.eval_dim),
                                                          dtype=np.float32)
    embeddings = torch.nn.functional.normalize(torch.from_numpy(points).to(device), dim=1)
    k = 101

    def bare() -> None:
        for start in range(0, len(embeddings), 4096):
            (embeddings[start:start + 4096] @ embeddings.T).topk(k, dim=1)

    def kdml() -> None:
        retrieval_metrics(embeddings, labels, ks=(1, 10, 100), nmi=False, backend="torch")

    bare_seconds = timed(bare, device, 1, args.repeats)
    kdml_seconds = timed(kdml, device, 1, args.repeats)
    print(f"\n### Exact evaluation, {len(labels):,} x {args.eval_dim} embeddings on {device}\n")
    print("| stage | median s | vs bare |")
    print("|---|---|---|")
    print(f"| bare chunked matmul + topk (k={k}) | {bare_seconds:.3f} | 1.00x |")
    print(f"| kdml retrieval_metrics (R@1/10/100, MAP@R, R-Prec.) | {kdml_seconds:.3f} | "
          f"{kdml_seconds / bare_seconds:.2f}x |")


# the profiled steps' own span: what the benchmark and the profiler add after it is not theirs
STEPS_LABEL = "train_throughput.steps"


def runtime_calls_per_step(events: Sequence[Any], steps: int) -> dict[str, float]:
    """Host-side synchronisations and copies (``cudaStreamSynchronize``, ``cudaMemcpyAsync``,
    ...) per step, among the profiler's ``events`` that lie inside the :data:`STEPS_LABEL`
    span. The ``cudaDeviceSynchronize`` of this script's ``synchronize`` and of the profiler's
    own exit had been counted as the steps': 2 over 5 steps read as 0.4 per step. The device
    side's ``Memcpy`` activities, which had counted each copy a second time, are left out."""
    # the host's span: a CUDA trace also holds the span's GPU annotation, of the same name;
    # a trace without the span (not seen) counts every event rather than end the one GPU call
    window = next((event.time_range for event in events
                   if event.name == STEPS_LABEL and event.device_type == DeviceType.CPU), None)
    counts = Counter(event.name for event in events
                     if ("Synchronize" in event.name or "Memcpy" in event.name)
                     and event.device_type == DeviceType.CPU
                     and (window is None or (window.start <= event.time_range.start
                                             and event.time_range.end <= window.end)))
    return {name: count / steps for name, count in sorted(counts.items())}


def profile_section(args: argparse.Namespace, device: torch.device) -> None:
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    precision = args.precisions[0]
    steps = max(args.repeats // 4, 2)
    sort_key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    for name in ("amsoftmax", "jrd"):
        step = recipe_step(name, args, device, precision)
        for _ in range(args.warmup):
            step()
        synchronize(device)
        with profile(activities=activities) as profiler:
            with record_function(STEPS_LABEL):
                for _ in range(steps):
                    step()
            synchronize(device)
        events = profiler.key_averages()
        host_syncs = runtime_calls_per_step(profiler.events(), steps)
        print(f"\n### Profile: {name}, {precision}, {steps} steps\n")
        print("host-device synchronisations and copies per step (CUDA runtime calls): "
              + (", ".join(f"{key} {count:g}" for key, count in sorted(host_syncs.items()))
                 or "none"))
        print("\n```")
        print(events.table(sort_by=sort_key, row_limit=args.profile_rows, max_name_column_width=48))
        print("```")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sections", nargs="+", default=["train", "eval"],
                        choices=("train", "eval", "profile"))
    parser.add_argument("--backbone", default="bninception")
    parser.add_argument("--size", type=positive_count, default=224)
    parser.add_argument("--batch", type=positive_count, default=100)
    parser.add_argument("--embedding", type=positive_count, default=512)
    parser.add_argument("--classes", type=positive_count, default=100)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"],
                        choices=("fp32", "bf16", "fp16"))
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--warmup", type=non_negative_count, default=5)
    parser.add_argument("--repeats", type=positive_count, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=positive_count, default=5,
                        help="train section: interleaved rounds of the three steps")
    parser.add_argument("--eval-points", type=positive_count, default=60502)
    # sizes of 2-12 drawn for this many classes, cut at --eval-points: 8,665 classes at the
    # defaults (uniform sizes, not SOP's mostly small ones)
    parser.add_argument("--eval-classes", type=positive_count, default=11316)
    parser.add_argument("--eval-dim", type=positive_count, default=512)
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each step's forward (its backward follows); the "
                             "compilation happens in the warm-up steps")
    parser.add_argument("--profile-rows", type=non_negative_count, default=15,
                        help="profile section: operators listed per recipe")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes: a smoke test (as defaults: options given too keep "
                        "their values)")
    return parse_with_quick(parser, {
        "size": 32, "batch": 8, "embedding": 16, "classes": 4, "warmup": 1, "repeats": 2,
        "rounds": 2, "eval_points": 2000, "eval_classes": 400, "eval_dim": 32})


def main() -> None:
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU"
    print(f"{machine_description()}; device {device} ({name}); torch {torch.__version__}")
    if "train" in args.sections:
        train_section(args, device)
    if "eval" in args.sections:
        eval_section(args, device)
    if "profile" in args.sections:
        profile_section(args, device)


if __name__ == "__main__":
    main()
