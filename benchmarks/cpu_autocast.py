"""What mixed precision costs a command that reads a run on the CPU (``kdml eval``, ``embed``,
``search`` & co.).

A run trained in bf16 or fp16 on a GPU and read on a CPU would embed under CPU autocast, which
most CPUs (those without AVX512-BF16 or AMX) run far slower than float32; kdml reads such a run
in float32 there (:func:`kdml.precision.reading_precision`). This times what that saves: the
test split of ``--dataset`` embedded by a recipe's model (random weights: the time does not
depend on them) through kdml's own :class:`~kdml.evaluation.evaluator.Embedder`, once per
precision, ``--repeats`` times interleaved (best of them).

Usage::

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/cpu_autocast.py \
        --recipe jrd --dataset fashion-mnist --repeats 3
"""

from __future__ import annotations

import argparse
import time

import torch
from machine import machine_description

from kdml.config import resolve_config
from kdml.data.prepare import prepare_data
from kdml.evaluation.evaluator import embed_dataset
from kdml.training.build import build_embedder, build_method, build_pipeline
from kdml.training.recipes import get_recipe

PRECISIONS = ("fp32", "bf16", "fp16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="jrd")
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    recipe = get_recipe(args.recipe)
    config = resolve_config(recipe.name, recipe.params, recipe.defaults,
                            overrides=[f"data.dataset={args.dataset}", "train.device=cpu"])
    splits = prepare_data(config.data)
    method = build_method(config, splits, pretrained=False).eval()
    pipeline = build_pipeline(config, splits.train, method)
    device = torch.device("cpu")
    best = {precision: float("inf") for precision in PRECISIONS}
    for _ in range(args.repeats):
        for precision in PRECISIONS:
            embedder = build_embedder(config, pipeline, device, False, precision)
            start = time.perf_counter()
            embed_dataset(method, splits.test, embedder)
            best[precision] = min(best[precision], time.perf_counter() - start)
    print(f"{args.recipe} ({type(method.backbone).__name__} backbone) on {args.dataset}: "
          f"{len(splits.test):,} test samples, batches of {config.eval.embed_batch_size}, "
          f"{torch.get_num_threads()} threads; best of {args.repeats}")
    print(f"machine: {machine_description(device)}")
    print("| precision | seconds | samples/s | x float32's time |")
    print("|---|---|---|---|")
    for precision in PRECISIONS:
        seconds = best[precision]
        print(f"| {precision} | {seconds:.2f} | {len(splits.test) / seconds:,.0f} | "
              f"{seconds / best['fp32']:.1f} |")


if __name__ == "__main__":
    main()
