"""What mixed precision costs on a CPU: embedding test data, and training steps.

A run in bf16 or fp16 would embed its test data on a CPU (training's scoring, kdml eval & co.)
under CPU autocast, which most CPUs (those without AVX512-BF16 or AMX) run far slower than
float32; kdml embeds in float32 there (:func:`kdml.precision.embedding_precision`), and
training in them on such a CPU warns. This times both, once per precision, ``--repeats``
times interleaved (best of them), with the recipe's model at random weights (the time does
not depend on them):

- embedding: the test split of ``--dataset`` through kdml's own
  :class:`~kdml.evaluation.evaluator.Embedder`;
- training: ``--steps`` training steps (forward under autocast, backward, Adam) of the recipe
  on one batch of the training split (``data.batch_size``), as ``recipe_step.py`` builds them.

Usage::

    PYTHONPATH=src:benchmarks .venv/bin/python benchmarks/cpu_autocast.py \
        --recipe jrd --dataset fashion-mnist --repeats 3 [key=value ...]
"""

from __future__ import annotations

import argparse
import time

import torch
from machine import machine_description
from measure import one_line_kdml_errors, positive_count
from recipe_step import training_step

from kdml.config import resolve_config
from kdml.data.prepare import prepare_data
from kdml.evaluation.evaluator import embed_dataset
from kdml.models.backbones import build_backbone
from kdml.training.build import build_embedder, build_method, build_pipeline, model_input_shape
from kdml.training.recipes import get_recipe

PRECISIONS = ("fp32", "bf16", "fp16")


@one_line_kdml_errors
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="jrd")
    parser.add_argument("--dataset", default="mnist5k")
    parser.add_argument("--repeats", type=positive_count, default=3)
    parser.add_argument("--steps", type=positive_count, default=5)
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="config overrides, e.g. model.backbone=bninception")
    args = parser.parse_args()

    recipe = get_recipe(args.recipe)
    config = resolve_config(recipe.name, recipe.params, recipe.defaults,
                            overrides=[f"data.dataset={args.dataset}", "train.device=cpu",
                                       *args.overrides])
    splits = prepare_data(config.data)
    torch.manual_seed(0)  # the embedding model's initial weights, the same at every rerun
    method = build_method(config, splits, pretrained=False).eval()
    pipeline = build_pipeline(config, splits.train, method)
    device = torch.device("cpu")
    embed_best = {precision: float("inf") for precision in PRECISIONS}
    step_best = dict(embed_best)
    drawn = torch.randperm(len(splits.train), generator=torch.Generator().manual_seed(0))
    batch = splits.train.subset(drawn[:config.data.batch_size])  # of several classes
    images = pipeline.test(torch.stack([batch.load(i) for i in range(len(batch))]))
    labels = batch.labels.clone()
    for _ in range(args.repeats):
        for precision in PRECISIONS:
            embedder = build_embedder(config, pipeline, device, False, precision)
            start = time.perf_counter()
            embed_dataset(method, splits.test, embedder)
            embed_best[precision] = min(embed_best[precision], time.perf_counter() - start)
            torch.manual_seed(0)
            backbone = build_backbone(config.model.backbone,
                                      model_input_shape(config, splits.train))
            # the overrides reach the timed step's model too (it had the recipe's defaults)
            step = training_step(args.recipe, backbone, images, labels,
                                 len(splits.train_classes), overrides=args.overrides,
                                 precision=precision)
            step()  # Adam's state is made here
            start = time.perf_counter()
            for _ in range(args.steps):
                step()
            step_best[precision] = min(step_best[precision],
                                       (time.perf_counter() - start) / args.steps)
    print(f"{args.recipe} ({type(method.backbone).__name__} backbone) on {args.dataset}: "
          f"{len(splits.test):,} test samples embedded in batches of "
          f"{config.eval.embed_batch_size}; training steps on batches of {len(images)}; "
          f"{torch.get_num_threads()} threads; best of {args.repeats}")
    print(f"machine: {machine_description(device)}")
    print("| precision | embedding (s) | x float32's | training step (ms) | x float32's |")
    print("|---|---|---|---|---|")
    for precision in PRECISIONS:
        print(f"| {precision} | {embed_best[precision]:.2f} | "
              f"{embed_best[precision] / embed_best['fp32']:.1f} | "
              f"{step_best[precision] * 1000:.0f} | "
              f"{step_best[precision] / step_best['fp32']:.1f} |")


if __name__ == "__main__":
    main()
