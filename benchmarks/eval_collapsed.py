"""The cost of scoring a collapsed embedding exactly: every test embedding identical, so every
neighbour of every query is tied and Recall@K, MAP@R and R-Precision are expectations over
the whole test set (``kdml.evaluation.ties``). Timed beside a spread-out embedding of the same
shape and a nearly collapsed one (one point moved by a few float32 rounding units in each
coordinate: every float32 score tied, yet every float64 key distinct, so each query's whole
row is re-scored in float64, ``kdml.evaluation.rescoring``), and a concentrated one (spread by
3% about one point: nearly every float32 score is tied to the next in short chains, which
re-scoring splits, as in JRD's JIntra at alpha = 1 on Fashion-MNIST), with the searches
``RankedSearch`` repeats (rows, width) counted.

The default shape is a class-disjoint test split of Fashion-MNIST scaled down: ``--points``
embeddings of size 64 in 5 equal classes (the real split has 35,000; the cost grows as its
square).

    PYTHONPATH=src .venv/bin/python benchmarks/eval_collapsed.py --points 10000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from machine import machine_description
from measure import positive_count, refuse_too_few_points

import kdml.evaluation.retrieval as retrieval
from kdml.evaluation import retrieval_metrics

# --cases name -> (printed name, the embedding made from a standard normal one)
CASES = {
    "collapsed": lambda spread: ("collapsed", np.ones_like(spread)),
    "spread": lambda spread: ("spread", spread),
    # a few units of float32's rounding at 1 (2^-23 = 1.2e-7) in each coordinate
    "nearly": lambda spread: ("nearly collapsed", 1 + 5e-7 * spread),
    "concentrated": lambda spread: ("concentrated", 1 + 0.03 * spread),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=positive_count, default=10000)
    parser.add_argument("--classes", type=positive_count, default=5)
    parser.add_argument("--dim", type=positive_count, default=64)
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES),
                        help="the embeddings timed")
    parser.add_argument("--without-rescoring", action="store_true",
                        help="switch off the float64 re-scoring of float32 ties (its cost)")
    args = parser.parse_args()
    if args.without_rescoring:
        retrieval.ExactScores = lambda *inputs: None  # RankedSearch then keeps float32's ties
    labels = np.repeat(np.arange(args.classes), args.points // args.classes)
    refuse_too_few_points(parser, "--points", len(labels), 9,
                          f"leave-one-out Recall@8 over {args.classes} equal classes")
    spread = np.random.default_rng(0).standard_normal((len(labels), args.dim))
    searches: list[tuple[int, int]] = []
    search_rows = retrieval.search_rows

    def counted(queries, rows, reference, k, *rest):
        searches.append((len(rows), k))
        return search_rows(queries, rows, reference, k, *rest)

    retrieval.search_rows = counted  # counts the repeated searches, same results
    print(f"{machine_description()}; torch {torch.__version__}")
    for case in args.cases:
        name, embeddings = CASES[case](spread)
        searches.clear()
        start = time.perf_counter()
        scores = retrieval_metrics(embeddings.astype(np.float32), labels, nmi=False)
        wall = time.perf_counter() - start
        widths = sorted({width for _, width in searches})
        print(f"{name}: {len(labels):,} queries in {wall:.1f} s, recall@1 "
              f"{scores['recall@1']:.4f}, map@r {scores['map@r']:.5f}; "
              f"{sum(rows for rows, _ in searches):,} rows searched again at widths {widths}")


if __name__ == "__main__":
    main()
