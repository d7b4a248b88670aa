"""A validation grid's choice of its best cell: ties named, NaN never best, and the warning for a
validation part of too few classes to choose on."""

from __future__ import annotations

import math

import pytest
import yaml
from fixtures_grids import grid_file
from fixtures_photo_sets import make_cub

from kdml import cli
from kdml.errors import KdmlError
from kdml.training import trainer
from kdml.training.checks import MIN_VALIDATION_CLASSES
from kdml.training.grid import best_cells, grid_cells
from kdml.training.run_folder import RunFolder

SIZES = [2, 8, 16]


def grid_of(tmp_path, data: dict, sizes: list[int] | None = None, **train: object) -> list[str]:
    """`kdml train` arguments of a grid over model.embedding_size on digits."""
    return grid_file(tmp_path, {"model.embedding_size": sizes or SIZES}, data, **train)


def finished(run_dir, final: dict[str, float]) -> dict[str, float]:
    """A run folder of one epoch scored ``final`` on its validation part, as training leaves
    it; returns ``final``, as ``train`` does."""
    run_dir.mkdir(parents=True, exist_ok=True)
    RunFolder(run_dir).write_metrics([{"epoch": 1, **{f"val/{key}": value for key, value
                                                      in final.items()}}], final, "validation")
    return final


@pytest.fixture
def scored(monkeypatch):
    """Cells that train at once into metrics.json, scoring recall@1 as ``scores`` says by
    embedding size (a later run of the grid reads them back from the JSON as finished)."""
    scores: dict[int, float] = {}

    def train(config, run_dir, resume=False, progress=None, **_):
        return finished(run_dir, {"recall@1": scores[config.model.embedding_size],
                                  "map@r": 0.1})

    monkeypatch.setattr(trainer, "train", train)
    return scores


def best_line(printed: str) -> str:
    lines = [line for line in printed.splitlines() if line.startswith("best on validation")]
    assert len(lines) == 1, printed
    return lines[0]


def test_tied_cells_are_all_named_and_the_tie_broken_by_grid_order(tmp_path, capsys, scored):
    """The first of two equal scores had been named alone, and of 0.3 and 0.1 + 0.2 (equal but
    for float rounding) the later one, as if it were better."""
    scored.update({2: 0.25, 8: 0.3, 16: 0.1 + 0.2})
    args = grid_of(tmp_path, {"validation": 0.4})
    for _ in range(2):  # trained, then read back from each cell's metrics.json
        assert cli.main(args) == 0
        assert best_line(capsys.readouterr().out) == (
            "best on validation by recall@1: embedding_size=8 (tied at 0.3000 with "
            "embedding_size=16: validation does not tell them apart, and the first in grid "
            "order is named); train it without data.validation to test it")
    scored.update({2: 0.5, 8: 0.5, 16: 0.5})
    assert cli.main(grid_of(tmp_path / "all", {"validation": 0.4})) == 0
    assert "embedding_size=2 (tied at 0.5000 with embedding_size=8, embedding_size=16:" in (
        best_line(capsys.readouterr().out))


def test_a_single_best_cell_is_named_as_before(tmp_path, capsys, scored):
    scored.update({2: 0.25, 8: 0.75, 16: 0.7})
    assert cli.main(grid_of(tmp_path, {"validation": 0.4})) == 0
    assert best_line(capsys.readouterr().out) == (
        "best on validation by recall@1: embedding_size=8; train it without data.validation "
        "to test it")


def test_a_cell_without_a_finite_score_is_never_best(tmp_path, capsys, scored):
    """A NaN score in the first cell had been named best: nothing compares above NaN."""
    scored.update({2: math.nan, 8: 0.5, 16: 0.25})
    assert cli.main(grid_of(tmp_path, {"validation": 0.4})) == 0
    assert best_line(capsys.readouterr().out).startswith(
        "best on validation by recall@1: embedding_size=8;")
    scored.update({2: math.nan, 8: math.nan, 16: math.inf})
    assert cli.main(grid_of(tmp_path / "none", {"validation": 0.4})) == 0
    assert best_line(capsys.readouterr().out) == (
        "best on validation by recall@1: none, no cell has a finite score")


