"""benchmarks/probe_fit.py: the authors' probe as their ``CoordLinear`` computes it, and the
script's three probes on a tiny trained MSimCLR run (kdml's agrees with the run's own score)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import probe_fit  # noqa: E402  (a script's module, beside benchmarks/machine.py)


def test_chart_logits_is_coordlinear_with_one_hot_q():
    """Literal: for each sample, the argmax chart's W x + b, as CoordLinear's forward gives it
    with one_hot_q (every chart's map, then the one-hot q picks one), in float64 loops."""
    generator = torch.Generator().manual_seed(0)
    weights = torch.randn(3, 4, 2, generator=generator, dtype=torch.float64)
    biases = torch.randn(3, 4, generator=generator, dtype=torch.float64)
    q = torch.rand(7, 3, generator=generator, dtype=torch.float64)
    x = torch.rand(7, 2, generator=generator, dtype=torch.float64)
    expected = torch.zeros(7, 4, dtype=torch.float64)
    for i in range(7):
        chart = max(range(3), key=lambda c: float(q[i, c]))
        for c in range(3):  # every chart's output, weighted by the one-hot q
            one_hot = 1.0 if c == chart else 0.0
            for k in range(4):
                value = biases[c, k] + sum(weights[c, k, j] * x[i, j] for j in range(2))
                expected[i, k] += one_hot * value
    got = probe_fit.chart_logits(weights, biases, q.argmax(1), x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_the_authors_probe_learns_a_per_chart_rule():
    """Two charts whose classes are split by opposite thresholds: no single linear map fits
    both, one map per chart does (Adam at 1e-3 gets there slowly: 6,000 steps here)."""
    rng = np.random.default_rng(0)
    x = rng.random((400, 1))
    charts = rng.integers(0, 2, 400)
    labels = np.where(charts == 0, x[:, 0] > 0.5, x[:, 0] < 0.5).astype(np.int64)
    predicted = probe_fit.authors_probe(x, charts, labels, x, charts, epochs=1500, seed=0)
    assert (predicted == labels).mean() > 0.95


@pytest.mark.slow
def test_the_script_scores_a_trained_run_with_three_probes(tmp_path, capsys):
    from kdml import cli

    run = tmp_path / "run"
    assert cli.main(["train", "msimclr", "--dataset", "digits", "--out", str(run),
                     "--no-progress", "train.epochs=1", "train.steps_per_epoch=3",
                     "data.batch_size=64", "method.n_charts=4", "eval.nmi=false",
                     "model.backbone=cnn", "model.small_input=false",
                     "method.crop_size=0"]) == 0
    (row,) = probe_fit.main([str(run), "--epochs", "2"])
    final = json.loads((run / "metrics.json").read_text())["final"]
    assert row["kdml (lbfgs, C = 1)"] == pytest.approx(final["linear_accuracy"], abs=1e-12)
    assert set(row) == {"kdml (lbfgs, C = 1)", "unpenalised (lbfgs, C = 1e6)",
                        "authors' (Adam 1e-3, 2 epochs)"}
    assert all(0.0 <= value <= 1.0 for value in row.values())
    assert f"| {run} | " in capsys.readouterr().out
