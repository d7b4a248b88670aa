"""Every paper config names its table and target, every grid cell resolves, and each config
trains one step on the fixture of its dataset through ``kdml train --config``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from fixtures_array_sets import make_cifar10, make_idx
from fixtures_photo_sets import make_cars196, make_cub, make_sop

from kdml import cli
from kdml.config import load_config_file, resolve_config
from kdml.models.vision import vision_available
from kdml.training.grid import grid_cells
from kdml.training.recipes import get_recipe

CONFIGS = Path(__file__).parent.parent / "configs"
PAPER_CONFIGS = sorted(path for path in CONFIGS.glob("*.yaml")
                       if "paper" in load_config_file(path))
FIXTURES = {
    "cub": lambda root: make_cub(root, classes=4, per_class=4),
    "cars196": lambda root: make_cars196(root, classes=4, per_class=4),
    "sop": lambda root: make_sop(root, classes=4, per_class=4),
    "mnist": lambda root: make_idx(root, train=60, test=20),
    "fashion-mnist": lambda root: make_idx(root, train=60, test=20, name="fashion-mnist"),
    "cifar10": lambda root: make_cifar10(root, per_batch=12, test=20),
}
VISION, WHY_NOT = vision_available()


def test_the_paper_tables_have_configs():
    names = {path.name for path in PAPER_CONFIGS}
    assert {"jrd-cub.yaml", "jrd-cars.yaml", "jrd-sop.yaml", "mtriplet-cub.yaml",
            "mtriplet-cars.yaml", "mtriplet-d64-cub.yaml", "msimclr-mnist.yaml",
            "msimclr-fashion-mnist.yaml", "msimclr-cifar10.yaml"} <= names


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.name)
def test_paper_config_names_its_table_and_every_cell_resolves(path):
    values = load_config_file(path)
    assert values["paper"]["table"] and values["paper"]["target"]
    recipe = get_recipe(values["recipe"])
    cells = grid_cells(values["grid"]) if "grid" in values else [None]
    for cell in cells:
        config = resolve_config(recipe.name, recipe.params, recipe.defaults, values,
                                settings=cell.values if cell else None)
        assert config.data.dataset in FIXTURES


@pytest.mark.slow
@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=lambda p: p.name)
def test_paper_config_trains_one_step_on_its_fixture(path, tmp_path, capsys):
    values = load_config_file(path)
    root = FIXTURES[values["data"]["dataset"]](tmp_path / "data")
    config = dict(values)
    if "grid" in config:  # the first cell: one run is enough to show the config works
        config["grid"] = {key: cells[:1] for key, cells in config["grid"].items()}
    tiny = {"data": {"resize": 40, "image_size": 32, "batch_size": 8, "num_workers": 0},
            "train": {"epochs": 1, "steps_per_epoch": 1, "device": "cpu"},
            "eval": {"ks": [1], "nmi": False}}
    if str(values["model"]["backbone"]).startswith(("timm:", "torchvision:")) and not VISION:
        # the vision extra is not importable here: the same config with the small CNN
        tiny["model"] = {"backbone": "cnn", "small_input": False}
    for section, settings in tiny.items():
        config[section] = {**config.get(section, {}), **settings}
    if values["data"].get("samples_per_class"):
        config["data"]["batch_size"] = 2 * values["data"]["samples_per_class"]
    file = tmp_path / path.name
    file.write_text(yaml.safe_dump(config))
    out = tmp_path / "run"
    assert cli.main(["train", "--config", str(file), "--data-root", str(root), "--out",
                     str(out), "--no-progress"]) == 0, capsys.readouterr().err
    metrics = sorted(out.rglob("metrics.json"))
    assert len(metrics) == 1
    final = json.loads(metrics[0].read_text())["final"]
    assert 0.0 <= final["recall@1"] <= 1.0


def test_a_grid_continues_where_it_stopped_and_keeps_finished_cells(tmp_path, capsys,
                                                                    monkeypatch):
    from kdml.training import trainer

    # two steps a cell: what is checked is which cells run, fail and are kept, not training
    config = {"recipe": "amsoftmax", "grid": {"model.embedding_size": [4, 8, 16]},
              "data": {"dataset": "digits", "batch_size": 40},
              "train": {"epochs": 1, "steps_per_epoch": 2, "device": "cpu"},
              "eval": {"nmi": False}}
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump(config))
    out = tmp_path / "grid"
    real = trainer.train_one_epoch
    calls = []

    def fails_in_the_second_cell(session, epoch, progress):
        calls.append(session.config.model.embedding_size)
        if session.config.model.embedding_size == 8:
            raise trainer.KdmlError("disk full")
        return real(session, epoch, progress)

    monkeypatch.setattr(trainer, "train_one_epoch", fails_in_the_second_cell)
    args = ["train", "--config", str(file), "--out", str(out), "--no-progress"]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert "grid cell embedding_size=8 failed: disk full" in err and f"kept in {out}" in err
    first = (out / "embedding_size=4" / "metrics.json").read_text()
    monkeypatch.setattr(trainer, "train_one_epoch", real)
    assert cli.main(args) == 0
    assert (out / "embedding_size=4" / "metrics.json").read_text() == first  # kept as it was
    printed = capsys.readouterr().out
    assert "embedding_size=4: finished earlier" in printed
    assert all((out / f"embedding_size={size}" / "metrics.json").is_file()
               for size in (4, 8, 16))
    assert printed.count("embedding_size=") >= 6  # progress lines and the summary table


def test_a_grid_refuses_what_would_mix_settings_across_or_within_its_cells(tmp_path, capsys):
    """A grid's cells had been resumed with a changed command's settings (config.yaml keeping
    the old ones), reused as finished under new ones, or given an override of a grid key that
    the cells then overrode back; a grid mixing data.validation 0 and > 0 had been scored in
    one table; a grid.yaml that is not kdml's gave a traceback."""
    config = {"recipe": "amsoftmax", "grid": {"model.embedding_size": [4, 8]},
              "data": {"dataset": "digits", "batch_size": 40},
              "train": {"epochs": 1, "steps_per_epoch": 2, "device": "cpu"},
              "eval": {"nmi": False}}
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump(config))
    out = tmp_path / "grid"
    args = ["train", "--config", str(file), "--out", str(out), "--no-progress"]
    assert cli.main(args) == 0
    finished = (out / "embedding_size=4" / "metrics.json").read_text()

    def refused(*extra: str) -> str:
        capsys.readouterr()
        assert cli.main([*args, *extra]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kdml: error: ") and err.count("\n") == 1, err
        return err

    assert (f"grid cell embedding_size=4 in {out} was trained with other settings "
            "(method.margin: 0.1 -> 0.3)") in refused("method.margin=0.3")
    assert "the override embedding_size=32 sets model.embedding_size" in refused(
        "embedding_size=32")
    assert "the override model.embedding_size=32 sets" in refused("model.embedding_size=32")
    assert (out / "embedding_size=4" / "metrics.json").read_text() == finished
    file.write_text(yaml.safe_dump({**config, "grid": {"data.validation": [0.0, 0.4]}}))
    assert "the grid's cells have different data.validation (0 to 0.4)" in refused()
    file.write_text(yaml.safe_dump({**config, "grid": {"data.validation": [0.2, 0.4]}}))
    assert "the grid's cells have different data.validation (0.2 to 0.4)" in refused()
    file.write_text(yaml.safe_dump(config))
    other = tmp_path / "other"
    other.mkdir()
    args[4] = str(other)
    # a grid.yaml of the user's (a config file, a list) is no grid's record: it had made the
    # folder "another grid's runs"
    for text in ("- a list, not kdml's record\n", yaml.safe_dump(config)):
        (other / "grid.yaml").write_text(text)
        assert (f"--out {other} is not empty and holds no grid; a grid goes into a new or "
                "empty folder") in refused()


def test_a_validation_grid_says_so_and_names_its_best_cell(tmp_path, capsys):
    # two steps a cell leave the cells' recall@1 apart (about 0.74 and 0.97), so naming the
    # lesser one as best fails
    config = {"recipe": "amsoftmax", "grid": {"model.embedding_size": [2, 8]},
              "data": {"dataset": "digits", "batch_size": 12, "validation": 0.4},
              "train": {"epochs": 1, "steps_per_epoch": 2, "device": "cpu"},
              "eval": {"nmi": False}}
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump(config))
    out = tmp_path / "grid"
    assert cli.main(["train", "--config", str(file), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert ("Validation metrics per cell (data.validation=0.4; the test part was not used)"
            in printed)
    finals = {size: json.loads((out / f"embedding_size={size}" / "metrics.json").read_text())
              ["final"]["recall@1"] for size in (2, 8)}
    assert finals[2] != finals[8]  # a tie would not show which cell is named best
    best = max(finals, key=finals.get)
    assert f"best on validation by recall@1: embedding_size={best};" in printed
