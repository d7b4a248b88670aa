"""Atlas recipes through the command line, and the chart plot."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kdml import cli
from kdml.data.transforms import to_unit_float
from kdml.inspection import plots
from kdml.training.loading import load_run

TINY = ["train.epochs=1", "model.backbone=mlp", "eval.nmi=false", "--no-progress"]


@pytest.fixture(scope="module")
def trained_once(tmp_path_factory) -> Callable[..., Path]:
    """The run folder of ``name`` trained with ``overrides``, trained at its first call only:
    the tests that train the same run (the triplet run, the 3-chart run at d = 2) share it."""
    root = tmp_path_factory.mktemp("runs")
    runs: dict[tuple[str, ...], Path] = {}

    def run(name: str, *overrides: str) -> Path:
        key = (name, *overrides)
        if key not in runs:
            out = root / f"{name}-{len(runs)}"
            assert cli.main(["train", name, "--dataset", "digits", "--out", str(out), *TINY,
                             *overrides]) == 0
            runs[key] = out
        return runs[key]

    return run


@pytest.fixture
def train(trained_once, tmp_path) -> Callable[..., dict]:
    """The metrics.json of ``name`` trained with ``overrides``, whose run folder is copied to
    ``tmp_path / name`` for the test to read and write into (:func:`trained_once` keeps the
    run it copies)."""

    def run(name: str, *overrides: str) -> dict:
        out = shutil.copytree(trained_once(name, *overrides), tmp_path / name)
        return json.loads((out / "metrics.json").read_text())

    return run


# The SimCLR recipes default to the paper's ResNet-18; the small CPU network runs anywhere, and
# a few steps reach every part of the run.
CPU_SIMCLR = ["model.backbone=cnn", "model.small_input=false", "train.steps_per_epoch=2"]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "overrides", "metric"), [
    # the run test_plot_charts draws (trained once for both)
    ("mtriplet", ["method.n_charts=3", "method.dim=2"], "recall@1"),
    ("triplet", [], "recall@1"),
    ("msimclr", ["method.n_charts=4", "data.batch_size=64", *CPU_SIMCLR], "linear_accuracy"),
    ("simclr", ["data.batch_size=64", *CPU_SIMCLR], "linear_accuracy"),
])
def test_atlas_recipes_end_to_end(train, name, overrides, metric):
    final = train(name, *overrides)["final"]
    assert 0.0 <= final[metric] <= 1.0


def test_plot_charts(train, tmp_path, capsys, monkeypatch):
    train("mtriplet", "method.n_charts=3", "method.dim=2")
    drawn: dict = {}
    real = plots.plot_charts

    def recording(coords, index, labels, path, **options):
        drawn.update(coords=coords, index=index, labels=labels, **options)
        return real(coords, index, labels, path, **options)

    monkeypatch.setattr(plots, "plot_charts", recording)
    # on the CPU both times, also where the run trained on a GPU: compared to 1e-5
    assert cli.main(["plot", "charts", str(tmp_path / "mtriplet"), "--thumbnails", "5",
                     "--device", "cpu"]) == 0
    assert (tmp_path / "mtriplet" / "plots" / "charts.png").stat().st_size > 1000
    assert "charts.png" in capsys.readouterr().out
    # what is drawn is every test digit's compressed code (Eq. 3), recomputed here from the
    # model, with its own label and image
    trained = load_run(tmp_path / "mtriplet", device="cpu")
    test = trained.splits.test
    raw = torch.stack([test.load(i) for i in range(len(test))])
    trained.method.eval()
    with torch.no_grad():
        coords, index = trained.method.chart_codes(trained.embedder.transform(raw))
    assert torch.allclose(torch.as_tensor(drawn["coords"]), coords, atol=1e-5)
    assert torch.equal(torch.as_tensor(drawn["index"]), index)
    assert torch.equal(torch.as_tensor(drawn["labels"]), test.labels)
    assert len(index.unique()) > 1  # several charts are drawn, so a swap of them would show
    assert drawn["max_thumbnails"] == 5
    assert torch.equal(drawn["images"](len(test) - 1), to_unit_float(raw[-1]))


def test_plot_charts_refuses_runs_without_charts_or_d_not_2(train, tmp_path, capsys,
                                                            monkeypatch):
    train("triplet")  # end to end's triplet run
    assert cli.main(["plot", "charts", str(tmp_path / "triplet")]) == 2
    assert "has no charts" in capsys.readouterr().err
    train("mtriplet", "method.n_charts=2", "method.dim=3")

    def no_embedding(*args, **kwargs):  # refused before minutes of embedding
        raise AssertionError("embedded before refusing d = 3")

    monkeypatch.setattr(plots, "chart_codes_of", no_embedding)
    assert cli.main(["plot", "charts", str(tmp_path / "mtriplet")]) == 2
    err = capsys.readouterr().err
    assert err == ("kdml: error: kdml plot charts draws 2-D charts only (d = 2), but this "
                   "run's charts are 3-D (method.dim=3); train with method.dim=2 to draw them\n")


def test_plot_charts_refuses_from_the_config_before_loading_the_run(train, tmp_path, capsys,
                                                                    monkeypatch):
    # a run without charts (or of d != 2) is refused from its config.yaml: it had loaded the
    # run's data and model first (4.6 s on digits->mnist5k), and of a validated run printed
    # its note on the validation part before the refusal
    train("triplet")  # end to end's triplet run
    train("mtriplet", "method.n_charts=2", "method.dim=3")

    def no_loading(*args, **kwargs):
        raise AssertionError("loaded the run before refusing it")

    monkeypatch.setattr("kdml.training.loading.load_run", no_loading)
    assert cli.main(["plot", "charts", str(tmp_path / "triplet")]) == 2
    assert capsys.readouterr().err == ("kdml: error: 'triplet' has no charts; plot charts "
                                       "needs an Atlas recipe (mtriplet, msimclr)\n")
    assert cli.main(["plot", "charts", str(tmp_path / "mtriplet")]) == 2
    assert "draws 2-D charts only" in capsys.readouterr().err


def test_plot_charts_refuses_a_picture_in_the_way_before_embedding(train, tmp_path, capsys,
                                                                   monkeypatch):
    from PIL import Image

    # test_plot_charts's run: any run with 2-D charts is refused alike
    train("mtriplet", "method.n_charts=3", "method.dim=2")
    mine = tmp_path / "mtriplet" / "plots" / "charts.png"
    Image.new("RGB", (4, 4)).save(mine)

    def no_embedding(*args, **kwargs):
        raise AssertionError("embedded before refusing the picture in the way")

    monkeypatch.setattr(plots, "chart_codes_of", no_embedding)
    capsys.readouterr()
    assert cli.main(["plot", "charts", str(tmp_path / "mtriplet")]) == 2
    assert f"{mine} is in the way and kdml did not draw it" in capsys.readouterr().err


def test_plot_charts_of_a_validated_run_draws_its_test_part_with_test(train, tmp_path, capsys,
                                                                      monkeypatch):
    """As embed, index and the other plots: a validated run's "test" is its validation part,
    said on stderr, and --test draws the test classes."""
    train("mtriplet", "method.n_charts=3", "method.dim=2", "data.validation=0.4",
          "data.batch_size=12")  # 3 classes of 4 once 2 of the 5 training classes validate
    drawn: list[set[int]] = []
    paths: list[str] = []
    monkeypatch.setattr(plots, "plot_charts",
                        lambda coords, index, labels, path, **options:
                        drawn.append(set(labels.tolist())) or paths.append(path.name) or path)
    for test in ([], ["--test"]):
        capsys.readouterr()
        assert cli.main(["plot", "charts", str(tmp_path / "mtriplet"), "--thumbnails", "0",
                         *test]) == 0
        assert ("validation part" in capsys.readouterr().err) == (not test)
    assert drawn == [{3, 4}, {5, 6, 7, 8, 9}]
    # the two parts' plots apart: --test had silently replaced the validation part's
    assert paths == ["charts.png", "charts-test.png"]


def test_plot_charts_help_says_thumbnails_are_counted_per_chart(capsys):
    """--thumbnails said "images drawn as thumbnails (default 100)", a total, while
    chart_figure draws up to that many in each chart's panel: 16 charts, up to 1,600."""
    assert cli.main(["plot", "charts", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "images drawn as thumbnails in each chart's panel, at most" in help_text
