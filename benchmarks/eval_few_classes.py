"""Exact search with a large k on the CPU: faiss's heap against whole score rows and
``torch.topk`` (the rule ``kdml.evaluation.knn.uses_full_rows`` chooses between them).

MAP@R needs each query's R nearest neighbours, R being its class size: on a test split of a
few large classes (Fashion-MNIST's class-disjoint split: 35,000 images in 5 classes) that is
k = 7,000 of 35,000. Part 1 times one chunk of 4,096 queries (d = 64, L2-normalised) for each
``--sizes`` x ``--ks`` pair, both ways, alternating which goes first; part 2 times the whole
``retrieval_metrics`` on ``--points`` spread embeddings in 5 classes, with the rule as it is
and with faiss forced.

    PYTHONPATH=src .venv/bin/python benchmarks/eval_few_classes.py
"""

from __future__ import annotations

import argparse
import functools
import time

import faiss
import numpy as np
import torch
from machine import machine_description
from measure import non_negative_count, positive_count, refuse_too_few_points

import kdml.evaluation.knn as knn
import kdml.evaluation.retrieval as retrieval
from kdml.evaluation import retrieval_metrics


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=positive_count, nargs="*", default=[10000, 35000, 60000],
                        help="part 1; none skips it")
    parser.add_argument("--ks", type=positive_count, nargs="+", default=[256, 1024, 2048, 4096,
                        7001])
    parser.add_argument("--repeats", type=positive_count, default=2)
    parser.add_argument("--points", type=non_negative_count, default=35000,
                        help="part 2; 0 skips it")
    parser.add_argument("--dim", type=positive_count, default=64)
    parser.add_argument("--without-rescoring", action="store_true",
                        help="switch off the float64 re-scoring of float32 ties (its cost)")
    args = parser.parse_args()
    if args.points:
        refuse_too_few_points(parser, "--points", args.points // 5 * 5, 9,
                              "leave-one-out Recall@8 over 5 equal classes")
    if args.without_rescoring:
        retrieval.ExactScores = lambda *inputs: None  # RankedSearch then keeps float32's ties
    print(f"{machine_description()}; torch {torch.__version__} ({torch.get_num_threads()} "
          f"threads), faiss {faiss.__version__}")
    rng = np.random.default_rng(0)
    print("| references | k | faiss (s) | rows + topk (s) | rule picks |")
    print("|---|---|---|---|---|")
    for size in args.sizes:
        vectors = rng.standard_normal((size, args.dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        queries = vectors[:4096]
        for k in (k for k in args.ks if k < size):
            ways = {"faiss": functools.partial(faiss.knn, queries, vectors, k,
                                               faiss.METRIC_INNER_PRODUCT),
                    "rows": functools.partial(knn._torch_search_in_blocks, queries, vectors, k,
                                              "cosine")}
            times: dict[str, list[float]] = {name: [] for name in ways}
            for repeat in range(args.repeats):
                for name in (list(ways) if repeat % 2 == 0 else list(ways)[::-1]):
                    times[name].append(timed(ways[name]))
            picked = "rows" if knn.uses_full_rows(k, size) else "faiss"
            print(f"| {size:,} | {k:,} | {min(times['faiss']):.2f} | {min(times['rows']):.2f} "
                  f"| {picked} |", flush=True)
    untimed = [f"k = {k:,} of {size:,}" for size in args.sizes for k in args.ks if k >= size]
    if untimed:  # a search needs k below the reference count
        print(f"\nnot timed (k not below the references): {', '.join(untimed)}")
    if not args.points:
        return
    labels = np.repeat(np.arange(5), args.points // 5)
    spread = np.random.default_rng(1).standard_normal((len(labels), args.dim)).astype(np.float32)
    rule = knn.uses_full_rows
    for name, choose in (("as chosen", rule), ("faiss only", lambda k, n: False)):
        knn.uses_full_rows = choose
        start = time.perf_counter()
        scores = retrieval_metrics(spread, labels, nmi=False)
        print(f"retrieval_metrics, {len(labels):,} points in 5 classes, {name}: "
              f"{time.perf_counter() - start:.1f} s, recall@1 {scores['recall@1']:.6f}, "
              f"map@r {scores['map@r']:.8f}", flush=True)
    knn.uses_full_rows = rule


if __name__ == "__main__":
    main()