def test_the_table_has_every_cell_s_metrics(tmp_path, capsys, monkeypatch):
    """A grid over what is scored (eval.nmi, eval.ks) gives its cells different metrics: the
    table had only the first cell's columns, and named no best cell when the first lacked the
    selection metric."""
    def train(config, run_dir, resume=False, progress=None, **_):
        size = config.model.embedding_size
        return finished(run_dir, {"map@r": 0.1} if size == 2 else
                        {"map@r": 0.2, "recall@1": size / 100})

    monkeypatch.setattr(trainer, "train", train)
    assert cli.main(grid_of(tmp_path, {"validation": 0.4})) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.lstrip().startswith("cell"))
    assert header.split() == ["cell", "map@r", "recall@1"]
    row = [line for line in out.splitlines() if "embedding_size=2" in line][-1]  # the table's
    assert row.split()[1:] == ["0.1000", "-"]  # the first cell has no recall@1
    assert best_line(out).startswith("best on validation by recall@1: embedding_size=16;")


def test_best_cells():
    assert best_cells([0.25, 0.3, 0.1 + 0.2, math.nan]) == [1, 2]
    assert best_cells([0.5, None, 0.4]) == [0]
    assert best_cells([math.nan, None]) == []
    assert best_cells([0.5, 0.5 + 1e-6]) == [1]  # a real difference, if a small one


def test_a_validation_part_of_few_classes_is_warned_about(tmp_path, capsys):
    """A 2-class validation part (digits: 5 training classes, 0.4 of them held out) had chosen
    the best cell, or a single run's best epoch, without a word."""
    assert cli.main(grid_of(tmp_path, {"validation": 0.4}, sizes=[2, 8])) == 0
    captured = capsys.readouterr()
    assert "best on validation by recall@1: embedding_size=" in captured.out
    said = captured.out + captured.err
    assert said.count("the validation part holds 2 classes, too few for what is chosen on "
                      "it") == 2, said  # once per cell
    assert "a larger data.validation (or more training classes) holds out more" in said


def test_no_warning_for_a_validation_part_of_enough_classes(tmp_path, capsys):
    data = {"split": "class-disjoint", "train_classes": 0.8, "validation": 0.6}
    assert cli.main(grid_of(tmp_path, data, sizes=[2])) == 0  # 5 of the 8 training classes
    captured = capsys.readouterr()
    assert "the validation part holds" not in captured.out + captured.err


