"""Does the linear probe's fitting explain MSimCLR's gap to the authors' numbers? (issue 12)

kdml's piecewise-linear probe (Korman, Sec. 3.1, Table 2) and the authors' one
(``CoordLinear`` in github.com/ekorman/neurve, ``neurve/core/models.py``; trained by
``experiments/simclr.py``) are the same model, one affine classifier per chart on the sigmoid
coordinates of each sample's argmax chart, fitted differently:

- kdml: scikit-learn's ``LogisticRegression(C=1)`` (lbfgs, L2 penalty) per chart, fitted in
  centred, rescaled coordinates to the penalised optimum (``charts._fit_and_predict``);
- ``unpenalised``: the same with ``C=1e6``, the penalty all but gone;
- ``authors``: the authors' recipe, written here from their code: all charts' classifiers in
  one module, Adam with lr 1e-3 and no weight decay, batch 128, shuffled, for as many epochs as
  pre-training had (``--epochs``, their script's 100), initialised as ``CoordLinear`` is
  (uniform in +-1/sqrt(fan-in), fan-in = classes * d for its 3-d weight).

Each run's training and test parts are embedded by the run's last checkpoint; every probe fits
the training codes and scores the test codes. SimCLR runs (no charts) get one chart and no
sigmoid, as kdml's probe and the authors' ``nn.Linear`` baseline take them.

    PYTHONPATH=src .venv/bin/python benchmarks/probe_fit.py RUN [RUN ...]

Prints one Markdown row per run and a mean row.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import numpy as np
import torch
from machine import machine_description
from measure import one_line_kdml_errors, positive_count
from torch.nn import functional

from kdml.evaluation.charts import piecewise_linear_accuracy
from kdml.inspection.parts import embed_part, run_part
from kdml.training.loading import load_run


def chart_logits(weights: torch.Tensor, biases: torch.Tensor, charts: torch.Tensor,
                 features: torch.Tensor) -> torch.Tensor:
    """The authors' ``CoordLinear`` with one-hot q: each sample through its chart's affine map.

    Shapes: ``weights`` (n, C, d), ``biases`` (n, C), ``charts`` (N,), ``features`` (N, d)
    (already through the sigmoid); returns (N, C)."""
    return torch.einsum("ncd,nd->nc", weights[charts], features) + biases[charts]


def authors_probe(train_features: np.ndarray, train_charts: np.ndarray,
                  train_labels: np.ndarray, test_features: np.ndarray,
                  test_charts: np.ndarray, epochs: int, seed: int) -> np.ndarray:
    """Fit :func:`chart_logits` as the authors' script does; returns the test predictions."""
    generator = torch.Generator().manual_seed(seed)
    n_charts = int(max(train_charts.max(), test_charts.max())) + 1
    classes, dim = int(train_labels.max()) + 1, train_features.shape[1]
    bound = 1.0 / np.sqrt(classes * dim)
    weights = ((torch.rand(n_charts, classes, dim, generator=generator) * 2 - 1) * bound)
    biases = ((torch.rand(n_charts, classes, generator=generator) * 2 - 1) * bound)
    weights.requires_grad_()
    biases.requires_grad_()
    optimizer = torch.optim.Adam([weights, biases], lr=1e-3)
    x = torch.as_tensor(train_features, dtype=torch.float32)
    charts = torch.as_tensor(train_charts, dtype=torch.long)
    labels = torch.as_tensor(train_labels, dtype=torch.long)
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=generator).split(128):
            loss = functional.cross_entropy(
                chart_logits(weights, biases, charts[batch], x[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        return chart_logits(weights, biases, torch.as_tensor(test_charts, dtype=torch.long),
                            torch.as_tensor(test_features, dtype=torch.float32)
                            ).argmax(1).numpy()


def probe_accuracies(run_dir: Path, epochs: int, seed: int) -> dict[str, float]:
    """The three probes' test accuracies on ``run_dir``'s codes (see the module docstring)."""
    trained = load_run(run_dir)
    parts = {split: embed_part(trained, run_part(trained, split)) for split in ("train", "test")}
    if "chart_coords" in parts["train"]:
        codes = {split: (arrays["chart_coords"], arrays["chart_index"])
                 for split, arrays in parts.items()}
        sigmoid = True
    else:
        codes = {split: (arrays["embeddings"], np.zeros(len(arrays["labels"]), dtype=np.int64))
                 for split, arrays in parts.items()}
        sigmoid = False
    # the probes fit labels 0..C-1: the dataset's labels, ranked among the training part's
    classes = np.unique(parts["train"]["labels"])
    labels = {split: np.searchsorted(classes, arrays["labels"]) for split, arrays in parts.items()}
    if not np.isin(parts["test"]["labels"], classes).all():
        raise SystemExit(f"{run_dir}: its test part has classes its training part lacks; the "
                         "probe needs a split of seen classes (data.split=seen-holdout)")
    (train_x, train_c), (test_x, test_c) = codes["train"], codes["test"]
    args = (train_x, train_c, labels["train"], test_x, test_c, labels["test"])
    found = {"kdml (lbfgs, C = 1)": piecewise_linear_accuracy(*args, sigmoid=sigmoid),
             "unpenalised (lbfgs, C = 1e6)": piecewise_linear_accuracy(
                 *args, sigmoid=sigmoid, C=1e6, max_iter=10000)}
    accuracies = {name: float(result["accuracy"]) for name, result in found.items()}
    features = {split: 1.0 / (1.0 + np.exp(-x.astype(np.float64))) if sigmoid else x
                for split, x in (("train", train_x), ("test", test_x))}
    predicted = authors_probe(features["train"], train_c, labels["train"], features["test"],
                              test_c, epochs, seed)
    accuracies[f"authors' (Adam 1e-3, {epochs} epochs)"] = float(
        (predicted == labels["test"]).mean())
    return accuracies


@one_line_kdml_errors
def main(argv: list[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--epochs", type=positive_count, default=100,
                        help="the authors' probe's epochs (their script: pre-training's, 100)")
    parser.add_argument("--seed", type=int, default=0, help="the authors' probe's generator")
    args = parser.parse_args(argv)
    print(f"{machine_description()}; torch {torch.__version__}")
    rows = [probe_accuracies(run, args.epochs, args.seed) for run in args.runs]
    names = list(rows[0])
    print("| run | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for run, row in zip(args.runs, rows, strict=True):
        print(f"| {run} | " + " | ".join(f"{row[name]:.3f}" for name in names) + " |")
    if len(rows) > 1:
        print("| mean | " + " | ".join(f"{statistics.fmean(row[name] for row in rows):.3f}"
                                      for name in names) + " |")
    return rows


if __name__ == "__main__":
    main()
