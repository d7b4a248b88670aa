"""Atlas recipes through the command line, and the chart plot."""

from __future__ import annotations

import json

import pytest

from kdml import cli

TINY = ["train.epochs=1", "model.backbone=mlp", "eval.nmi=false", "--no-progress"]


def train(tmp_path, name: str, *overrides: str) -> dict:
    out = tmp_path / name
    assert cli.main(["train", name, "--dataset", "digits", "--out", str(out), *TINY,
                     *overrides]) == 0
    return json.loads((out / "metrics.json").read_text())


# The SimCLR recipes default to the paper's ResNet-18; the small CPU network runs anywhere.
CPU_SIMCLR = ["model.backbone=cnn", "model.small_input=false"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "overrides", "metric"), [
    ("mtriplet", ["method.n_charts=4"], "recall@1"),
    ("triplet", [], "recall@1"),
    ("msimclr", ["method.n_charts=4", "data.batch_size=64", *CPU_SIMCLR], "linear_accuracy"),
    ("simclr", ["data.batch_size=64", *CPU_SIMCLR], "linear_accuracy"),
])
def test_atlas_recipes_end_to_end(tmp_path, name, overrides, metric):
    final = train(tmp_path, name, *overrides)["final"]
    assert 0.0 <= final[metric] <= 1.0


def test_plot_charts(tmp_path, capsys):
    train(tmp_path, "mtriplet", "method.n_charts=3", "method.dim=2")
    assert cli.main(["plot", "charts", str(tmp_path / "mtriplet"), "--thumbnails", "5"]) == 0
    assert (tmp_path / "mtriplet" / "plots" / "charts.png").stat().st_size > 1000
    assert "charts.png" in capsys.readouterr().out


def test_plot_charts_refuses_runs_without_charts_or_d_not_2(tmp_path, capsys):
    train(tmp_path, "triplet")
    assert cli.main(["plot", "charts", str(tmp_path / "triplet")]) == 2
    assert "has no charts" in capsys.readouterr().err
    train(tmp_path, "mtriplet", "method.n_charts=2", "method.dim=3")
    assert cli.main(["plot", "charts", str(tmp_path / "mtriplet")]) == 2
    err = capsys.readouterr().err
    assert "draws 2-D charts only (d = 2), got d = 3; train with method.dim=2" in err
