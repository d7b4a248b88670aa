"""DTML's neighbour graphs at the paper's full batch: ``nearest_neighbour_graph`` (the k-th
distance by ``topk``, its ties filled by lowest column) against a stable sort of every row
(what it replaced, written out here as the baseline), on the 5,000 x 5,000 squared distances
of configs/dtml-paper.yaml's batch (all 5,000 source digits; here random 64-d points in 10
classes): the intra-class graph (k1 = 5, same-class candidates) and the inter-class one
(k2 = 10, other-class candidates). Each timing is the best of ``--repeats``, the two ways
alternating; the graphs are checked equal first.

    PYTHONPATH=src .venv/bin/python benchmarks/dtml_graphs.py
"""

from __future__ import annotations

import argparse
import time

import torch
from machine import machine_description
from measure import positive_count

from kdml.losses.marginal_fisher import nearest_neighbour_graph


def sorted_rows_graph(sq_dists: torch.Tensor, candidates: torch.Tensor, k: int) -> torch.Tensor:
    """The baseline: each row's first k candidates by a stable sort of the whole row (a
    candidate's NaN as inf, non-candidates NaN, last), as kdml built the graphs before."""
    masked = sq_dists.nan_to_num(nan=float("inf"), posinf=float("inf"))
    masked = masked.masked_fill(~candidates, float("nan"))
    order = masked.sort(dim=1, stable=True).indices[:, :k]
    picked = torch.arange(order.shape[1]) < candidates.sum(1, keepdim=True)
    return torch.zeros_like(sq_dists).scatter(1, order, picked.to(sq_dists.dtype))


def timed(build, *inputs) -> float:
    start = time.perf_counter()
    build(*inputs)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--points", type=positive_count, default=5000)
    parser.add_argument("--repeats", type=positive_count, default=3)
    parser.add_argument("--threads", type=positive_count, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    points = torch.randn(args.points, 64, generator=generator)
    labels = torch.randint(0, 10, (args.points,), generator=generator)
    sq_dists = torch.cdist(points, points).pow(2)
    same = labels[:, None] == labels
    same.fill_diagonal_(False)
    print(f"{machine_description()}; torch {torch.__version__} ({args.threads} thread(s)); "
          f"N = {args.points:,}")
    print("| graph | sorted rows (s) | topk (s) |")
    print("|---|---|---|")
    for name, candidates, k in (("intra, k1 = 5", same, 5),
                                ("inter, k2 = 10", labels[:, None] != labels, 10)):
        assert torch.equal(sorted_rows_graph(sq_dists, candidates, k),
                           nearest_neighbour_graph(sq_dists, candidates, k))
        sort_times, topk_times = [], []
        for _ in range(args.repeats):  # interleaved: the host's speed drifts
            sort_times.append(timed(sorted_rows_graph, sq_dists, candidates, k))
            topk_times.append(timed(nearest_neighbour_graph, sq_dists, candidates, k))
        print(f"| {name} | {min(sort_times):.2f} | {min(topk_times):.2f} |", flush=True)


if __name__ == "__main__":
    main()