def test_a_seen_class_validation_part_of_few_classes_asks_for_more_classes(tmp_path, capsys):
    cub = make_cub(tmp_path / "cub", classes=MIN_VALIDATION_CLASSES - 1, per_class=12)
    config = {"recipe": "amsoftmax", "grid": {"model.embedding_size": [2]},
              "data": {"dataset": "cub", "root": str(cub), "split": "seen-holdout",
                       "validation": 0.5, "batch_size": 4},
              "train": {"epochs": 1, "steps_per_epoch": 1, "device": "cpu"},
              "eval": {"nmi": False, "ks": [1]}, "model": {"backbone": "cnn"}}
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump(config))
    assert cli.main(["train", "--config", str(file), "--out", str(tmp_path / "grid"),
                     "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert "the validation part holds 4 classes" in captured.out + captured.err
    assert "a dataset of more classes" in captured.out + captured.err


@pytest.mark.parametrize(("grid", "message"), [
    ({"train.seed": [0, 1, 0]}, "grid.train.seed lists 0 twice"),
    ({"optim.lr": [1, 0.5, 1.0]}, "grid.optim.lr lists 1.0 twice"),  # one learning rate
    ({"eval.ks": [[1, 2], [1.0, 2]]}, r"grid.eval.ks lists \[1.0, 2\] twice"),
    ({"method.kernel": ["gaussian", "gaussian"]}, "grid.method.kernel lists 'gaussian' twice"),
    ({"model.weights": [None, None]}, "grid.model.weights lists None twice"),
])
def test_a_grid_repeating_a_value_is_refused_naming_it(grid, message):
    with pytest.raises(KdmlError, match=message):
        grid_cells(grid)


def test_a_grid_repeating_a_value_trains_nothing(tmp_path, capsys, scored):
    arguments = grid_of(tmp_path, {}, sizes=[8, 8])
    assert cli.main(arguments) == 2
    assert capsys.readouterr().err == ("kdml: error: grid.model.embedding_size lists 8 twice, "
                                       "which would train the same cells twice; drop the "
                                       "repeat\n")
    assert not (tmp_path / "grid").exists()


def test_grid_values_the_same_only_once_resolved_are_refused(tmp_path, capsys):
    """YAML reads 1e-3 as a string, which the config makes the float 0.001: the raw values
    differ and both cells trained; true and 1 are no repeat (1 is refused as no bool)."""
    assert grid_cells({"eval.nmi": [True, 1]})  # not "lists 1 twice"
    file = tmp_path / "grid.yaml"
    file.write_text("recipe: amsoftmax\ngrid:\n  optim.lr: [1e-3, 0.001]\n"
                    "data: {dataset: digits}\n")
    expected = ("kdml: error: the grid's cells lr=1e-3 and lr=0.001 give the same config, which "
                "would train the same run twice; drop one of their values\n")
    for command in (["train", "--config", str(file), "--out", str(tmp_path / "grid")],
                    ["config", "--config", str(file)]):
        assert cli.main(command) == 2
        assert capsys.readouterr().err == expected
    assert not (tmp_path / "grid").exists()


@pytest.mark.parametrize(("grid", "message"), [
    ({"method.kernel": ["a b", "a_b"]},
     "the grid's values grid.method.kernel='a b' and grid.method.kernel='a_b' would share one "
     "run folder, kernel=a_b "),
    ({"data.dataset": ["x/y", "x_y"], "train.seed": [0, 1]},  # named by the values that differ
     "the grid's values grid.data.dataset='x/y' and grid.data.dataset='x_y' would share one "
     "run folder, dataset=x_y-seed=0 "),
    # across keys: a value may spell out the next key's part of the name
    ({"data.a": ["1-b=2", "1"], "data.b": ["3", "2-b=3"]},
     "the grid's values grid.data.a='1-b=2', grid.data.b='3' and grid.data.a='1', "
     "grid.data.b='2-b=3' would share one run folder, a=1-b=2-b=3 "),
])
def test_grid_values_of_one_folder_name_are_refused(grid, message):
    """Values that differ only in characters the folder name replaces had given two cells one
    run folder: the second had continued (or been counted as) the first."""
    with pytest.raises(KdmlError) as raised:
        grid_cells(grid)
    assert str(raised.value).startswith(message)
    assert str(raised.value).endswith(
        "(a cell's folder name keeps letters, digits, '.', '_', '=' and '-', and writes '_' for "
        "any other characters); choose values that differ in those characters")


def test_grid_values_that_differ_only_in_case_are_refused():
    """``Adam`` and ``adam`` name two folders here but one on macOS and Windows, where the
    second cell had continued the first: refused on every machine alike."""
    with pytest.raises(KdmlError) as raised:
        grid_cells({"optim.name": ["Adam", "adam"], "train.seed": [0]})
    assert str(raised.value) == (
        "the grid's values grid.optim.name='Adam' and grid.optim.name='adam' differ only in "
        "case, so their run folders name=Adam-seed=0 and name=adam-seed=0 would be one on "
        "macOS and Windows; choose values that differ in more than case")


def test_grid_values_of_one_folder_name_train_nothing(tmp_path, capsys, scored):
    file = tmp_path / "grid.yaml"
    file.write_text("recipe: amsoftmax\ngrid: {data.dataset: [digits/a, digits_a]}\n")
    for command in (["train", "--config", str(file), "--out", str(tmp_path / "grid")],
                    ["config", "--config", str(file)]):
        assert cli.main(command) == 2
        assert capsys.readouterr().err.startswith(
            "kdml: error: the grid's values grid.data.dataset='digits/a' and "
            "grid.data.dataset='digits_a' would share one run folder, dataset=digits_a ")
    assert not (tmp_path / "grid").exists()


@pytest.mark.parametrize("keys", [("embedding_size", "model.embedding_size"),
                                  ("model.embedding_size", "embedding_size")])
def test_a_grid_naming_one_setting_twice_is_refused(tmp_path, capsys, scored, keys):
    """A leaf name and its dotted key are one setting: the later one's values had won in every
    cell (one cell, or cells refused as "the same config" without the cause)."""
    first, second = keys
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump({"recipe": "amsoftmax", "data": {"dataset": "digits"},
                                    "grid": {first: [2, 4], second: [8]}}, sort_keys=False))
    for command in (["train", "--config", str(file), "--out", str(tmp_path / "grid")],
                    ["config", "--config", str(file)]):
        assert cli.main(command) == 2
        assert capsys.readouterr().err == (
            f"kdml: error: grid.{first} and grid.{second} both set model.embedding_size, so "
            "the later would win in every cell; keep one of them, with every value to try in "
            "its list\n")
    assert not (tmp_path / "grid").exists()


def test_a_select_metric_no_cell_scores_is_said(tmp_path, capsys, scored):
    """A misspelt train.select_metric (no keep_best or patience to check it before training)
    had left the closing best-cell line out without a word."""
    scored.update({2: 0.25, 8: 0.75, 16: 0.7})
    assert cli.main(grid_of(tmp_path, {"validation": 0.4}, select_metric="recal@1")) == 0
    assert best_line(capsys.readouterr().out) == (
        "best on validation by recal@1: none, no cell scores train.select_metric='recal@1' "
        "(they score recall@1, map@r)")


def test_a_misspelt_select_metric_of_a_validation_grid_trains_nothing(tmp_path, capsys):
    """Without keep_best or patience, train.select_metric was checked nowhere before training,
    though a validation grid names its best cell by it."""
    arguments = grid_of(tmp_path, {"validation": 0.4}, sizes=[2], select_metric="recal@1")
    assert cli.main(arguments) == 2
    error = capsys.readouterr().err
    assert error.startswith("kdml: error: grid cell embedding_size=2 failed: "
                            "train.select_metric='recal@1' is not scored by this run; choose "
                            "one of recall@1, "), error
    assert not (tmp_path / "grid" / "embedding_size=2").exists()
    # not "the 0 cells before it are kept ... a changed setting needs another --out"
    assert error.rstrip().endswith("-- nothing was trained; the same command, corrected, goes "
                                   f"on in {tmp_path / 'grid'}"), error
    # a single run does not choose by it: not refused (its default, recall@1, unscored here)
    assert cli.main(["train", "amsoftmax", "--dataset", "digits", "--out",
                     str(tmp_path / "single"), "--no-progress", "data.validation=0.4",
                     "eval.ks=[2]", "train.epochs=1", "train.steps_per_epoch=1",
                     "train.device=cpu", "eval.nmi=false", "data.batch_size=12"]) == 0


def test_the_grid_marker_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A write cut short had left a grid.yaml that the next run took for another grid's."""
    from pathlib import Path

    from kdml.training.grid import MARKER, grid_cells, write_marker

    grid = {"method.alpha": [0.5, 1.0]}
    cells = grid_cells(grid)
    real = Path.write_text

    def cut_short(path, text, *args, **kwargs):
        real(path, text[:5], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", cut_short)
    with pytest.raises(KeyboardInterrupt):
        write_marker(tmp_path / "grid", cells, grid)
    assert list((tmp_path / "grid").iterdir()) == []
    monkeypatch.setattr(Path, "write_text", real)
    write_marker(tmp_path / "grid", cells, grid)
    assert [path.name for path in (tmp_path / "grid").iterdir()] == [MARKER]


@pytest.mark.parametrize(("override", "grid_key"), [("epochs=5", "train.epochs"),
                                                    ("train.epochs=5", "epochs")])
def test_an_override_of_a_grid_key_is_refused_dotted_or_as_a_leaf(tmp_path, capsys, override,
                                                                  grid_key):
    """epochs=5 beside a grid over train.epochs (or the reverse) would be ignored, the cells'
    values winning; matching only the same spelling had passed every test."""
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump({"recipe": "amsoftmax", "data": {"dataset": "digits"},
                                    "grid": {grid_key: [1, 2]}}))
    assert cli.main(["config", "--config", str(file), override]) == 2
    assert capsys.readouterr().err.startswith(
        f"kdml: error: the override {override} sets {grid_key}, over which the config's grid "
        "runs")


def test_a_grid_where_only_some_cells_keep_their_best_compares_last_epochs(tmp_path, capsys,
                                                                         monkeypatch):
    """In a grid over train.keep_best, the keep_best=false cell keeps its last epoch: the table
    compares every cell's last epoch (reporting its best, as when all keep theirs, had passed
    every test)."""
    def train(config, run_dir, resume=False, progress=None, **_):
        run_dir.mkdir(parents=True, exist_ok=True)
        final = {"recall@1": 0.8, "map@r": 0.1}
        RunFolder(run_dir).write_metrics([
            {"epoch": 1, "val/recall@1": 0.9, "val/map@r": 0.2},
            {"epoch": 2, **{f"val/{key}": value for key, value in final.items()}}],
            final, "validation")
        return final

    monkeypatch.setattr(trainer, "train", train)
    file = tmp_path / "grid.yaml"
    file.write_text(yaml.safe_dump({
        "recipe": "amsoftmax", "grid": {"train.keep_best": [True, False]},
        "data": {"dataset": "digits", "batch_size": 12, "validation": 0.4},
        "train": {"epochs": 2, "steps_per_epoch": 1, "device": "cpu"}, "eval": {"nmi": False}}))
    assert cli.main(["train", "--config", str(file), "--out", str(tmp_path / "grid"),
                     "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "(train.keep_best)" not in out
    rows = [line.split() for line in out.splitlines() if line.lstrip().startswith("keep_best=")]
    assert [row[:2] for row in rows] == [["keep_best=True", "0.8000"],
                                         ["keep_best=False", "0.8000"]]


def test_a_cell_s_folder_name_writes_one_underscore_for_each_run_of_other_characters():
    cells = grid_cells({"data.dataset": ["my  photos/2024", "x"]})
    assert [cell.name for cell in cells] == ["dataset=my_photos_2024", "dataset=x"]


@pytest.mark.parametrize(("grid", "message"), [
    ({}, "grid must map config keys to lists of values"),
    ({"method.dim": [2], "train.seed": []},
     r"grid\.train\.seed must be a non-empty list of values, got \[\]$"),
])
def test_an_empty_grid_or_list_of_values_is_refused(grid, message):
    """No cell (an empty list) or one cell of no settings (an empty grid) is no grid."""
    with pytest.raises(KdmlError, match=message):
        grid_cells(grid)


@pytest.mark.parametrize("edit", [
    lambda text: text + "notes: my own\n",  # a field kdml does not write
    lambda text: text.replace("- seed=0\n- seed=1\n", "- 0\n- 1\n"),  # cells not names
])
def test_a_grid_yaml_kdml_did_not_write_is_not_a_grid_s(tmp_path, edit):
    """grid.yaml is kdml's with exactly its grid and its cells' names: a user's file of the name
    makes its folder no grid's (refused as a non-empty folder, never continued)."""
    from kdml.training.grid import MARKER, check_grid_folder, recorded_cells, write_marker

    grid = {"train.seed": [0, 1]}
    cells = grid_cells(grid)
    write_marker(tmp_path, cells, grid)
    assert recorded_cells(tmp_path) == ["seed=0", "seed=1"]
    assert check_grid_folder(tmp_path, cells) is True
    marker = tmp_path / MARKER
    edited = edit(marker.read_text())
    assert edited != marker.read_text()
    marker.write_text(edited)
    assert recorded_cells(tmp_path) is None
    with pytest.raises(KdmlError, match="is not empty and holds no grid"):
        check_grid_folder(tmp_path, cells)


def test_a_grid_folder_continues_only_the_same_cells_in_the_same_order(tmp_path):
    """The grid's order is its table's and breaks its ties (best_cells): the same values in
    another order are another grid."""
    from kdml.training.grid import check_grid_folder, write_marker

    grid = {"train.seed": [0, 1]}
    write_marker(tmp_path, grid_cells(grid), grid)
    with pytest.raises(KdmlError, match="holds another grid's runs; choose another --out"):
        check_grid_folder(tmp_path, grid_cells({"train.seed": [1, 0]}))


def test_a_grid_out_that_is_a_file_is_refused(tmp_path):
    from kdml.training.grid import check_grid_folder

    (tmp_path / "out").write_text("mine")
    with pytest.raises(KdmlError) as refused:  # "is not empty and holds no grid" misled
        check_grid_folder(tmp_path / "out", grid_cells({"train.seed": [0]}))
    assert str(refused.value) == (f"--out {tmp_path / 'out'} is a file; a grid goes into a new "
                                  "or empty folder: choose another --out")
    assert (tmp_path / "out").read_text() == "mine"


def test_a_grid_over_the_recipe_is_refused_saying_why(tmp_path, capsys):
    """grid: {recipe: [jrd, mrd]} had been refused as "unknown config key 'recipe' ...; did
    you mean 'resize'?"."""
    arguments = grid_file(tmp_path, {"recipe": ["amsoftmax", "jrd"]})
    assert cli.main(arguments) == 2
    assert capsys.readouterr().err == (
        "kdml: error: a grid cannot vary the recipe: its cells share one recipe's settings and "
        "one table; run one grid per recipe\n")


def test_a_score_that_is_true_or_false_is_no_score():
    """A bool is an int in Python: true had been a score of 1, the best of every cell."""
    assert best_cells([True, 0.5, False]) == [1]
    assert best_cells([True]) == []


def test_changed_setting_names_the_first_setting_by_key_and_eval_ks_when_it_was_set():
    from kdml.training.grid import changed_setting

    saved = {"eval": {"ks": [1, 2]}, "method": {"dim": 2}, "train": {"epochs": 2}}
    assert changed_setting(saved, {**saved, "eval": {"ks": []}}) is None  # the dataset's own
    assert (changed_setting(saved, {**saved, "eval": {"ks": [4]}})
            == "eval.ks: [1, 2] -> [4]")
    assert (changed_setting(saved, {**saved, "method": {"dim": 4}, "train": {"epochs": 3}})
            == "method.dim: 2 -> 4")
    # a setting on one side alone is a change too, either way round
    assert changed_setting(saved, {**saved, "method": {}}) == "method.dim: 2 -> None"
    assert (changed_setting({**saved, "method": {}}, saved) == "method.dim: None -> 2")


def test_a_grid_of_values_in_capitals_continues_in_its_own_folder(tmp_path):
    from kdml.training.grid import check_grid_folder, recorded_cells, write_marker

    grid = {"optim.name": ["Adam", "SGD"]}
    cells = grid_cells(grid)
    write_marker(tmp_path, cells, grid)
    assert recorded_cells(tmp_path) == ["name=Adam", "name=SGD"]
    assert check_grid_folder(tmp_path, cells) is True


def test_the_command_line_s_settings_reach_every_cell(tmp_path, monkeypatch):
    """``--seed`` and ``key=value`` after a grid's config file set each cell's config, as
    they set a single run's."""
    seen = []

    def train(config, run_dir, resume=False, progress=None, **_):
        seen.append((config.train.seed, config.optim.lr))
        return finished(run_dir, {"recall@1": 0.5})

    monkeypatch.setattr(trainer, "train", train)
    assert cli.main([*grid_of(tmp_path, {"validation": 0.4}, [2, 8]), "--seed", "7",
                     "optim.lr=0.125"]) == 0
    assert seen == [(7, 0.125), (7, 0.125)]
